"""The pick op (wgsl/pick.wgsl via lab/ops/pick.py) against numpy on random logits: the row's log-normaliser and the
picked logits land in the asked slot of the results table, the row read from its offset, non-finite logits skipped,
nothing else in the table touched; and broken variants that must fail.

Tolerance: the normaliser is an f32 tree sum of exp(x - max) over the row against float64 here: 1e-6 relative (a sum
of n positive terms in f32 is within n * 2^-24 relative, ~3e-3 for n = 50,000 in the worst case; a random row's
rounding errors cancel to ~1e-7). The picked logits are copies: exact."""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env1, free, patched, read, upload  # noqa: F401

from lab import gpu
from lab.ops.pick import PARAMS, pick

LSE_TOL = 1e-6


def _check(e: Env, n: int = 50_000, row: int = 3, slot: int = 2) -> None:
    rng = np.random.default_rng(n)
    dev = e.device
    logits = (rng.standard_normal(row + n + 5) * 4).astype(np.float32)
    logits[row + 17], logits[row + 401] = np.inf, np.nan        # skipped, as the sampler skips them
    ids = np.array([5, n - 1, 0], np.uint32)
    out0 = np.full(4 * 5, 7.0, np.float32)                       # 4 slots of [lse, 3 picked, one spare]
    lb, ib, ob = upload(dev, logits, "test.logits"), upload(dev, ids, "test.ids"), upload(dev, out0, "test.out")
    p = dev.uniform(PARAMS.pack(n, row, len(ids), slot * 5), "test.p", kind=gpu.CONVERSATION)
    dev.run([pick(dev, e.kernels, lb, ib, ob, p, "test.pick").at(1)])
    got = read(dev, ob)
    free(dev, lb, ib, ob, p)
    x = logits[row:row + n].astype(np.float64)
    x = x[np.isfinite(x)]
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    want = out0.copy()
    want[slot * 5] = np.float32(lse)
    want[slot * 5 + 1:slot * 5 + 4] = logits[row + ids.astype(np.int64)]
    assert abs(got[slot * 5] - lse) <= LSE_TOL * abs(lse), (got[slot * 5], lse)
    got[slot * 5] = want[slot * 5]
    assert np.array_equal(got, want), np.argwhere(got != want)[:5].tolist()


@pytest.mark.parametrize("n", [403, 4097, 50_000])
def test_pick(env1, n):  # noqa: F811
    _check(env1, n=n)


TRAPS = {
    "non-finite logits summed": ("if (finite(x)) { acc += exp(x - top); }", "acc += exp(x - top);"),
    "the row's offset ignored": ("out[p.out + 1u + k] = logits[p.row + ids[k]];",
                                 "out[p.out + 1u + k] = logits[ids[k]];"),
    "the maximum not shifted out": ("out[p.out] = top + log(red[0]);", "out[p.out] = log(red[0]);"),
    "a stride that skips logits": ("for (var i = lid; i < p.n; i += WG) {\n        let x = logits[p.row + i];\n"
                                   "        if (finite(x)) { acc",
                                   "for (var i = lid; i < p.n; i += 2u * WG) {\n        let x = logits[p.row + i];\n"
                                   "        if (finite(x)) { acc"),
}


@pytest.mark.parametrize("name", list(TRAPS))
def test_pick_trap(env1, name):  # noqa: F811
    with pytest.raises(AssertionError):
        _check(patched(env1, "pick", *TRAPS[name]))
