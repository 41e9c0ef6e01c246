"""Mixed files as llama-quantize writes them (IQ2_M, IQ3_M, Q3_K_M, Q4_K_M, Q5_K_M, Q6_K presets: each tensor its own
type) load natively (lavapipe) and match llama.cpp on the same file.

The files and llama.cpp's answers are tests/fixtures/mixed/mixed-<preset>.{gguf,json}, made by
scripts/make_mixed_fixtures.py (never in CI: it needs the built llama-quantize): one small llama-shaped F32 file
(4 layers, n_embd 256, GQA 2, untied head, a placeholder vocabulary of 512) quantized with each preset, the i-quant
presets with an importance matrix of ones. llama.cpp ran each as an F32 copy (every tensor dequantized by
gguf.quants, llama.cpp's own dequantization bit for bit) with an F32 KV cache and flash attention off: the same
function the lab computes from the quantized blocks (this machine's llama.cpp crashes in its quantized CPU path,
whose 8-bit activations would move logits anyway: docs/correctness.md).

Evidence, per preset:
1. the file is the fixture's (sha256); its per-tensor types are the ones llama-quantize wrote (the fixture read them
   from the file), the mixed presets hold several distinct types, and the engine placed every matrix with its file's
   type (a stacked QKV or gate/up only stacks tensors of one type);
2. logits at positions 1, 4 and 7 of two prompts, over the whole vocabulary: |ours - llama.cpp| <= F32_TOL, and top-1
   llama.cpp's unless llama.cpp's own top-2 gap is under NEAR_TIE;
3. 32 greedy tokens through the decode path: llama.cpp's, id for id, up to the first step where llama.cpp's top-2 gap
   is under NEAR_TIE (after it the two may rightly part).
Every type these presets write is one the lab reads (lab.format.ggml.KERNEL_TYPES): no refusal to show.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter

import numpy as np
import pytest

from lab.engine.engine import Engine
from lab.format import gguf
from lab.format.model import from_gguf
from tests.conftest import FIXTURES

MIXED = FIXTURES / "mixed"
PRESETS = ("iq2_m", "iq3_m", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k")
# Both sides compute in f32 from the same dequantized values; they differ in summation order (tiled matmuls, online
# softmax). The logits here have std ~8 (the file's head is scaled so): measured worst 4.5e-5 over the six files.
# 1e-3 keeps a 20x margin while a wrong block decode (a scale, a high bit, a grid index) moves logits by O(0.1-1).
F32_TOL = 1e-3
NEAR_TIE = 0.01     # a top-2 gap under this is a tie: summation order may pick either


class Run:
    """One mixed file through the engine: its fixture, header, config, and the engine with the weights uploaded."""

    def __init__(self, device, preset: str) -> None:
        self.fx = json.loads((MIXED / f"mixed-{preset}.json").read_text())
        self.path = MIXED / f"mixed-{preset}.gguf"
        self.header = gguf.read_file(self.path)
        self.cfg = from_gguf(self.header)
        self.device = device
        self.engine = Engine(device, self.header, self.cfg, n_ctx=64, logits_all=True)
        self.engine.weights.upload_file(self.path)

    def logits(self, ids: list[int]) -> np.ndarray:
        """[t, n_vocab] prefill logits of `ids` from position 0."""
        self.engine.step(ids, 0)
        raw = asyncio.run(self.device.read(self.engine.scratch.logits, 0, 4 * len(ids) * self.cfg.n_vocab))
        return np.frombuffer(raw, np.float32).reshape(len(ids), self.cfg.n_vocab).copy()

    def greedy(self, ids: list[int], n: int) -> list[int]:
        out = []
        self.engine.step(ids, 0)
        for i in range(n):
            out.append(asyncio.run(self.engine.argmax()))
            if i + 1 < n:
                self.engine.step(None, len(ids) + i)     # decode: ids[0] already holds the argmax
        return out


_runs: dict = {}     # every preset's engine stays loaded (1.5 MB of weights at most): each test visits all six


@pytest.fixture
def run(device, request):
    preset = request.node.callspec.params["preset"]
    if preset not in _runs:
        _runs[preset] = Run(device, preset)
    return _runs[preset]


@pytest.mark.parametrize("preset", PRESETS)
def test_types_are_llama_quantizes(run, preset):
    assert hashlib.sha256(run.path.read_bytes()).hexdigest() == run.fx["meta"]["file_sha256"]
    file_types = {t.name: t.type.name for t in run.header.tensors}
    assert file_types == run.fx["types"]
    quantized = Counter(t for t in file_types.values() if t != "F32")
    assert len(quantized) >= (1 if preset == "q6_k" else 2), f"{preset}: one type only: {dict(quantized)}"
    placed = {}
    for key, w in run.engine.weights.matrices.items():
        for name in key.split("+"):
            placed[name] = w.type.name
    assert placed == {n: t for n, t in file_types.items() if t != "F32"}, f"{preset}: placed types differ"
    print(f"{preset}: {dict(quantized)}")


@pytest.mark.parametrize("preset", PRESETS)
def test_logits_match_llama_cpp(run, preset):
    worst = 0.0
    for r in run.fx["runs"]:
        got = run.logits(r["prompt"])
        for p in r["positions"]:
            want = np.array(p["logits"])
            row = got[p["pos"]]
            diff = float(np.abs(row - want).max())
            worst = max(worst, diff)
            top2 = np.sort(want)[-2:]
            if top2[1] - top2[0] >= NEAR_TIE:
                assert int(np.argmax(row)) == int(np.argmax(want)), f"{preset} position {p['pos']}: top-1 differs"
            assert diff <= F32_TOL, f"{preset} position {p['pos']}: max |logit diff| {diff:.3g} > {F32_TOL}"
    print(f"{preset}: max |logit diff| vs llama.cpp {worst:.3g}")


@pytest.mark.parametrize("preset", PRESETS)
def test_greedy_matches_llama_cpp(run, preset):
    for r in run.fx["runs"]:
        want, gaps = r["greedy"], r["top2_gap"]
        got = run.greedy(r["prompt"], len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            if gaps[i] < NEAR_TIE:
                print(f"{preset}: compared {i} steps, stopped at a near-tie (gap {gaps[i]})")
                break
            assert g == w, f"{preset}: greedy step {i}: {g} != llama.cpp's {w} (gap {gaps[i]})"
