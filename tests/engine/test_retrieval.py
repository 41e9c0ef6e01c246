"""lab/instruments/retrieval.py natively on lavapipe, on the small synthetic Llama 3 file (tests/conftest.py `tiny`:
SmolLM2's vocabulary; the index's arithmetic does not depend on the weights, and the real models' recall is
docs/retrieval.md's): window embeddings against the numpy reference forward, the batched path against a window embedded
alone, the GPU search against numpy's exact search (ties and a k past the index included), a stopped build, recall's
bounds, a tokenizer that adds BOS (the same file with `tokenizer.ggml.add_bos_token` set: the BOS row is not pooled),
and Forget's read-back of the index.

Tolerances. An embedding is the normalised mean of result_norm rows; the GPU forward and the numpy reference agree
within a few f32 ulps per op (docs/correctness.md), which after SmolLM2's 30 layers leaves ~1e-4 of a row's largest
element:
EMB_TOL = 2e-3 of the embedding's largest element. Pooling the wrong rows (the BOS, one token short, the next
window's) moves it by 2e-2 or more. The search's cosines are the same f32 dot products numpy recomputes in float64
from the read-back vectors: SCORE_TOL = 1e-5.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lab import gpu
from lab.format import gguf
from lab.host.reference.forward import Reference
from lab.instruments import forget
from lab.instruments.retrieval import Index, RetrievalError, windows_of
from lab.text.tokenizer import from_metadata
from tests.conftest import FIXTURES, native_engine

EMB_TOL = 2e-3
SCORE_TOL = 1e-5
TEXT = (FIXTURES / "constitution.txt").read_bytes()[:150]
WINDOW, STRIDE, BATCH = 20, 10, 16      # a window runs in two steps (16 + 4): the pooled ADD path


ADD_BOS = b"tokenizer.ggml.add_bos_token"


def _engine(device, path, n_ctx=64, batch=BATCH):
    return native_engine(device, path, n_ctx=n_ctx, max_batch=batch)


def _adding_bos(src, dst):
    """The file with its tokenizer's add_bos_token (a GGUF bool: type 7, one byte) set: same weights, a BOS first."""
    data = bytearray(src.read_bytes())
    at = data.index(ADD_BOS) + len(ADD_BOS)
    assert data[at:at + 4] == bytes([7, 0, 0, 0]) and data[at + 4] == 0
    data[at + 4] = 1
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture(scope="module")
def smol(device, tiny_path):
    eng = _engine(device, tiny_path)
    tok = from_metadata(gguf.read_file(tiny_path).metadata)
    ix = Index(eng, tok, window=WINDOW, stride=STRIDE)
    # the same text twice: identical windows, identical embeddings, so the search's ties are exercised
    ix.prepare([("a.txt", TEXT), ("b.txt", TEXT), ("empty.txt", b"")])
    built = asyncio.run(ix.build())
    yield eng, tok, ix, built
    ix.close()
    eng.close()


def _pooled_ref(ref: Reference, ids: list[int], first: int) -> np.ndarray:
    ref.reset()
    ref.forward(ids, trace=True)
    rows = ref.trace["result_norm"][first:].astype(np.float64)
    m = rows.mean(axis=0)
    return m / np.linalg.norm(m)


def _table(eng, ix) -> np.ndarray:
    return np.frombuffer(asyncio.run(ix.embeddings()), np.float32).reshape(-1, eng.cfg.n_embd)


def test_prepare_and_build(smol):
    eng, tok, ix, built = smol
    n = len(tok.encode(TEXT.decode()))
    spans = windows_of(n, WINDOW, STRIDE)
    assert ix.prepared.names == ["a.txt", "b.txt"]
    assert [r[0] for r in ix.prepared.refused] == ["empty.txt"]
    assert ix.prepared.spans == [(0, a, b) for a, b in spans] + [(1, a, b) for a, b in spans]
    assert built.done == built.windows == 2 * len(spans) and not built.stopped
    # what holds the files' ids, embeddings, scores or the index's size is CONVERSATION (Forget wipes it); the top-k's
    # plan-time shape uniform is CONSTANT
    kinds = {b.kind for b in ix.buffers if not b.uniform or b.label.startswith("retrieval.")}
    assert kinds == {gpu.CONVERSATION}, "every index buffer holds the user's text: Forget must wipe it"


def test_embeddings_match_reference(smol, tiny_path):
    """Windows 0 and the last of file a, as the numpy forward computes them from position 0."""
    eng, tok, ix, _ = smol
    table = _table(eng, ix)
    ref = Reference(tiny_path)
    assert ix.first == 0                        # SmolLM2's tokenizer adds no BOS
    n_a = sum(1 for f, _, _ in ix.prepared.spans if f == 0)
    for w in (0, n_a - 1):
        want = _pooled_ref(ref, ix.window_ids(w), 0)
        err = np.abs(table[w] - want).max() / np.abs(want).max()
        assert err <= EMB_TOL, f"window {w}: error {err:.3g} of its largest element"
    assert np.allclose(np.linalg.norm(table, axis=1), 1.0, atol=1e-5)


def test_batched_equals_alone(smol):
    """A window embedded alone, as a query, is bit-identical to its row of the index (same plan, same steps); the
    identical files' windows are identical rows."""
    eng, tok, ix, _ = smol
    table = _table(eng, ix)
    rows = np.frombuffer(asyncio.run(ix.embed_queries([ix.window_ids(1), ix.window_ids(3)])), np.float32)
    rows = rows.reshape(2, -1)
    assert np.array_equal(rows[0], table[1]) and np.array_equal(rows[1], table[3])
    half = len(table) // 2
    assert np.array_equal(table[:half], table[half:])


