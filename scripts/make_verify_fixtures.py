"""Generate the verification card's llama.cpp references (reference/). NOT part of CI.

Runs only with a Python that has llama-cpp-python (the reference venv):

    LLAMA_CPP_LIB_PATH=.../llama.cpp/build/bin /root/refvenv/bin/python scripts/make_verify_fixtures.py [smollm2 qwen2.5
    gemma3 lfm2 qwen35]

(lfm2 and qwen35: the synthetic F32 hybrids of lab/host/synthetic/arch.py, built with the project venv first.)

Per model, the fixed prompt PROMPT (tokenized by llama.cpp with the vocabulary's BOS) is fed to llama.cpp one token
at a time, as generation runs, and the final logits are written over the full vocabulary as little-endian f32:

    reference/<model>.quant.f32   the quantized file as llama.cpp's CPU path runs it (default KV cache: f16)
    reference/<model>.exact.f32   an F32 copy of the weights (scripts/make_fixtures.py's f32_copy: every tensor
                                  dequantized by gguf-py), an F32 KV cache (type_k = type_v = 0), flash attention off

then a greedy continuation of N_GEN tokens (stopping after an end-of-generation id, which is kept) with the top-2
logit gap at each step. reference/index.json maps each model file's content hash (lab.instruments.verify.content_hash:
the header and sampled tensor bytes, never the file name) to its prompt ids, continuations, gaps and logit files.
The kernel checks' fixtures (reference/kernels.json) come from scripts/make_kernel_fixtures.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from lab.host.f32copy import f32_copy

from lab.host import models
from lab.host.synthetic import arch as synthetic_arch
from lab.instruments import verify

OUT = ROOT / "reference"
PROMPT = "Once upon a time, in a small village by the sea, there lived"
N_THREADS = 2


def run(llm, prompt_ids: list[int], eog: set[int]) -> tuple[np.ndarray, list[int], list[float]]:
    """Token by token: final logits, greedy ids (an end-of-generation id kept), top-2 gap at each generated step."""
    llm.reset()
    for t in prompt_ids:
        llm.eval([t])
    final = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    ids, gaps = [], []
    row = final
    for _ in range(verify.N_GEN):
        order = np.argsort(-row, kind="stable")[:2]
        ids.append(int(order[0]))
        gaps.append(round(float(row[order[0]] - row[order[1]]), 5))
        if ids[-1] in eog:
            break
        llm.eval([ids[-1]])
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return final, ids, gaps


def reference(name: str, kind: str, path: str, prompt_ids: list[int], eog: set[int], **kwargs) -> dict:
    t0 = time.time()
    llm = llama_cpp.Llama(path, n_ctx=256, n_batch=64, logits_all=True, seed=0, verbose=False,
                          n_threads=N_THREADS, n_threads_batch=N_THREADS, **kwargs)
    final, ids, gaps = run(llm, prompt_ids, eog)
    del llm
    out = OUT / f"{name}.{kind}.f32"
    out.write_bytes(final.astype("<f4").tobytes())
    order = np.argsort(-final, kind="stable")[:2]
    return {"logits": out.name, "greedy": ids, "top2_gap": gaps, "argmax": int(order[0]),
            "max_abs_logit": round(float(np.abs(final).max()), 5),
            "llama_cpp_args": ", ".join(f"{k}={v}" for k, v in kwargs.items()) or "defaults (KV cache f16)",
            "eval_s": round(time.time() - t0, 1)}


# The hybrids the lab runs but no real weights of which are reachable here: their synthetic F32 files
# (lab/host/synthetic/arch.py), so that the card's replay holds them to llama.cpp as it holds the real models.
SYNTHETIC = ("lfm2", "qwen35")


def model_file(name: str) -> tuple[str, str, str]:
    """(path, file name, sha256) of the model `name`: a real one (lab.host.models) or a synthetic hybrid."""
    if name in SYNTHETIC:
        path = synthetic_arch.build(name, "f32", models.cache_dir() / "synthetic")
        return str(path), path.name, hashlib.sha256(path.read_bytes()).hexdigest()
    return str(models.path(name)), models.MODELS[name].filename, models.MODELS[name].sha256


def make(name: str) -> tuple[str, dict]:
    path, file_name, sha = model_file(name)
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    prompt_ids = llm.tokenize(PROMPT.encode("utf-8"), add_bos=True, special=False)   # BOS per the vocabulary
    n_vocab = llm.n_vocab()
    eog = {t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t)}
    del llm
    refs = {"quant": reference(name, "quant", path, prompt_ids, eog)}
    dst = f"/tmp/llm-lab-verify-{name}-f32.gguf"
    try:
        f32_copy(path, dst)
        refs["exact"] = reference(name, "exact", dst, prompt_ids, eog, type_k=0, type_v=0, flash_attn=False)
    finally:
        if os.path.exists(dst):
            os.remove(dst)
    entry = {"model": name, "file": file_name, "sha256": sha,
             "prompt": PROMPT, "prompt_ids": prompt_ids, "n_vocab": n_vocab, "references": refs,
             "llama_cpp_python": llama_cpp.__version__}
    return verify.file_content_hash(path), entry


def main(argv: list[str]) -> None:
    OUT.mkdir(exist_ok=True)
    index_path = OUT / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index.setdefault("models", {})
    index.update({"hash": {"samples": verify.SAMPLES, "sample_bytes": verify.SAMPLE_BYTES,
                           "tag": verify.HASH_TAG.decode().rstrip("\0")},
                  "n_gen": verify.N_GEN})
    for name in argv or ["smollm2", "qwen2.5", "gemma3"]:
        t = time.time()
        digest, entry = make(name)
        index["models"] = {k: v for k, v in index["models"].items() if v["model"] != name}
        index["models"][digest] = entry
        index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
        q, e = entry["references"]["quant"], entry["references"]["exact"]
        print(f"{name}: {digest[:16]} prompt {len(entry['prompt_ids'])} ids; quant greedy {q['greedy']}; "
              f"exact greedy {e['greedy']}; {time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
