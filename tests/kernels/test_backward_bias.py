"""A bias's gradient (lab.ops.backward_matmul bias_back: db += dy^T 1 on wgsl/backward_gemm.wgsl, the ones read from
one float at stride 0; full fine-tuning's Q/K/V biases) against the float64 oracle (lab/host/reference/grads.py
bias_grad): the columns of a fused row (an offset and a stride wider than the bias: NaN in the other columns and in
the rows past the step, which no sum may read), widths and token counts that fill no 8 x 8 tile or 16-lane split
evenly, into a gradient already holding an earlier window's sum; bit-exact against numpy's float32 sum in token order
on the one-invocation-an-output kernel (the order is the promise); the page's case natively; then broken variants the
same check must catch.

Error per element against |db0| + sum |dy| (the sum of the terms' magnitudes), tolerance grads.gemm_tol(t): a
product by 1 (exact), t - 1 adds, the scale 1, the add onto db0, with one rounding of margin.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, run, upload, within  # noqa: F401  (env1: fixture)

from lab.host.reference import kernel_cases
from lab.host.reference.grads import U32, bias_grad, gemm_tol
from lab.host.reference.kernels import f32
from lab.instruments import kernelcheck
from lab.ops.backward_matmul import bias_back

SPARE = 2   # rows of NaN past the step in dy's buffer


def _run(env: Env, db0: np.ndarray, rows: np.ndarray, t: int, offset: int, kind: str) -> np.ndarray:
    """db after one bias_back over the first t of `rows` (dy's whole buffer, the bias's columns from `offset`)."""
    dev = env.device
    dbb, dyb, one = upload(dev, db0, "db"), upload(dev, rows, "dy"), upload(dev, f32(np.ones(1)), "one")
    run(env, bias_back(dev, env.kernels, dbb, one, dyb, ops_step(env), width=db0.size, max_tokens=rows.shape[0],
                       dy_offset=offset, dy_stride=rows.shape[1], kind=kind), 0, t)
    got = read(dev, dbb)
    free(dev, dbb, dyb, one)
    return got


def _inputs(width: int, stride: int, offset: int, t: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(db0 [width], dy's buffer [t + SPARE, stride]: NaN outside the bias's columns and past the step, dy [t, width])."""
    rng = np.random.default_rng(seed)
    dy = f32(rng.standard_normal((t, width)) * rng.uniform(0.5, 4.0, (t, 1)))
    rows = np.full((t + SPARE, stride), np.nan, np.float32)
    rows[:t, offset:offset + width] = dy
    return f32(rng.standard_normal(width) * 3.0), rows, dy


def check_bias_back(env: Env, width: int, stride: int, offset: int, t: int, seed: int = 0,
                    kind: str = "gemm") -> float:
    """The error in units of 2^-24; AssertionError past gemm_tol(t) (or a non-finite value: a NaN column or row
    read)."""
    db0, rows, dy = _inputs(width, stride, offset, t, seed)
    got = _run(env, db0, rows, t, offset, kind)
    scale = np.abs(db0) + np.abs(dy).astype(np.float64).sum(axis=0)
    return within(f"bias_back width={width} of {stride} at {offset} t={t} kind={kind}", got, db0 + bias_grad(dy),
                  scale, gemm_tol(t), "its terms' magnitudes")


@pytest.mark.parametrize("kind", ["gemm", "split"])
@pytest.mark.parametrize("width,stride,offset,t", [
    (37, 37, 0, 1),         # one token; compact rows narrower than a tile
    (131, 200, 5, 13),      # a fused row's middle columns
    (200, 237, 37, 37),     # 37 tokens: the split's 16 lanes hold 3 or 2 each
    (384, 384, 0, 70),      # qwen2's synthetic fused row: q 256 | k 64 | v 64
])
def test_bias_back(env1, width, stride, offset, t, kind):  # noqa: F811
    e = check_bias_back(env1, width, stride, offset, t, seed=width + t, kind=kind)
    print(f"bias_back {width} of {stride} t={t} kind={kind}: {e:.2f} u (tolerance {gemm_tol(t) / U32:.0f} u)")


def test_token_order_bit_exact(env1):  # noqa: F811
    """gemm: each sum is float32 adds in token order from 0, then the add onto db0, as numpy's float32 does them."""
    db0, rows, dy = _inputs(131, 200, 5, 13, seed=3)
    s = np.zeros(131, np.float32)
    for row in dy:
        s = s + row
    assert np.array_equal(_run(env1, db0, rows, 13, 5, "gemm"), db0 + s)


def test_the_pages_case_natively(device, kernels):
    """make_backward_cases' bias_back case through lab/instruments/kernelcheck.py, as the page runs it."""
    case = next(c for c in kernel_cases.make_backward_cases() if c.spec["op"] == "bias_back")
    err, tol = case.check(asyncio.run(kernelcheck.run(device, kernels, case.spec))["outputs"])
    print(f"{case.name}: {err:.3g} (tolerance {tol:.3g})")
    assert err <= tol


# Broken variants of the GEMM as bias_back runs it: each must fail the check above.
@pytest.mark.parametrize("old,new", [
    ("for (var k = 0u; k < kn; k++)", "for (var k = 0u; k + 1u < kn; k++)"),   # the step's last token dropped
    ("if (p.acc != 0u) { v += C[o]; }", ""),                                    # the earlier window's sum lost
    ("(p.tok & b) != 0u", "(p.tok & b) > 7u"),                                  # every row of the buffer summed
    ("i * p.a_si + k * p.a_sk", "i * p.a_sk + k * p.a_si"),                     # the wrong rows and columns summed
])
def test_broken_variants_fail(env1, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_bias_back(patched(env1, "backward_gemm", old, new), 131, 200, 5, 13, seed=5)
