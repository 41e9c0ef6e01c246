"""The f16 KV cache on every architecture's cache paths (the synthetic files of tests/engine/test_architectures.py,
its default set: llama 3, Mistral-style, phi3, smollm3's NoPE layers (the plain KV write), lfm2 and qwen35 (hybrids:
attention layers among conv / delta-net ones), gemma4 (head sizes per layer, the shared-KV tail)), natively: the
engine with kv="f16" against the same engine with the f32 cache on the same file, prefill logits at every prompt
position and a greedy continuation through the decode path.

Tolerance: the f16 cache rounds each cached value (relative 2^-11), carried through the layers. Measured (lavapipe),
the largest difference over the prompt's positions relative to the largest logit: llama3 4.6e-4, mistral 4.9e-4, phi3
5.1e-4, smollm3 4.5e-4, lfm2 2.0e-4, qwen35 1.8e-4, gemma4 4.5e-4, gemma4kv 6.6e-4 (SmolLM2's real file: 4.2e-4,
tests/engine/test_f16_cache.py); LOGIT_TOL = 1e-2, as there, stays far under what a cache of the wrong layer or type
gives (the logits of another computation: order 1). Greedy: the same ids (all 8 were, on every file) until the f32
engine's own top-2 gap is under NEAR_TIE (after a near-tie the two may rightly part).

The mixtures of experts (docs/moe.md): a router's choice is not continuous. Where llama.cpp's fixture records a choice
whose margin (the last chosen expert's selection value less the best unchosen one's) is under ROUTER_TIE, the f16
cache's rounding may pick the other expert, which moves that position's logits, and through the cache every later
one's, by O(1) (mixtral's F32 prompt: layer 1, position 5, margin 4e-5: from there on up to 5.6 apart, greedy still
identical). The logits are held to LOGIT_TOL up to the first such position; greedy as for every file.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from test_architectures import ARCH_FIXTURES, synthetic_dir

from lab.engine.engine import Engine, read_host_values
from lab.engine.load import validate
from lab.format import gguf
from lab.host.synthetic import arch as synthetic_arch
from tests.conftest import SMALL_VOCAB_SPECS

# qwen3moe's by default; the other two mixtures of experts (Mixtral-style, lfm2moe) with --slow, as in
# test_architectures.py
SPECS = [s if s not in ("mixtral", "lfm2moe") else pytest.param(s, marks=pytest.mark.slow) for s in SMALL_VOCAB_SPECS]
LOGIT_TOL = 1e-2
NEAR_TIE = 0.05
GREEDY = 8
ROUTER_TIE = 1e-3       # a router choice this close (in probability) may flip under the f16 cache's rounding


def comparable(fx: dict, t: int) -> int:
    """The prompt positions whose logits the f16 cache must keep: those before the first router near-tie."""
    margins = fx.get("router", {}).get("margin", [])
    return min([t] + [p for layer in margins for p, m in enumerate(layer) if m < ROUTER_TIE])


def run(eng: Engine, ids: list[int]) -> tuple[np.ndarray, list[int], list[float]]:
    """(prefill logits [t, n_vocab], GREEDY greedy ids, the top-2 gap before each)."""
    n_vocab = eng.cfg.n_vocab
    eng.step(ids, 0)
    logits = np.frombuffer(asyncio.run(eng.device.read(eng.scratch.logits, 0, 4 * len(ids) * n_vocab)),
                           np.float32).reshape(len(ids), n_vocab).copy()
    out, gaps = [], []
    last = logits[-1]
    for i in range(GREEDY):
        top = np.sort(last)[-2:]
        gaps.append(float(top[1] - top[0]))
        nxt = asyncio.run(eng.argmax())
        out.append(nxt)
        eng.step(None, len(ids) + i)           # decode: ids[0] already holds the argmax
        raw = asyncio.run(eng.device.read(eng.scratch.logits, 0, 4 * n_vocab))
        last = np.frombuffer(raw, np.float32).copy()
    return logits, out, gaps


@pytest.mark.parametrize("spec", SPECS)
def test_f16_cache_follows_the_f32_cache(device, spec):
    fx = json.loads((ARCH_FIXTURES / f"{spec}-f32.json").read_text())
    path = synthetic_arch.build(spec, "f32", synthetic_dir())
    header = gguf.read_file(path)
    cfg, _ = validate(header)
    got = {}
    for kv in ("f32", "f16"):
        eng = Engine(device, header, cfg, n_ctx=128, logits_all=True, kv=kv,
                     host_values=read_host_values(path, header, cfg))
        try:
            eng.weights.upload_file(path)
            if kv == "f16":
                assert all(k.size * 2 == got["f32"][3][i] for i, (k, _) in enumerate(eng.kv_buffers))
            got[kv] = run(eng, fx["prompt_ids"]) + ([k.size for k, _ in eng.kv_buffers],)
        finally:
            eng.close()
    (l32, ids32, gaps, _), (l16, ids16, _, _) = got["f32"], got["f16"]
    upto = comparable(fx, len(l32))     # every position but a mixture of experts' after a router near-tie
    err = float(np.abs(l16[:upto].astype(np.float64) - l32[:upto]).max() / np.abs(l32).max())
    print(f"\n{spec}: f16 cache vs f32, prefill logits within {err:.2e} of the largest; greedy "
          f"{'identical' if ids16 == ids32 else f'{ids16} vs {ids32}'}")
    assert err <= LOGIT_TOL
    for i, (a, b) in enumerate(zip(ids16, ids32)):
        if gaps[i] < NEAR_TIE:
            break
        assert a == b, f"{spec}: greedy token {i}: {a} with the f16 cache, {b} with f32 (top-2 gap {gaps[i]:.3f})"
