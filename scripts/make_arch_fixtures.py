"""llama.cpp's answers on the synthetic architecture GGUFs (tests/fixtures/arch/<spec>-<mix>.json). NOT part of CI.

Runs only with a Python that has llama-cpp-python (the reference venv):

    LLAMA_CPP_LIB_PATH=/root/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \\
        /root/refvenv/bin/python scripts/make_arch_fixtures.py [SPEC[-MIX] ...]

Each synthetic file is built by lab.host.synthetic.arch (fixed seeds: the tests rebuild the same bytes and
check the sha256 recorded here) under ~/.cache/llm-lab/synthetic, then run by llama.cpp with an F32 KV
cache and flash attention off (type_k = type_v = 0, flash_attn=False): on F32 weights llama.cpp then
rounds nothing of its own, so it computes the function the engine computes. A quantized mix runs as an
F32 copy (see `run`): the same weights, as gguf.quants dequantizes them. Per file:

  tokenize   ids of TEXT (add_bos=False, special=False): the lab tokenizer must give the same
  prompt_ids TEXT with BOS as the vocabulary says (add_bos=True)
  positions  for each of POSITIONS (prompt positions past 0, some past the synthetic sliding window of 8):
             the top-64 (ids, logits) and the logits of SAMPLE fixed ids (the same for every position)
  greedy     GREEDY_N greedy ids after the prompt, with llama.cpp's top-2 logit gap at each step
  meta       llama-cpp-python version, file sha256 and size, llama.cpp arguments
  router     (files with experts only) llama.cpp's routing of each prompt position in each routed layer, read by its
             eval callback (scripts/llamacpp_trace.py) in a second run whose logits must be the first's:
             `experts` (ffn_moe_topk: the chosen experts, best first), `weights` (ffn_moe_weights_norm: their
             renormalised weights) and `margin` (the selection score of the last chosen expert less the best unchosen
             one's, scores being ffn_moe_probs, or ffn_moe_probs_biased where the file has a selection bias: where it
             is tiny another engine may rightly choose otherwise), each [layer][position]

Small on purpose: about 10-20 KB a file (a router adds about 4 KB).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir

OUT = ROOT / "tests" / "fixtures" / "arch"
TEXT = ("The old lighthouse keeper climbed the stairs every evening, counting the steps: one hundred and "
        "twelve. Nobody knew why he still did it.")
POSITIONS = (1, 5, 9, 16, 24)
TOP = 64
N_SAMPLE = 64
GREEDY_N = 32
N_CTX = 128


def synthetic_dir() -> Path:
    return cache_dir() / "synthetic"


def sample_ids(n_vocab: int) -> list[int]:
    return sorted(int(i) for i in np.random.default_rng(12).choice(n_vocab, N_SAMPLE, replace=False))


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def f32_copy(src: Path, dst: Path) -> None:
    """`src` with every tensor dequantized by gguf.quants and written as F32 (metadata unchanged)."""
    from lab.host.f32copy import f32_copy as copy
    copy(str(src), str(dst))


def greedy_on(llm, n: int) -> tuple[list[int], list[float]]:
    """n greedy ids continuing the context as llm holds it (the logits of its last token first), and llama.cpp's
    top-2 logit gap at each step (the tests stop comparing at a near-tie). Also scripts/make_mixed_fixtures.py's and
    scripts/make_long_fixtures.py's."""
    ids, gaps = [], []
    for _ in range(n):
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top2 = np.argsort(-row, kind="stable")[:2]
        ids.append(int(top2[0]))
        gaps.append(round(float(row[top2[0]] - row[top2[1]]), 5))
        llm.eval([ids[-1]])
    return ids, gaps


def run(spec: str, mix: str) -> dict:
    path = synthetic_arch.build(spec, mix, synthetic_dir())
    # The quantized files run as F32 copies: on an F32 copy llama.cpp rounds nothing of its own (its quantized CPU
    # path rounds activations to 8 bits), so the engine (which dequantizes in-kernel, exactly) is held to F32
    # tolerances on every mix. (The build that made the first fixtures (GGML_NATIVE) also died with SIGILL in its
    # quantized CPU matmuls: AMX/AVX-512 code its VM did not allow.)
    run_path = path
    if mix != "f32":
        run_path = Path("/tmp") / f"llm-lab-arch-{spec}-{mix}-f32.gguf"
        f32_copy(path, run_path)
    try:
        return _run(spec, mix, path, run_path)
    finally:
        if run_path != path:
            run_path.unlink(missing_ok=True)


def _llama(path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_CTX, logits_all=True, seed=0, verbose=False,
                           n_threads=2, n_threads_batch=2, type_k=0, type_v=0, flash_attn=False)


