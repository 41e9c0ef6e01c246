"""lab/instruments/kvview.py natively on the real SmolLM2's cache: the norms kernel (wgsl/kvview.wgsl) against numpy on the same
cache read back, and the after-Forget picture computed in Python from Forget's own read-back.

Tolerance: the kernel sums the squares of a row's 192 f32 values in f32, in order; numpy sums the same f32 values in
f64. The f32 sum's rounding is at most ~192 x 2^-24 relative (1.1e-5) and in practice a few 1e-7 (measured on this
cache: max 4.1e-7 relative on lavapipe, 3.5e-7 on SwiftShader natively); RTOL = 1e-5 leaves room and is orders of
magnitude under what a wrong row, layer or head would give (neighbouring rows' norms differ by percents)."""

from __future__ import annotations

import asyncio
from array import array

import numpy as np
import pytest

from lab.engine.engine import Engine
from lab.engine.session import Session
from lab.format import gguf
from lab.instruments import forget
from lab.instruments.kvview import COLS, AfterPicture, KvView, row_norms
from lab.settings import Settings
from lab.text.tokenizer import from_metadata

N_CTX = 512            # more than COLS, so a request can span two passes
RTOL = 1e-5


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def filled(device, smollm2_path):
    """An engine whose cache holds a short greedy conversation, and its KvView."""
    eng = Engine(device, gguf.read_file(smollm2_path), n_ctx=N_CTX)
    eng.weights.upload_file(smollm2_path)
    tok = from_metadata(gguf.read_file(smollm2_path).metadata)
    session = Session(eng, tok)
    prompt = tok.encode("The capital of France is Paris. The capital of Italy is")
    run(session.generate(prompt, Settings(greedy=True), 4))
    view = KvView(eng)
    yield eng, view, len(session.cached)
    view.close()
    eng.close()


def numpy_norms(eng, a: int, b: int) -> np.ndarray:
    """[b - a, n_layer, 2] from the caches read back whole, in f64: the oracle."""
    kvd = eng.cfg.n_head_kv * eng.cfg.head_dim
    out = np.zeros((b - a, eng.cfg.n_layer, 2))
    for il, pair in enumerate(eng.kv_buffers):
        for w, buf in enumerate(pair):
            rows = np.frombuffer(eng.device.read_sync(buf), np.float32).reshape(eng.n_ctx, kvd)[a:b]
            out[:, il, w] = np.sqrt((rows.astype(np.float64) ** 2).sum(axis=1))
    return out


def test_norms_match_numpy_past_position_0(filled):
    eng, view, used = filled
    assert used > 8
    a, b = 3, used
    got = np.frombuffer(run(view.norms(a, b)), np.float32).reshape(b - a, eng.cfg.n_layer, 2)
    want = numpy_norms(eng, a, b)
    assert want.min() > 0                         # every filled row holds something: a zero would hide indexing
    np.testing.assert_allclose(got, want, rtol=RTOL)
    assert len(set(np.round(want[:, 5, 0], 3))) == b - a      # rows differ: a shifted row would miss the check


def test_norms_span_two_passes_and_read_empty_rows_as_zero(filled):
    eng, view, used = filled
    a, b = used - 2, COLS + 9                     # two passes; rows past `used` were never written
    got = np.frombuffer(run(view.norms(a, b)), np.float32).reshape(b - a, eng.cfg.n_layer, 2)
    np.testing.assert_allclose(got, numpy_norms(eng, a, b), rtol=RTOL)
    assert got[2:].max() == 0 and got[:2].min() > 0
    with pytest.raises(ValueError):
        run(view.norms(0, N_CTX + 1))


def test_row_norms_from_bytes():
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((6, 12)).astype(np.float32)
    rows[[0, 3]] = 0
    rows[4, 5] = 0
    got = row_norms(rows.tobytes(), 12, 6)
    assert sorted(got) == [1, 2, 4, 5]
    for r, x in got.items():
        assert x == pytest.approx(float(np.linalg.norm(rows[r].astype(np.float64))), rel=1e-12)


def test_after_picture_blank_after_wipe_and_lit_where_skipped(device, smollm2_path):
    """Forget's read-back drawn as the panel draws it: all zero after a real wipe; with one cache left out of the
    wipe (the test hook), exactly that buffer's filled rows stay lit, with the norms numpy gives."""
    eng = Engine(device, gguf.read_file(smollm2_path), n_ctx=64)
    eng.weights.upload_file(smollm2_path)
    tok = from_metadata(gguf.read_file(smollm2_path).metadata)
    try:
        for skip in (None, eng.kv_buffers[2][1].label):
            session = Session(eng, tok)
            run(session.generate(tok.encode("One two three four five"), Settings(greedy=True), 3))
            used = len(session.cached)
            want = numpy_norms(eng, 0, eng.n_ctx)
            pic = AfterPicture(eng)
            report = run(forget.wipe(device, on_after=pic, skip=skip))
            body = pic.picture(used)
            norms = np.array(array("f", body["norms"])).reshape(body["end"], eng.cfg.n_layer, 2)
            assert pic.checked == 2 * eng.cfg.n_layer and pic.before > 0
            if skip is None:
                assert report.wiped and body["end"] == used and norms.max() == 0 and body["lit"] == []
                assert pic.after == 0
            else:
                assert not report.wiped and body["lit"] == [skip] and pic.after > 0
                lit = np.argwhere(norms > 0)
                assert set(map(tuple, lit[:, 1:])) == {(2, 1)}
                rows = lit[:, 0]
                assert set(rows) == set(np.nonzero(want[:, 2, 1])[0]) and len(rows) >= used
                np.testing.assert_allclose(norms[rows, 2, 1], want[rows, 2, 1], rtol=1e-6)
                assert body["end"] >= used and body["lit_cells"] == len(rows)
    finally:
        eng.close()
