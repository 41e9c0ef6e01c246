"""The intervention op (wgsl/intervene.wgsl via lab/ops/intervene.py) against numpy on random inputs: each op on a
block of columns and a range of positions of a step that starts past position 0, everything else untouched; and broken
variants that must fail. Exact: a zero, a copy, one f32 add or multiply per element, the same rounding in numpy."""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, upload  # noqa: F401

from lab import gpu
from lab.ops import step_bytes
from lab.ops.intervene import LOAD, OPS, PARAMS, intervene

STRIDE, T, POS = 200, 7, 5


def _check(e: Env, op: str) -> None:
    rng = np.random.default_rng(LOAD if op == "load" else OPS[op])
    dev = e.device
    x = rng.standard_normal((T, STRIDE)).astype(np.float32)
    c0, c1, r0, r1 = 64, 128, POS + 2, POS + 5          # columns of one 64-wide head, positions 7..9 (rows 2..4)
    slot_off = 3 * 80                                    # values of slot 3 in a table of 80-wide slots
    vals = rng.standard_normal(16 * 80).astype(np.float32)
    xb, vb = upload(dev, x, "test.x"), upload(dev, vals, "test.vals")
    code = LOAD if op == "load" else OPS[op]
    p = dev.uniform(PARAMS.pack(STRIDE, c0, c1, r0, r1, code, slot_off, -1.5), "test.p", kind=gpu.CONVERSATION)
    step = ops_step(e)
    o = intervene(dev, e.kernels, xb, vb, step, p, STRIDE, "test.intervene")
    dev.run([o.at(T)], writes=[(step, 0, step_bytes(POS, T, 64))])
    got = read(dev, xb).reshape(T, STRIDE)
    free(dev, xb, vb, p)
    want = x.copy()
    block = want[r0 - POS:r1 - POS, c0:c1]
    v = vals[slot_off:slot_off + (c1 - c0)]
    table = vals[slot_off:slot_off + (r1 - r0 + POS + 2) * (c1 - c0)].reshape(-1, c1 - c0)   # a row per position
    want[r0 - POS:r1 - POS, c0:c1] = {"zero": 0 * block, "set": np.broadcast_to(v, block.shape), "add": block + v,
                                      "scale": block * np.float32(-1.5), "load": table[r0:r1]}[op]
    assert np.array_equal(got, want), f"{op}: {np.argwhere(got != want)[:5].tolist()}"


@pytest.mark.parametrize("op", [*OPS, "load"])
def test_intervene(env1, op):  # noqa: F811
    _check(env1, op)


TRAPS = {
    "positions from the step's start": ("let q = step.pos + j;", "let q = j;"),
    "last column included": ("c >= p.c1", "c > p.c1"),
    "values not offset by the block": ("vals[p.vec + c - p.c0]", "vals[p.vec + c]"),
    "a load's row by the step's row, not the position": ("vals[p.vec + q * (p.c1 - p.c0)", "vals[p.vec + j * (p.c1 - p.c0)"),
}


@pytest.mark.parametrize("name", list(TRAPS))
def test_intervene_trap(env1, name):  # noqa: F811
    with pytest.raises(AssertionError):
        for op in ("set", "add", "load"):
            _check(patched(env1, "intervene", *TRAPS[name]), op)
