"""llama.cpp's logits with and without a LoRA adapter on the synthetic Llama 3 file (tests/fixtures/lora/). NOT part
of CI.

Runs only with a Python that has llama-cpp-python 0.3.36 (and numpy, gguf), the lab on its path:

    PYTHONPATH=. /work/llamavenv/bin/python scripts/make_lora_fixtures.py              # tests/fixtures/lora/
    PYTHONPATH=. /work/llamavenv/bin/python scripts/make_lora_fixtures.py --spec lfm2  # tests/fixtures/lora-lfm2/

`--spec lfm2`: the same on the synthetic LFM2 file (6 layers: short-conv blocks at 0, 1, 3, 4, attention at 2 and 5,
SmolLM2's vocabulary), the adapter on every projection a layer has, the short conv's `shortconv.in_proj` and
`shortconv.out_proj` (rank 4) among them, under llama.cpp's names (LLM_TENSOR_SHORTCONV_INPROJ / _OUTPROJ, both
through build_lora_mm in src/models/lfm2.cpp); the hostile loader cases are the llama3 fixture's alone.
`--spec qwen35` (tests/fixtures/lora-qwen35/): the synthetic Qwen3.5 file (delta-net layers and gated attention), the
adapter on the delta-net's attn_qkv, attn_gate and ssm_out, and on the attention layers' attn_q, whose rows are each
head's [q | gate] in the file (the lab holds them apart in its run: lab.ops.weights.run_pieces), attn_k, attn_v,
attn_output, and every ffn.

The model: lab.host.synthetic.arch's "llama3" in F32 (4 layers of 256, 4 query heads over 2 KV heads of 64, n_ff 512,
llama 3's rope_freqs, SmolLM2's real vocabulary and tokenizer; 61 MB, the tests' `tiny()` file), built under
~/.cache/llm-lab/synthetic with fixed seeds: the test rebuilds the same bytes and checks the sha256 recorded here.

The adapter (written by lab.format.adapter.write_adapter, committed: adapter.gguf): a random LoRA, seed SEED, on
attn_q, attn_k, attn_v, attn_output (rank 4) and ffn_gate, ffn_up, ffn_down (rank 2) of every layer, alpha 8: the
two ranks make two scales (alpha / r = 2 and 4), so a reader that scales by one rank for the file, or by alpha
alone, is caught. A ~ N(0, 1/n_in), B ~ N(0, (DELTA / (s sqrt(r)))^2): each s B A has entries of about DELTA times
W's (1/sqrt(n_in)), so the adapter moves the logits by units while the model stays a model.

llama.cpp runs the file with an F32 KV cache and flash attention off (type_k = type_v = 0, flash_attn=False), as
scripts/make_arch_fixtures.py does: on F32 weights and an F32 adapter it rounds nothing of its own (y = W x +
s B (A x), every matmul f32), so it computes the function the float64 reference computes, to f32 rounding.

logits.npz: `ids` (the N_TOKENS token ids, BOS first: TEXT as llama.cpp tokenizes it), `cols` (the vocabulary ids
kept: the union of the top TOP at every position of both runs and N_SAMPLE fixed random ids), `with_adapter` and
`without` ([N_TOKENS, len(cols)] float32: llama.cpp's logits at those ids, every position), `argmax_with` and
`argmax_without` (llama.cpp's top id over the whole vocabulary at each position, and `gap_with` / `gap_without` its
top-2 gap). meta.json: the model's spec, mix, sha256 and size, the adapter's alpha, ranks, seed and sha256, llama.cpp's
version and arguments, the adapter's effect (max |with - without| over the kept logits, and over the whole
vocabulary), and `llama_cpp_loader`: what
llama.cpp's loader says of each hostile adapter of tests/unit/adapterkit.py's loader_cases ("loaded", or "refused: "
and its reason), which tests/unit/test_lora_reference.py holds lab.format.adapter to.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.format import gguf, model
from lab.format.adapter import write_adapter
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch
from tests.unit.adapterkit import loader_cases

OUTS = {"llama3": ROOT / "tests" / "fixtures" / "lora", "lfm2": ROOT / "tests" / "fixtures" / "lora-lfm2",
        "qwen35": ROOT / "tests" / "fixtures" / "lora-qwen35"}
SPEC, MIX = "llama3", "f32"     # --spec changes SPEC and OUT
OUT = OUTS[SPEC]
SEED = 43               # issue #43
ALPHA = 8.0
# a layer's projections that it has (lfm2: the conv blocks have no attn_*, the attention blocks no shortconv.*)
RANKS = {"attn_q": 4, "attn_k": 4, "attn_v": 4, "attn_output": 4, "shortconv.in_proj": 4, "shortconv.out_proj": 4,
         "attn_qkv": 4, "attn_gate": 4, "ssm_out": 4, "ffn_gate": 2, "ffn_up": 2, "ffn_down": 2}
DELTA = 0.3
TEXT = "The old lighthouse keeper climbed the stairs every evening, counting the steps."
N_TOKENS = 12
TOP = 16
N_SAMPLE = 64
N_CTX = 64


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def model_path() -> Path:
    return synthetic_arch.build(SPEC, MIX, cache_dir() / "synthetic")


def adapter_pairs(cfg) -> list[tuple[str, int, int, int, bytes, bytes]]:
    """The random pairs, in layer order, each tensor from its own seed."""
    table = model.stored_tensors(cfg)
    pairs = []
    for il in range(cfg.n_layer):
        for role, rank in RANKS.items():
            name = f"blk.{il}.{role}.weight"
            if name not in table:
                continue
            n_in, n_out = table[name]
            rng = np.random.default_rng([SEED, il, list(RANKS).index(role)])
            scale = ALPHA / rank
            a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
            b = rng.standard_normal((n_out, rank)) * DELTA / (scale * np.sqrt(rank))
            pairs.append((name, n_in, n_out, rank, a.astype("<f4").tobytes(), b.astype("<f4").tobytes()))
    return pairs


def run(path: Path, ids: list[int], lora: Path | None) -> np.ndarray:
    """llama.cpp's logits at every position of ids, [len(ids), n_vocab] float32."""
    llm = llama_cpp.Llama(str(path), lora_path=str(lora) if lora else None, n_ctx=N_CTX, n_batch=N_CTX,
                          logits_all=True, seed=0, verbose=False, n_threads=2, n_threads_batch=2, type_k=0,
                          type_v=0, flash_attn=False)
    llm.reset()
    llm.eval(ids)
    out = np.array(llm.scores[:len(ids)], dtype=np.float32)
    del llm
    return out