def router(path: Path, prompt: list[int], want: np.ndarray) -> dict:
    """llama.cpp's routing of the prompt (the fixture's `router`), from a run traced by its eval callback whose
    logits must equal `want`, the untraced run's [t, n_vocab]."""
    from llamacpp_trace import Traced
    with Traced(lambda name: name.split("-")[0] in ("ffn_moe_topk", "ffn_moe_weights_norm", "ffn_moe_probs",
                                                      "ffn_moe_probs_biased")) as t:
        llm = _llama(path)
        t.on = True
        llm.eval(prompt)
        t.on = False
        got = np.asarray(llm.scores[:len(prompt)], dtype=np.float64)
        del llm
    assert np.array_equal(got, want), f"{path.name}: the traced run's logits differ by {np.abs(got - want).max()}"
    layers = sorted(int(name.split("-")[1]) for name in t.seen if name.startswith("ffn_moe_topk-"))
    out = {"layers": layers, "experts": [], "weights": [], "margin": []}
    for il in layers:
        experts = t.seen[f"ffn_moe_topk-{il}"].reshape(len(prompt), -1)          # [t, k]
        weights = t.seen[f"ffn_moe_weights_norm-{il}"].reshape(len(prompt), -1)
        score = t.seen.get(f"ffn_moe_probs_biased-{il}", t.seen[f"ffn_moe_probs-{il}"]).reshape(len(prompt), -1)
        k = experts.shape[1]
        ranked = -np.sort(-score, axis=1)
        chosen = np.take_along_axis(score, experts, axis=1)      # the scores of the experts llama.cpp chose
        assert (np.sort(chosen, axis=1) == np.sort(ranked[:, :k], axis=1)).all(), f"{path.name}: layer {il}'s top-k"
        out["experts"].append(experts.tolist())
        out["weights"].append([[round(float(w), 5) for w in row] for row in weights])
        out["margin"].append([round(float(m), 6) for m in ranked[:, k - 1] - ranked[:, k]])
    return out


def _run(spec: str, mix: str, path: Path, run_path: Path) -> dict:
    llm = _llama(run_path)
    text_ids = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    prompt = llm.tokenize(TEXT.encode(), add_bos=True, special=False)
    assert len(prompt) > max(POSITIONS), (spec, len(prompt))
    n_vocab = llm.n_vocab()
    sample = sample_ids(n_vocab)
    llm.reset()
    llm.eval(prompt)
    positions = []
    for p in POSITIONS:
        row = np.asarray(llm.scores[p], dtype=np.float64)
        top = np.argsort(-row, kind="stable")[:TOP]
        positions.append({"pos": p, "top_ids": [int(i) for i in top], "top_logits": [round(float(row[i]), 5) for i in top],
                          "sample_logits": [round(float(row[i]), 5) for i in sample]})
    prefill = np.asarray(llm.scores[:len(prompt)], dtype=np.float64)
    ids, gaps = greedy_on(llm, GREEDY_N)
    del llm
    routed = {"router": router(run_path, prompt, prefill)} if synthetic_arch.SPECS[spec].moe else {}
    return {
        "spec": spec, "mix": mix, "arch": synthetic_arch.SPECS[spec].arch, "n_vocab": n_vocab,
        "types": sorted(synthetic_arch.mix_types(mix)),
        "meta": {"llama_cpp_python": llama_cpp.__version__, "file": path.name, "file_sha256": sha256(path),
                 "file_bytes": path.stat().st_size,
                 "llama_cpp_args": f"n_ctx={N_CTX}, type_k=F32, type_v=F32, flash_attn=False, logits_all=True",
                 "llama_cpp_ran": "the file" if mix == "f32" else "an F32 copy (every tensor dequantized by "
                                  "gguf.quants): llama.cpp rounds nothing of its own on it"},
        "text": TEXT, "tokenize": text_ids, "prompt_ids": prompt, "sample_ids": sample,
        "positions": positions, "greedy": ids, "top2_gap": gaps, **routed,
    }


def main(argv: list[str]) -> None:
    todo = []
    for a in argv or list(synthetic_arch.SPECS):
        spec, _, mix = a.partition("-")
        todo += [(spec, m) for m in ([mix] if mix else synthetic_arch.mixes())]
    OUT.mkdir(parents=True, exist_ok=True)
    for spec, mix in todo:
        t = time.time()
        data = run(spec, mix)
        out = OUT / f"{spec}-{mix}.json"
        out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"{out.name}: {out.stat().st_size:,} bytes, greedy {data['greedy'][:8]}..., "
              f"min gap {min(data['top2_gap']):.4f}, {time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
