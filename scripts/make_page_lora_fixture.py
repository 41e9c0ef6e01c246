"""A LoRA adapter trained in the page on SmolLM2-135M-Instruct, and llama.cpp's logits with it (tests/fixtures/
lora-page/). NOT part of CI.

Issue #43's acceptance: "a LoRA trained in the page on SmolLM2 loads in llama.cpp with matching logits". Runs only
with a Python that has llama-cpp-python 0.3.36 (and numpy, gguf), the lab on its path, and the project's own
environment (.venv: Playwright, the server) for the page's run, in headless Chromium (/usr/bin/chromium: SwiftShader's
WebGPU on a machine without a GPU):

    PYTHONPATH=. /work/llamavenv/bin/python scripts/make_page_lora_fixture.py

1. The Training card trains the adapter in the page: `lab train MODEL --backend browser --out adapter.gguf`
   (lab/host/bench/browser.py train_page: the model loaded through the page's file input, the card's own `train`
   message, the file as the card's download makes it). The real SmolLM2 Q4_1 file, RANK on every attention and
   feed-forward projection (the card's targets), AdamW at LR for STEPS steps of one window of CTX tokens from TEXT,
   the first TEXT_CHARS characters of tests/fixtures/constitution.txt (7 windows: 6 trained on, 1 held out).
2. llama.cpp loads it (`lora_path`) over an F32 copy of the model (every tensor dequantized by gguf.quants, as
   scripts/make_fixtures.py --f32 makes them: llama.cpp then rounds nothing of its own, and the lab reads Q4_1 blocks
   to the same F32 values), F32 KV cache, flash attention off, and gives the logits of PROMPT at every position,
   with the adapter and without.

Written: adapter.gguf (committed: the test reads it, CI never trains in a page), logits.npz (`ids`, `cols`: the top
TOP of every position of both runs and N_SAMPLE fixed random ids, `with_adapter` and `without` [positions, cols]),
meta.json (the run's settings, the page's losses, the adapter's sha256, llama.cpp's arguments, the adapter's effect).
tests/engine/test_lora_engine.py holds the lab's logits with this adapter to llama.cpp's.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from lab.host import models
from lab.host.f32copy import f32_copy
from make_lora_fixtures import N_SAMPLE, TOP, top2
from make_lora_fixtures import run as llama_logits

OUT = ROOT / "tests" / "fixtures" / "lora-page"
MODEL = "smollm2"
TEXT_CHARS = 1200
CTX, BATCH, STEPS, RANK, LR = 32, 1, 4, 1, 0.005
PROMPT = "The people of the United States, in order to form a more perfect union,"
SEED = 43


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main() -> None:
    model = models.path(MODEL)
    text = (ROOT / "tests" / "fixtures" / "constitution.txt").read_text()[:TEXT_CHARS]
    OUT.mkdir(parents=True, exist_ok=True)
    adapter = OUT / "adapter.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "text.txt"
        data.write_text(text)
        got = subprocess.run([str(ROOT / ".venv" / "bin" / "lab"), "train", str(model), "--data", str(data),
                              "--ctx", str(CTX), "--batch", str(BATCH), "--steps", str(STEPS), "--lora-rank",
                              str(RANK), "--lr", str(LR), "--optimizer", "adamw", "--backend", "browser",
                              "--chromium", "/usr/bin/chromium", "--out", str(adapter), "--json"],
                             check=True, capture_output=True, text=True)
        run = json.loads(got.stdout)
        gpu = f"{run['adapter']['vendor']} {run['adapter']['architecture']}"
        print(f"the page trained {STEPS} steps on {gpu}: losses {run['losses']}")
        f32 = Path(tmp) / "smollm2-f32.gguf"
        f32_copy(str(model), str(f32))
        probe = llama_cpp.Llama(str(f32), n_ctx=64, vocab_only=True, verbose=False)
        ids = probe.tokenize(PROMPT.encode(), add_bos=True, special=False)
        del probe
        with_adapter, without = llama_logits(f32, ids, adapter), llama_logits(f32, ids, None)
        f32_bytes = os.path.getsize(f32)
    n_vocab = with_adapter.shape[1]
    top = {int(i) for lg in (with_adapter, without) for row in lg for i in np.argsort(-row, kind="stable")[:TOP]}
    sample = np.random.default_rng(SEED).choice(n_vocab, N_SAMPLE, replace=False)
    cols = np.array(sorted(top | {int(i) for i in sample}), dtype=np.int32)
    (am_w, gap_w), (am_o, _) = top2(with_adapter), top2(without)
    np.savez_compressed(OUT / "logits.npz", ids=np.array(ids, np.int32), cols=cols,
                        with_adapter=with_adapter[:, cols], without=without[:, cols])
    effect = float(np.abs(with_adapter - without)[:, cols].max())
    meta = {
        "model": MODEL, "model_file": model.name, "model_sha256": models.MODELS[MODEL].sha256,
        "trained_in": f"the page's Training card, headless Chromium, WebGPU adapter {gpu}",
        "text": f"tests/fixtures/constitution.txt, first {TEXT_CHARS} characters",
        "ctx": CTX, "batch": BATCH, "steps": STEPS, "rank": RANK, "lr": LR, "optimizer": "adamw",
        "losses": run["losses"], "held_out": run["held_out"], "params": run["params"],
        "adapter_sha256": sha256(adapter), "adapter_bytes": adapter.stat().st_size,
        "prompt": PROMPT, "ids": ids, "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_args": "F32 copy (gguf.quants.dequantize), n_ctx=64, type_k=F32, type_v=F32, flash_attn=False, "
                          "logits_all=True, lora_path=adapter.gguf, lora_scale=1.0",
        "f32_bytes": f32_bytes, "effect_max_abs": round(effect, 4),
        "changed_argmax": sum(a != b for a, b in zip(am_w, am_o)), "min_top2_gap_with": min(gap_w),
    }
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    for p in sorted(OUT.iterdir()):
        print(f"{p.name}: {p.stat().st_size:,} bytes")
    print(f"adapter effect: max |with - without| = {effect:.4f}; argmax changed at {meta['changed_argmax']} of "
          f"{len(ids)} positions")


if __name__ == "__main__":
    main()