def loader_verdicts(path: Path) -> dict[str, str]:
    """llama.cpp's loader (llama_adapter_lora_init, through the C API: llama-cpp-python 0.3.36's Llama(lora_path=...)
    checks the NULL it returns with `is None`, which a ctypes pointer never is, and segfaults on every refused file)
    on each of tests/unit/adapterkit.py's loader_cases: "loaded", or "refused: " and the reason it logs."""
    errors: list[str] = []
    said = "failed to apply lora adapter: "

    @llama_cpp.llama_log_callback
    def log(_level, text, _user):
        line = text.decode("utf-8", "replace").strip()
        if said in line:
            errors.append(line.split(said, 1)[1])

    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, verbose=False, n_threads=2)
    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
    tmp = OUT / "case.gguf.tmp"
    out = {}
    try:
        for name, (_, data) in loader_cases().items():
            tmp.write_bytes(data)
            errors.clear()
            p = llama_cpp.llama_adapter_lora_init(llm._model.model, str(tmp).encode())
            if p:
                llama_cpp.llama_adapter_lora_free(p)
                out[name] = "loaded"
            else:
                out[name] = "refused: " + (errors[-1] if errors else "(no message)")
    finally:
        tmp.unlink(missing_ok=True)
        llama_cpp.llama_log_set(ctypes.cast(None, llama_cpp.llama_log_callback), ctypes.c_void_p(0))
    del llm
    return out


