"""The engine with an f16 KV cache (Engine(kv="f16")), natively on the real SmolLM2.

What is held, past position 0:
- the plumbing, exactly: a decode step's attention output (traced kqv_out) is the f64 oracle's over the K and V the
  f16 cache holds (read back), within tests/kernels/test_attention.py's f32 bound; the step's own K and V rows land
  in the cache within one f16 step of the traced f32 rows. A kernel given the wrong cache type, row or layer misses
  by orders of magnitude (tests/kernels/test_kv_f16.py test_f32_view_is_caught: 66 x max|V|).
- the model, loosely: the f16 cache moves SmolLM2's logits by LOGIT_TOL of their largest at most, and greedy
  decoding from a prompt gives the same ids as the f32 cache for GREEDY tokens (measured below).
- the memory: the caches are half the bytes, the budget and the memory card say so, Forget wipes them and its
  after-picture reads them as f16, the KV panel's norms kernel reads them as f16.

Tolerance LOGIT_TOL: each cached value is rounded to f16 (relative 2^-11 = 4.9e-4); the scores and the weighted V
sums carry that into every layer's attention output, and the residual stream adds them up over 30 layers. Measured on
this prompt (lavapipe): the last prompt token's logits within 4.2e-4 of the largest logit, each of the 16 greedy steps
within 6.8e-4; LOGIT_TOL = 1e-2 leaves room for another adapter's rounding of the stores and summation order, and stays
far under what a cache read as the wrong type or layer gives (the logits of another text: order 1).
"""

from __future__ import annotations

import asyncio
import math
import struct

import numpy as np
import pytest
from test_engine import gpu_trace

from lab.engine.engine import Engine, EngineError
from lab.engine.session import Session
from lab.format import gguf
from lab.host.reference import attention as oracle
from lab.instruments import forget, memory
from lab.instruments.kvview import AfterPicture, KvView, row_norms
from lab.settings import Settings
from lab.text.tokenizer import from_metadata

N_CTX = 128
PROMPT = "The capital of France is Paris. The capital of Italy is"
GREEDY = 16
LOGIT_TOL = 1e-2
EPS32 = float(np.finfo(np.float32).eps)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def engines(device, smollm2_path):
    header = gguf.read_file(smollm2_path)
    made = {}
    for kv in ("f32", "f16"):
        made[kv] = Engine(device, header, n_ctx=N_CTX, kv=kv)
        made[kv].weights.upload_file(smollm2_path)
    yield made
    for e in made.values():
        e.close()


@pytest.fixture(scope="module")
def tok(smollm2_path):
    return from_metadata(gguf.read_file(smollm2_path).metadata)


def cache(eng: Engine, il: int, w: int) -> np.ndarray:
    """Layer il's K (w 0) or V (w 1) cache as f64 [n_ctx, kvd], read back in its own type."""
    raw = eng.device.read_sync(eng.kv_buffers[il][w])
    dtype = np.float16 if eng.kv_type == "f16" else np.float32
    return np.frombuffer(raw, dtype).reshape(eng.n_ctx, -1).astype(np.float64)


def test_caches_are_f16_and_half_the_bytes(engines):
    f32, f16 = engines["f32"], engines["f16"]
    assert f16.kv_type == "f16" and f16.kv_value_bytes == 2
    for (k32, v32), (k16, v16) in zip(f32.kv_buffers, f16.kv_buffers):
        assert k16.size * 2 == k32.size and v16.size * 2 == v32.size
    assert f16.budget.total("kv") * 2 == f32.budget.total("kv")
    cfg = f16.cfg
    assert f16.budget.card(cfg)["kv_bytes_per_token"] == 2 * cfg.n_layer * cfg.kv_dim * 2
    assert f16.budget.card(cfg)["kv_type"] == "f16" and f32.budget.card(cfg)["kv_type"] == "f32"
    mem = memory.describe(f16)
    assert mem["kv"]["bytes_per_value"] == 2 and mem["kv"]["bytes_per_token"] == cfg.kv_bytes_per_token(2)
    assert mem["bytes_per_value"] == 4            # the states' values stay f32


