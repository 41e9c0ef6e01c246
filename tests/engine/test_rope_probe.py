"""`Probes.rope_inputs` (the page's RoPE demo) on real models through the native device.

The probe hands back one head's query and keys as that layer's rope op reads them (before the rotation) and the
engine's own attention probabilities of that query. Rotated here in numpy with the model's pairing (SmolLM2, a
llama GGUF: adjacent pairs, llama.cpp rope mode 0; Gemma 3 and Qwen2.5: halves, NeoX, mode 2), softmax(scale q.k)
over the causal keys must give the engine's probabilities; rotated with the other pairing it must not.

Tolerance: PROB_TOL = 1e-4 absolute on probabilities, the page's own (web/rope.js MATCH_TOL). Both sides start from
the same f32 q and k; the engine rounds to f32 (its own cos/sin within 5.4e-7, the dot products, the softmax), and
the K of cached positions came from the chat's own steps, not this replay. A score's rounding error grows with
scale * sum_i |q_i k_i|, which Qwen2.5's layer 0 (large q/k biases) drives to ~1000 (|score| up to 950): measured
there up to 3.3e-5; SmolLM2 and Gemma 3 stay under 2.1e-6.

The wrong pairing: some heads barely move (a head that puts nearly all its weight on one key, or, at RoPE base 1e6,
one whose useful pairs turn slowly), so the bound is on the largest change over a layer's heads: WRONG_MIN = 0.02,
200x PROB_TOL. Measured: 0.053 (Gemma 3 layer 5, global, base 1e6) to 0.95 (Qwen2.5 layer 0). `-s` prints them.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lab.engine.engine import Engine
from lab.engine.session import Session
from lab.format import gguf
from lab.instruments.probes import Probes
from lab.settings import Settings
from lab.text.tokenizer import from_metadata

PROB_TOL = 1e-4
WRONG_MIN = 0.02         # the wrong pairing's largest |dp| over a layer's heads must pass this (see above)
N_CTX = 128
PROMPT = "The quick brown fox jumps over the lazy dog because"

# (model fixture, its pairing, layers checked, every head of each): layer 0 and a later one (the probe's cost grows
# with the layer: a prefill of the positions through the layers up to it); Gemma 3's layer 5 is global (RoPE base
# 1e6), its layer 0 sliding (base 10000).
CASES = {
    "smollm2_path": ("adjacent", [0, 5]),
    "gemma_path": ("neox", [0, 5]),
    "qwen_path": ("neox", [0, 3]),
}


def run(coro):
    return asyncio.run(coro)


def rotate(x: np.ndarray, pos: np.ndarray, r, neox: bool) -> np.ndarray:
    """RoPE of rows x [n, d] at positions pos [n], in float64: pair i turns by pos * scale * base^(-2i/n_rot)
    (divided by llama 3's factor_i where the file has rope_freqs)."""
    n_rot, half = r.n_rot, r.n_rot // 2
    theta = pos[:, None] * r.freq_scale * r.freq_base ** (-2.0 * np.arange(half) / n_rot)
    if r.factors is not None:
        theta = theta / np.asarray(r.factors, np.float64)
    a, b = (np.arange(half), np.arange(half) + half) if neox else (2 * np.arange(half), 2 * np.arange(half) + 1)
    out = x.astype(np.float64).copy()
    c, s = np.cos(theta), np.sin(theta)
    out[:, a] = x[:, a] * c - x[:, b] * s
    out[:, b] = x[:, a] * s + x[:, b] * c
    return out


def scores(r, head: int, neox: bool) -> np.ndarray:
    """softmax over keys 0 .. pos of scale * q.k for one head (soft-capped, sliding window as the engine masks)."""
    d, g = r.head_dim, head // (r.n_head // r.n_head_kv)
    q = np.frombuffer(r.q, np.float32).reshape(r.n_head, d)[head:head + 1]
    k = np.frombuffer(r.k, np.float32).reshape(r.pos + 1, r.n_head_kv, d)[:, g]
    qr = rotate(q, np.array([r.pos], np.float64), r, neox)[0]
    kr = rotate(k, np.arange(r.pos + 1, dtype=np.float64), r, neox)
    s = r.scale * (kr @ qr)
    if r.softcap:
        s = r.softcap * np.tanh(s / r.softcap)
    if r.window:
        s[: max(0, r.pos + 1 - r.window)] = -np.inf
    e = np.exp(s - s.max())
    return e / e.sum()


# SmolLM2 (adjacent pairs) in the default run; the NeoX-paired models (several minutes each on lavapipe) with --slow.
@pytest.fixture(scope="module", params=[pytest.param(c, marks=() if c == "smollm2_path" else pytest.mark.slow)
                                        for c in CASES])
def chat(request, device):
    """A model, a greedy chat of 4 tokens (the last one never fed back: the cache lacks it), and its probes."""
    path = request.getfixturevalue(request.param)
    header = gguf.read_file(path)
    eng = Engine(device, header, n_ctx=N_CTX)
    eng.weights.upload_file(path)
    tok = from_metadata(header.metadata)
    session = Session(eng, tok)
    prompt = tok.encode(PROMPT)
    out = run(session.generate(prompt, Settings(greedy=True), 4))
    probe = Probes(eng)
    yield request.param, eng, probe, prompt + out.ids, len(session.cached)
    probe.close()
    eng.close()


def test_pairing_matches_the_engine(chat):
    name, eng, probe, ids, held = chat
    pairing, layers = CASES[name]
    assert eng.cfg.rope_neox == (pairing == "neox")
    rows = 4 * held * eng.cfg.kv_dim
    kv = [eng.device.read_sync(b, 0, rows) for pair in eng.kv_buffers for b in pair]
    n = len(ids)
    for layer in layers:
        for pos in (n - 1, n // 2):           # the uncached last token (written first), and a cached position > 0
            r = run(probe.rope_inputs(ids, held, pos, layer))
            engine_p = np.frombuffer(r.probs, np.float32).reshape(r.n_head, pos + 1)
            np.testing.assert_allclose(engine_p.sum(1), 1, atol=1e-5)
            right = [np.abs(scores(r, h, r.neox) - engine_p[h]).max() for h in range(r.n_head)]
            wrong = [np.abs(scores(r, h, not r.neox) - engine_p[h]).max() for h in range(r.n_head)]
            print(f"{name} layer {layer} pos {pos} base {r.freq_base:g}: right pairing <= {max(right):.1e}, "
                  f"wrong pairing {min(wrong):.3f} .. {max(wrong):.3f} over heads, {r.ms} ms")
            assert max(right) < PROB_TOL, (layer, pos, right)
            assert max(wrong) > WRONG_MIN, (layer, pos, wrong)
    # the chat's K/V rows are untouched (only positions the cache lacked were written)
    assert [eng.device.read_sync(b, 0, rows) for pair in eng.kv_buffers for b in pair] == kv


def test_probe_rows_are_the_attention_panels_rows(chat):
    """The probabilities the demo compares against are the attention panel's own (Probes.inspect) for that query."""
    name, eng, probe, ids, held = chat
    if name == "qwen_path":
        pytest.skip("the same code as for the other two models; Qwen2.5's full inspection pass costs minutes here")
    layer = CASES[name][1][0]
    n = len(ids)
    r = run(probe.rope_inputs(ids, held, n - 1, layer))
    w = min(n, probe.window)
    a = run(probe.inspect(ids, held, n - w, n, residual=False))
    att = np.frombuffer(a.attention, np.float32).reshape(eng.cfg.n_layer, eng.cfg.n_head, w, w + 1)[layer, :, w - 1]
    p = np.frombuffer(r.probs, np.float32).reshape(r.n_head, n)
    np.testing.assert_allclose(att[:, 1:], p[:, n - w:], atol=1e-6)
    np.testing.assert_allclose(att[:, 0], p[:, : n - w].sum(1), atol=1e-6)


def test_requests_are_checked(chat):
    _, eng, probe, ids, held = chat
    with pytest.raises(ValueError, match="position"):
        run(probe.rope_inputs(ids, held, len(ids), 0))
    with pytest.raises(ValueError, match="layer"):
        run(probe.rope_inputs(ids, held, 1, eng.cfg.n_layer))