def test_search_matches_numpy(smol):
    """Ids identical to a stable numpy sort of -cosine (ties by the lower row: every window has a twin), scores
    within SCORE_TOL; k past the index returns all of it; k = 1 the best."""
    eng, tok, ix, _ = smol
    table = _table(eng, ix).astype(np.float64)
    questions = [tok.encode(q) for q in ("Who makes the laws?", "We the People")]
    qv = np.frombuffer(asyncio.run(ix.embed_queries(questions)), np.float32).reshape(len(questions), -1)
    got = asyncio.run(ix.search_ids(questions, 1000))
    for r, best in enumerate(got):
        s = table @ qv[r].astype(np.float64)
        order = np.lexsort((np.arange(len(s)), -np.float32(s)))
        assert [w for w, _ in best] == order.tolist()
        assert np.abs(np.array([v for _, v in best]) - s[order]).max() <= SCORE_TOL
    one = asyncio.run(ix.search(questions[0], 1))
    assert [h.window for h in one] == [got[0][0][0]] and one[0].rank == 1
    assert one[0].text == tok.decode(ix.window_ids(one[0].window)) and one[0].file == "a.txt"


def test_recall_bounds(smol):
    eng, tok, ix, _ = smol
    r = asyncio.run(ix.recall(2, seed=3))
    assert r.queries == 2 and 0.0 <= r.at1 <= r.at5 <= 1.0
    with pytest.raises(RetrievalError, match="queries"):
        asyncio.run(ix.recall(0))


def test_stopped_build_searches_what_it_has(device, tiny_path):
    """A stop after the first block leaves an index of the windows done: the rows never filled are never hits."""
    eng = _engine(device, tiny_path)
    tok = from_metadata(gguf.read_file(tiny_path).metadata)
    ix = Index(eng, tok, window=WINDOW, stride=STRIDE)
    try:
        ix.prepare([("a.txt", TEXT)])
        seen = []
        built = asyncio.run(ix.build(on_progress=lambda d, n, s: seen.append(d), should_stop=lambda: True))
        # the stop lands after the first block (one window) with the second already queued: both are kept
        assert seen == [1] and built.stopped and built.done == ix.ready == 2 < built.windows
        best = asyncio.run(ix.search_ids([tok.encode("the laws")], 10))[0]
        assert sorted(w for w, _ in best) == [0, 1]
        with pytest.raises(RetrievalError, match="built"):
            ix.prepare([("b.txt", TEXT)])
    finally:
        ix.close()
        eng.close()


def test_bos_window_matches_reference(device, tiny_path, tmp_path):
    """A tokenizer that adds BOS (as Gemma's): a window runs behind it and the BOS row is not pooled."""
    path = _adding_bos(tiny_path, tmp_path / "adds-bos.gguf")
    eng = _engine(device, path, n_ctx=32)
    tok = from_metadata(gguf.read_file(path).metadata)
    ix = Index(eng, tok, window=16, stride=16)
    try:
        ix.prepare([("a.txt", TEXT[:60])])
        asyncio.run(ix.build())
        assert ix.first == 1
        table = _table(eng, ix)
        want = _pooled_ref(Reference(path), [tok.bos_id] + ix.window_ids(0), 1)
        err = np.abs(table[0] - want).max() / np.abs(want).max()
        assert err <= EMB_TOL, f"error {err:.3g} of the largest element"
    finally:
        ix.close()
        eng.close()


def test_forget_wipes_the_index(smol):
    """Last in this module: Forget finds the index's buffers by kind, wipes them and reads them back as zeros."""
    eng, tok, ix, _ = smol
    report = asyncio.run(forget.wipe(eng.device))
    ours = [b for b in report.buffers if b.label.startswith("retrieval.")]
    assert {b.label.split(" ")[0] for b in ours} >= {"retrieval.index", "retrieval.queries", "retrieval.scores"}
    assert all(b.after == 0 for b in ours) and any(b.before > 0 for b in ours if b.label.startswith("retrieval.index"))
    assert not np.any(_table(eng, ix))


def test_an_index_refuses_questions_after_the_adapter_changed(device, tiny_path):
    """An index embeds with the model as it was (an adapter on or off): after Engine.set_lora its windows are the
    other model's, so a question is refused with the reason (and the index is not left pointing at freed plans)."""
    from lab.engine.lora import Lora, choose
    eng = _engine(device, tiny_path)
    tok = from_metadata(gguf.read_file(tiny_path).metadata)
    ix = Index(eng, tok, window=WINDOW, stride=STRIDE)
    try:
        ix.prepare([("a.txt", TEXT)])
        asyncio.run(ix.build())
        assert asyncio.run(ix.search_ids([tok.encode("the laws")], 2))
        with device.owning(eng):
            lora = Lora(device, choose({t.name: t for t in eng.header.tensors}, eng.cfg.n_layer, rank=2), 4.0,
                        eng.max_batch)
        eng.set_lora(lora)
        with pytest.raises(RetrievalError, match="index the files again"):
            asyncio.run(ix.search_ids([tok.encode("the laws")], 2))
    finally:
        ix.close()
        eng.close()