def test_decode_attends_over_what_the_cache_holds(engines, tok):
    """A decode step past the prompt: its attention output in layers 0, 14 and 29 against the oracle over the f16
    cache's rows 0..pos as read back, and the step's K and V in cache row pos."""
    eng = engines["f16"]
    cfg = eng.cfg
    ids = tok.encode(PROMPT)
    gpu_trace(eng, ids, 0)                              # the prompt's rows, by the prefill plan
    pos = len(ids)
    tr = gpu_trace(eng, [ids[-1]], pos)                 # one decode step at pos
    hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_head_kv
    scale = cfg.attn_scale or 1.0 / math.sqrt(hd)
    for il in (0, 14, cfg.n_layer - 1):
        kc, vc = cache(eng, il, 0), cache(eng, il, 1)
        for got_row, want_row in ((kc[pos], tr[f"Kcur_rope-{il}"][0]), (vc[pos], tr[f"Vcur-{il}"][0])):
            step = np.spacing(np.abs(want_row.astype(np.float16))).astype(np.float64)
            assert np.all(np.abs(got_row - want_row) <= step), f"layer {il}: cache row {pos} is not the step's K/V"
        assert np.abs(kc[:pos]).min(axis=1).max() > 0 and not kc[pos + 1:].any()
        q = tr[f"Qcur_rope-{il}"][:, :nh * hd]
        want, _, _ = oracle.attention(q, kc[:pos + 1], vc[:pos + 1], pos, n_head=nh, n_kv_head=nkv, head_dim=hd,
                                      scale=scale)
        l1 = scale * max(float((np.abs(q[0, h * hd:(h + 1) * hd]) @ np.abs(kc[:pos + 1, (h // (nh // nkv)) * hd:
                                                                               (h // (nh // nkv) + 1) * hd]).T).max())
                         for h in range(nh))
        err = float(np.abs(tr[f"kqv_out-{il}"].astype(np.float64) - want).max() / np.abs(vc[:pos + 1]).max())
        tol = 8 * EPS32 * (l1 + 16)                     # tests/kernels/test_attention.py `tolerance`
        assert err <= tol, f"layer {il}: attention over the f16 cache off by {err:.3g} of max|V| (bound {tol:.3g})"


def test_logits_and_greedy_follow_the_f32_cache(engines, tok):
    ids = tok.encode(PROMPT)
    got = {}
    for kv, eng in engines.items():
        seq, logits = list(ids), []
        tr = gpu_trace(eng, seq, 0)
        logits.append(tr["result_output"][-1].astype(np.float64))
        for _ in range(GREEDY):
            nxt = int(np.argmax(logits[-1]))
            seq.append(nxt)
            logits.append(gpu_trace(eng, [nxt], len(seq) - 1)["result_output"][-1].astype(np.float64))
        got[kv] = (seq[len(ids):], logits)
    (ids32, l32), (ids16, l16) = got["f32"], got["f16"]
    errs = [float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(l16, l32)]
    print(f"\nf16 KV cache vs f32: logits within {errs[0]:.2e} (prompt) and {max(errs[1:]):.2e} (greedy steps) of "
          f"the largest; greedy ids {'identical' if ids16 == ids32 else 'differ'} over {GREEDY} tokens")
    first = next((i for i, (a, b) in enumerate(zip(ids16, ids32)) if a != b), GREEDY)
    # compared while the two continue the same text (after a different token the logits are another text's)
    assert max(errs[:first + 1]) <= LOGIT_TOL
    assert ids16 == ids32, f"greedy ids part at token {first}: {ids16} vs {ids32}"


def test_kv_panel_and_forget_read_f16(engines, tok, device):
    """The norms kernel and Forget's after-picture both read the f16 cache: the norms are numpy's over the f16 values,
    and after a wipe every cache reads back zero."""
    eng = engines["f16"]
    session = Session(eng, tok)
    run(session.generate(tok.encode("One two three four five"), Settings(greedy=True), 3))
    used = len(session.cached)
    view = KvView(eng)
    try:
        got = np.frombuffer(run(view.norms(0, used)), np.float32).reshape(used, eng.cfg.n_layer, 2)
    finally:
        view.close()
    want = np.stack([np.stack([np.sqrt((cache(eng, il, w)[:used] ** 2).sum(1)) for w in (0, 1)], -1)
                     for il in range(eng.cfg.n_layer)], 1)
    assert want.min() > 0
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # the after-picture's own reading of f16 bytes
    raw = eng.device.read_sync(eng.kv_buffers[3][0])
    lit = row_norms(raw, eng.cfg.kv_dim, eng.n_ctx, 2)
    assert set(range(used)) <= set(lit)             # (rows past them: the earlier tests's steps)
    assert lit[2] == pytest.approx(float(want[2, 3, 0]), rel=1e-6)
    pic = AfterPicture(eng)
    report = run(forget.wipe(device, on_after=pic))
    session.reset()
    assert report.wiped and pic.before > 0 and pic.after == 0 and pic.checked == 2 * eng.cfg.n_layer
    assert all(not any(device.read_sync(b)) for pair in eng.kv_buffers for b in pair)


def test_row_norms_reads_f16_bytes():
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((5, 8)).astype(np.float16)
    rows[1] = 0
    got = row_norms(rows.tobytes(), 8, 5, 2)
    assert sorted(got) == [0, 2, 3, 4]
    for r, x in got.items():
        assert x == pytest.approx(float(np.linalg.norm(rows[r].astype(np.float64))), rel=1e-12)
    # read as f32 the same bytes give other numbers: the value size matters
    assert row_norms(rows.tobytes(), 4, 10)[0] != pytest.approx(got[0])
    assert struct.calcsize("<e") == 2


def test_unknown_type_refused(device, smollm2_path):
    before = len(device.buffers)
    with pytest.raises(EngineError, match="one of f32, f16"):
        Engine(device, gguf.read_file(smollm2_path), n_ctx=64, kv="bf16")
    assert len(device.buffers) == before
