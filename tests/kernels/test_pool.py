"""The retrieval index's kernels (wgsl/retrieval.wgsl through lab/ops/pool.py) against numpy on random inputs, and
broken variants that must fail.

pool: row `slot` = normalise(sum of the step's rows from position `first` on [+ the row, with ADD]). The sum runs over
at most a few hundred f32 rows in a fixed order and the norm over n_embd squares: float32 rounding, ~1e-6 of the
row's magnitude. POOL_TOL = 1e-5 of it; a skipped row, a BOS pooled, a lost ADD or no normalisation move the row by
far more (1e-2 and up: one row of 16 is 6% of the sum; a missing normalisation leaves a norm of ~4, not 1).
score: dot products of n_embd f32 products, ~n_embd ulps at worst against float64: SCORE_TOL = 1e-5 of the scores'
magnitude (unit vectors: cosines of order 0.1-1).
"""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env, env1, free, ops_step, patched, read, upload  # noqa: F401  (env: both reduction paths)

from lab import gpu
from lab.ops import step_bytes
from lab.ops.pool import ADD, NEG_INF, NORMALIZE, POOL, SCORES, pool, score

POOL_TOL = 1e-5
SCORE_TOL = 1e-5


def _pool_ref(rows: np.ndarray, first: int, pos: int, prev: np.ndarray | None, normalize: bool) -> np.ndarray:
    s = rows[max(0, first - pos):].astype(np.float64).sum(axis=0)
    if prev is not None:
        s = s + prev
    return s / np.linalg.norm(s) if normalize else s


def _run_pool(e: Env, table: gpu.Buffer, xn: np.ndarray, pos: int, first: int, slot: int, flags: int, E: int):
    dev = e.device
    step = ops_step(e)
    x = upload(dev, xn, "test.xn")
    p = dev.uniform(POOL.pack(E, first, slot, flags), "test.pool", kind=gpu.CONVERSATION)
    op = pool(dev, e.kernels, x, table, step, p, "test.pool")
    t = len(xn)
    dev.run([op.at(t)], writes=[(step, 0, step_bytes(pos, t, 4096))])
    free(dev, x, p)


def _check_pool(e: Env, E: int = 576) -> None:
    """Three windows into a 4-row table: one step from position 0; one behind a BOS (first = 1); one in two steps
    (the second at pos 12 adds, then normalises). Row 3 is never written and must stay as it was."""
    rng = np.random.default_rng(E)
    dev = e.device
    init = rng.standard_normal((4, E)).astype(np.float32)
    table = upload(dev, init, "test.table")
    a = rng.standard_normal((9, E)).astype(np.float32) * 3
    b = rng.standard_normal((7, E)).astype(np.float32)
    c1 = rng.standard_normal((12, E)).astype(np.float32) + 0.5
    c2 = rng.standard_normal((5, E)).astype(np.float32) - 0.5
    _run_pool(e, table, a, 0, 0, 0, NORMALIZE, E)
    _run_pool(e, table, b, 0, 1, 1, NORMALIZE, E)
    _run_pool(e, table, c1, 0, 0, 2, 0, E)
    _run_pool(e, table, c2, 12, 0, 2, ADD | NORMALIZE, E)
    got = read(dev, table).reshape(4, E)
    free(dev, table)
    want = [_pool_ref(a, 0, 0, None, True), _pool_ref(b, 1, 0, None, True),
            _pool_ref(np.concatenate([c1, c2]), 0, 0, None, True)]
    for r, w in enumerate(want):
        err = np.abs(got[r] - w).max() / np.abs(w).max()
        assert err <= POOL_TOL, f"pool row {r}: error {err:.3g} of its magnitude"
    assert np.array_equal(got[3], init[3]), "pool wrote a row it was not given"


@pytest.mark.parametrize("E", [576, 100])        # a multiple of the workgroup, and not
def test_pool(env, E):  # noqa: F811
    _check_pool(env, E)


def _check_score(e: Env, n: int = 300, E: int = 96, q: int = 5, ready: int | None = None) -> None:
    rng = np.random.default_rng(n + q)
    dev = e.device
    ready = n if ready is None else ready
    tab = rng.standard_normal((n, E))
    tab /= np.linalg.norm(tab, axis=1, keepdims=True)
    qs = rng.standard_normal((q + 2, E))
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    tab, qs = tab.astype(np.float32), qs.astype(np.float32)
    sentinel = np.full((q + 2, n), 7.0, np.float32)
    t_buf, q_buf, s_buf = upload(dev, tab, "test.table"), upload(dev, qs, "test.queries"), upload(dev, sentinel)
    p = dev.uniform(SCORES.pack(n, E, ready, NEG_INF), "test.scores", kind=gpu.CONVERSATION)
    step = ops_step(e)
    op = score(dev, e.kernels, t_buf, q_buf, s_buf, step, p, n, "test.score")
    dev.run([op.at(q)], writes=[(step, 0, step_bytes(0, q, 4096))])
    got = read(dev, s_buf).reshape(q + 2, n)
    free(dev, t_buf, q_buf, s_buf, p)
    want = qs[:q].astype(np.float64) @ tab.astype(np.float64).T
    err = np.abs(got[:q, :ready] - want[:, :ready]).max() / np.abs(want).max()
    assert err <= SCORE_TOL, f"scores: error {err:.3g} of their magnitude"
    assert np.all(got[:q, ready:] == -np.inf), "rows past `ready` must score -inf (never picked)"
    assert np.all(got[q:] == 7.0), "score wrote a query row past the step's t"


@pytest.mark.parametrize("n,ready", [(300, None), (300, 211), (1, None)])
def test_score(env1, n, ready):  # noqa: F811
    _check_score(env1, n=n, ready=ready)


# -- broken variants must fail --------------------------------------------------------------------------------
POOL_TRAPS = {
    "BOS pooled": ("j0 = p.first - step.pos;", "j0 = 0u;"),
    "ADD ignored": ("if ((p.flags & ADD) != 0u) { s = table[row + c]; }", ""),
    "not normalised": ("table[row + c] = table[row + c] * inv;", "table[row + c] = table[row + c];"),
    "last row dropped": ("j < step.n_tokens; j++) { s += xn", "j + 1u < step.n_tokens; j++) { s += xn"),
}
SCORE_TRAPS = {
    "query row ignored": ("queries[r * E + c]", "queries[c]"),
    "ready ignored": ("if (i >= ps.ready)", "if (i >= ps.n)"),
    "one column short": ("c < E; c++) { acc", "c + 1u < E; c++) { acc"),
}


@pytest.mark.parametrize("name", list(POOL_TRAPS))
def test_pool_trap(env1, name):  # noqa: F811
    with pytest.raises(AssertionError):
        _check_pool(patched(env1, "retrieval", *POOL_TRAPS[name]))


@pytest.mark.parametrize("name", list(SCORE_TRAPS))
def test_score_trap(env1, name):  # noqa: F811
    with pytest.raises(AssertionError):
        _check_score(patched(env1, "retrieval", *SCORE_TRAPS[name]), ready=211)
