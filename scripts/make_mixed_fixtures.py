"""Mixed files as llama-quantize writes them, with llama.cpp's answers on them (tests/fixtures/mixed/). NOT part of CI.

Needs the llama.cpp that llama-cpp-python 0.3.36 vendors, built (llama-quantize and the shared libraries), and a
Python with llama-cpp-python (the reference venv):

    LLAMA_CPP_LIB_PATH=/root/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \\
        /root/refvenv/bin/python scripts/make_mixed_fixtures.py [mixed] [sameshape]

mixed: one small llama-shaped F32 file (`write_base`: 4 layers, n_embd 256 and n_ff 256 so every matrix row is whole
256-value blocks and every K-quant and i-quant applies, 4 query heads over 2 KV heads, an untied head, a placeholder
vocabulary of 512 tokens, weights N(0, 1/fan-in) and norms 1 + 0.1 N from one seed), quantized by llama-quantize with
each of PRESETS, which picks every tensor's type itself (src/llama-quant.cpp). The i-quant presets get an importance
matrix of ones (`write_ones_imatrix`, llama.cpp's legacy imatrix format): IQ2_M's IQ2_S tensors cannot be written
without one, and every published i-quant file was made with one. Each output is committed as
tests/fixtures/mixed/mixed-<preset>.gguf (0.4 to 1.6 MB); beside it mixed-<preset>.json holds:
  types       every tensor's type, as the written file says
  prompts     PROMPTS (token ids: the vocabulary is a placeholder), and for each
  positions   the logits over the whole vocabulary at POSITIONS
  greedy      GREEDY_N greedy ids after the prompt, with llama.cpp's top-2 logit gap at each step
  meta        the file's sha256, the llama-quantize command, the llama.cpp arguments
llama.cpp runs each file as an F32 copy (every tensor dequantized by gguf.quants, which is llama.cpp's own
dequantization bit for bit: tests/unit/test_quant_blocks.py) with an F32 KV cache and flash attention off: this
machine's llama.cpp build crashes in its quantized CPU path (SIGILL in scripts/make_arch_fixtures.py; a segmentation
fault evaluating mixed-q4_k_m.gguf itself, 2026-12-02), and on the F32 copy llama.cpp rounds nothing of its own (no 8-bit activations), so it computes what the lab computes from the
quantized blocks.

sameshape: tests/fixtures/mixed/sameshape-q4_k_m.json, the type llama-quantize --dry-run gives every tensor of each
lab.host.synthetic.releases spec whose types are "Q4_K_M" (the real sizes and the small variants), run on header-only F32
copies of those files (sparse: the data is never read by a dry run). tests/engine/test_sameshape_models.py holds
lab.host.synthetic.q4_k_m_types to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.host.synthetic import releases as synthetic  # noqa: E402

BIN = Path(os.environ.get("LLAMA_CPP_LIB_PATH", "/root/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"))
OUT = ROOT / "tests" / "fixtures" / "mixed"
PRESETS = ("IQ2_M", "IQ3_M", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K")
IMATRIX_PRESETS = ("IQ2_M", "IQ3_M")
N_VOCAB = 512
PROMPTS = ([1, 17, 254, 33, 480, 12, 99, 300, 7, 61, 402, 150], [1, 5, 5, 311, 207, 88, 45, 500, 3, 270])
POSITIONS = (1, 4, 7)
GREEDY_N = 32
N_CTX = 64
SEED = 2027


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def write_base(path: Path) -> None:
    """The F32 file every preset starts from (see the module docstring)."""
    import gguf
    rng = np.random.default_rng(SEED)
    n_layer, e, n_head, n_kv, hd, ff = 4, 256, 4, 2, 64, 256
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("synthetic mixed base")
    w.add_uint32("general.file_type", 0)
    w.add_block_count(n_layer)
    w.add_embedding_length(e)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_context_length(4096)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    synthetic.add_vocab(w, N_VOCAB)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", (0.25 * rng.standard_normal((N_VOCAB, e))).astype(np.float32))
    # logits of std ~8: a random model's top-2 gaps are then mostly well above the tests' near-tie bound
    w.add_tensor("output.weight", 8 * mat(N_VOCAB, e))
    w.add_tensor("output_norm.weight", norm(e))
    for il in range(n_layer):
        b = f"blk.{il}."
        for name, rows, cols in (("attn_q", n_head * hd, e), ("attn_k", n_kv * hd, e), ("attn_v", n_kv * hd, e),
                                 ("attn_output", e, n_head * hd), ("ffn_gate", ff, e), ("ffn_up", ff, e),
                                 ("ffn_down", e, ff)):
            w.add_tensor(b + name + ".weight", mat(rows, cols))
        w.add_tensor(b + "attn_norm.weight", norm(e))
        w.add_tensor(b + "ffn_norm.weight", norm(e))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_ones_imatrix(base: Path, path: Path) -> None:
    """llama.cpp's legacy imatrix (common/imatrix-loader.cpp): entry count, then per matrix its name, ncall = 1 and
    ne0 importances of 1.0 (every input column as important as any other)."""
    from gguf import GGUFReader
    entries = [(t.name, int(t.shape[0])) for t in GGUFReader(str(base)).tensors
               if t.name.startswith("blk.") and len(t.shape) == 2]
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, ne0 in entries:
            f.write(struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 1, ne0))
            f.write(np.ones(ne0, np.float32).tobytes())


_LOG_LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[.*?\], type =\s+(\w+),(.*)$")


def quantize(src: Path, dst: Path | None, preset: str, imatrix: Path | None = None) -> tuple[dict, list[str]]:
    """Run llama-quantize (dst None: --dry-run); returns ({tensor: type}, read from its log: a dry run's lines are
    whole), and the command."""
    # run beside the inputs and name them relatively: llama-quantize records the imatrix's path in the file
    # (quantize.imatrix.file), and a temporary directory's name would change the bytes on every run
    cmd = [str(BIN / "llama-quantize")] + (["--imatrix", imatrix.name] if imatrix else []) + \
          (["--dry-run"] if dst is None else []) + [src.name] + ([str(dst)] if dst else []) + [preset, "2"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=src.parent,
                         env={**os.environ, "LD_LIBRARY_PATH": str(BIN)})
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    types = {}
    for line in (res.stdout + res.stderr).splitlines():
        m = _LOG_LINE.match(line.strip())
        if m:
            name, src_type, rest = m.groups()
            # a dry run ends its line "-> x MiB (q4_K)", a real one says "converting to q4_K"; else kept as it was
            conv = re.search(r"converting to (\w+)|-> +[\d.]+ MiB \((\w+)\)", rest)
            types[name] = (next(g for g in conv.groups() if g) if conv else src_type).upper()
    return types, ["llama-quantize"] + cmd[1:]


def llama_cpp_answers(path: Path) -> dict:
    import llama_cpp
    copy = Path(tempfile.gettempdir()) / f"llm-lab-{path.stem}-f32.gguf"
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_arch_fixtures import greedy_on
    from lab.host.f32copy import f32_copy
    f32_copy(str(path), str(copy))
    try:
        llm = llama_cpp.Llama(str(copy), n_ctx=N_CTX, n_batch=N_CTX, logits_all=True, seed=0, verbose=False,
                              n_threads=2, n_threads_batch=2, type_k=0, type_v=0, flash_attn=False)
        out = []
        for prompt in PROMPTS:
            llm.reset()
            llm.eval(prompt)
            positions = [{"pos": p, "logits": [round(float(x), 5) for x in llm.scores[p]]} for p in POSITIONS]
            ids, gaps = greedy_on(llm, GREEDY_N)
            out.append({"prompt": list(prompt), "positions": positions, "greedy": ids, "top2_gap": gaps})
        del llm
        return {"runs": out, "llama_cpp_python": llama_cpp.__version__}
    finally:
        copy.unlink(missing_ok=True)


def make_mixed() -> None:
    from gguf import GGUFReader
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base, ones = Path(tmp) / "base-f32.gguf", Path(tmp) / "ones.imatrix"
        write_base(base)
        write_ones_imatrix(base, ones)
        for preset in PRESETS:
            t = time.time()
            dst = OUT / f"mixed-{preset.lower()}.gguf"
            _, cmd = quantize(base, dst, preset, ones if preset in IMATRIX_PRESETS else None)
            # as the file says (the log interleaves the imatrix's messages with a tensor's line)
            types = {t.name: t.tensor_type.name for t in GGUFReader(str(dst)).tensors}
            answers = llama_cpp_answers(dst)
            data = {"preset": preset, "types": types, **{k: v for k, v in answers.items() if k == "runs"},
                    "meta": {"file": dst.name, "file_sha256": sha256(dst), "file_bytes": dst.stat().st_size,
                             "llama_quantize": " ".join(dst.name if c == str(dst) else c for c in cmd),
                             "base": "scripts/make_mixed_fixtures.py write_base (seed %d)" % SEED,
                             "llama_cpp_python": answers["llama_cpp_python"],
                             "llama_cpp_args": f"n_ctx={N_CTX}, type_k=F32, type_v=F32, flash_attn=False",
                             "llama_cpp_ran": "an F32 copy (every tensor dequantized by gguf.quants): this build's "
                                              "quantized CPU path crashes here"}}
            out = OUT / f"mixed-{preset.lower()}.json"
            out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
            kinds = sorted(set(types.values()))
            print(f"{dst.name}: {dst.stat().st_size:,} bytes, types {kinds}, greedy {data['runs'][0]['greedy'][:6]}..., "
                  f"min gap {min(min(r['top2_gap']) for r in data['runs']):.4f}, {time.time() - t:.1f}s", flush=True)


def make_sameshape() -> None:
    """llama-quantize --dry-run Q4_K_M on an F32 header-only copy of each Q4_K_M spec (the data a sparse hole)."""
    all_f32 = defaultdict(lambda: "F32")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in [n for n in {**synthetic.SPECS, **synthetic.SMALL} if synthetic.spec(n).types == "Q4_K_M"]:
            path = Path(tmp) / f"{name}-f32.gguf"
            f32 = replace(synthetic.spec(name), types=all_f32)
            os.truncate(path, max(t.offset + t.nbytes for t in synthetic.header(f32, path, vocab=True).tensors))
            types, _ = quantize(path, None, "Q4_K_M")
            out[name] = types
            print(f"{name}: {len(types)} tensors, {sorted(set(types.values()))}", flush=True)
            path.unlink()
    (OUT / "sameshape-q4_k_m.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    todo = sys.argv[1:] or ["mixed", "sameshape"]
    if "mixed" in todo:
        make_mixed()
    if "sameshape" in todo:
        make_sameshape()