def top2(logits: np.ndarray) -> tuple[list[int], list[float]]:
    order = np.argsort(-logits, axis=1, kind="stable")[:, :2]
    rows = np.arange(len(logits))
    gaps = logits[rows, order[:, 0]] - logits[rows, order[:, 1]]
    return [int(i) for i in order[:, 0]], [round(float(g), 5) for g in gaps]


def main() -> None:
    global SPEC, OUT
    if sys.argv[1:2] == ["--spec"]:
        SPEC = sys.argv[2]
        OUT = OUTS[SPEC]
    path = model_path()
    cfg = model.from_gguf(gguf.read_file(path))
    OUT.mkdir(parents=True, exist_ok=True)
    adapter = OUT / "adapter.gguf"
    adapter.write_bytes(write_adapter(cfg.arch, ALPHA, adapter_pairs(cfg), name=f"synthetic {SPEC} LoRA seed {SEED}"))
    probe = llama_cpp.Llama(str(path), n_ctx=N_CTX, vocab_only=True, verbose=False)
    ids = probe.tokenize(TEXT.encode(), add_bos=True, special=False)[:N_TOKENS]
    del probe
    assert len(ids) == N_TOKENS, ids
    with_adapter, without = run(path, ids, adapter), run(path, ids, None)
    n_vocab = with_adapter.shape[1]
    top = {int(i) for lg in (with_adapter, without) for row in lg for i in np.argsort(-row, kind="stable")[:TOP]}
    sample = np.random.default_rng(SEED).choice(n_vocab, N_SAMPLE, replace=False)
    cols = np.array(sorted(top | {int(i) for i in sample}), dtype=np.int32)
    (am_w, gap_w), (am_o, gap_o) = top2(with_adapter), top2(without)
    np.savez_compressed(OUT / "logits.npz", ids=np.array(ids, np.int32), cols=cols,
                        with_adapter=with_adapter[:, cols], without=without[:, cols],
                        argmax_with=np.array(am_w, np.int32), argmax_without=np.array(am_o, np.int32),
                        gap_with=np.array(gap_w, np.float32), gap_without=np.array(gap_o, np.float32))
    effect = float(np.abs(with_adapter - without)[:, cols].max())
    effect_all = float(np.abs(with_adapter - without).max())
    meta = {
        "spec": SPEC, "mix": MIX, "model_file": path.name, "model_sha256": sha256(path),
        "model_bytes": path.stat().st_size, "adapter_sha256": sha256(adapter), "adapter_bytes": adapter.stat().st_size,
        "alpha": ALPHA, "ranks": RANKS, "seed": SEED, "delta": DELTA, "text": TEXT, "ids": ids,
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_args": f"n_ctx={N_CTX}, n_batch={N_CTX}, type_k=F32, type_v=F32, flash_attn=False, "
                          f"logits_all=True, lora_path=adapter.gguf, lora_scale=1.0",
        "effect_max_abs": round(effect, 4), "effect_max_abs_whole_vocabulary": round(effect_all, 4),
        "argmax_with": am_w, "argmax_without": am_o,
        "changed_argmax": sum(a != b for a, b in zip(am_w, am_o)),
        "ranks_used": sorted({(n.split(".", 2)[2].removesuffix(".weight"), r) for n, _, _, r, _, _ in
                              adapter_pairs(cfg)}),
        "pairs": len(adapter_pairs(cfg)),
    }
    if SPEC == "llama3":
        meta["llama_cpp_loader"] = loader_verdicts(path)
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    for p in sorted(OUT.iterdir()):
        print(f"{p.name}: {p.stat().st_size:,} bytes")
    print(f"adapter effect: max |with - without| = {effect:.3f} ({effect_all:.3f} over the vocabulary); argmax changed at {meta['changed_argmax']} of "
          f"{N_TOKENS} positions; min top-2 gap {min(gap_w):.4f} / {min(gap_o):.4f}")


if __name__ == "__main__":
    main()
