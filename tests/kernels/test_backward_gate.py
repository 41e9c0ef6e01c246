"""qwen35's attention output gate backward (wgsl/backward_elementwise.wgsl gate_back via
lab.ops.backward.sigmoid_gate_back) against the float64 oracle (lab/host/reference/grads.py sigmoid_gate_grad, held
to central differences in test_backward_oracle.py): the gate read from its slice of a fused row, rows past the step NaN
in the inputs and a sentinel in the gate's gradient row (only the gate's slice of the step's rows may be written),
widths that fill no workgroup; then broken variants the same check must catch. Errors per element against the
value's own magnitude, in units of 2^-24; the tolerance GATE_BACK_TOL (grads.py says why)."""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, run, upload, within  # noqa: F401  (env1: fixture)

from lab.host.reference.grads import GATE_BACK_TOL, sigmoid_gate_grad
from lab.ops.backward import sigmoid_gate_back

SENTINEL = 7.0


def check_gate_back(env: Env, t: int, n: int, stride: int, offset: int, seed: int = 0) -> tuple[float, float]:
    """(dx error, dg error) in units of 2^-24; AssertionError past the tolerance, at a non-finite value, or at a
    float of the gradient row written outside the gate's slice of the step's rows."""
    rng = np.random.default_rng(seed)
    dev, rows = env.device, t + 1
    x, dy = (np.full((rows, n), np.nan, np.float32) for _ in range(2))
    x[:t], dy[:t] = rng.standard_normal((t, n)) * 2.0, rng.standard_normal((t, n))
    gate = np.full((rows, stride), np.nan, np.float32)
    gate[:t] = rng.standard_normal((t, stride)) * 3.0      # |g| up to ~10: s(g) near 1 and near 0
    xb, gb, gateb = upload(dev, x, "x"), upload(dev, dy, "dy"), upload(dev, gate, "gate")
    dgb = upload(dev, np.full((rows, stride), SENTINEL, np.float32), "dgate")
    run(env, sigmoid_gate_back(dev, env.kernels, gb, xb, gateb, dgb, ops_step(env), n, stride, offset), 0, t)
    got_dx, got_dg = read(dev, gb).reshape(rows, n), read(dev, dgb).reshape(rows, stride)
    free(dev, xb, gb, gateb, dgb)
    g = gate[:t, offset:offset + n]
    want = sigmoid_gate_grad(x[:t], g, dy[:t])
    scale = sigmoid_gate_grad(x[:t], g, dy[:t], magnitudes=True)
    what = f"gate_back t={t} n={n} stride={stride} offset={offset}"
    e_dx = within(f"{what} dx", got_dx[:t], want[0], scale[0], GATE_BACK_TOL, "its magnitude")
    e_dg = within(f"{what} dg", got_dg[:t, offset:offset + n], want[1], scale[1], GATE_BACK_TOL, "its magnitude")
    outside = np.ones((rows, stride), bool)
    outside[:t, offset:offset + n] = False
    if not np.all(got_dg[outside] == SENTINEL):
        raise AssertionError(f"{what}: wrote outside the gate's slice of the step's rows")
    return e_dx, e_dg


@pytest.mark.parametrize("t,n,stride,offset", [(1, 67, 200, 100), (5, 256, 768, 512), (13, 130, 130, 0)])
def test_gate_back(env1, t, n, stride, offset):  # noqa: F811
    e_dx, e_dg = check_gate_back(env1, t, n, stride, offset, seed=t * 100 + n)
    print(f"gate_back t={t} n={n}: dx {e_dx:.2f}, dg {e_dg:.2f} units of 2^-24 "
          f"(tolerance {GATE_BACK_TOL * 2 ** 24:.0f})")


def test_arguments(env1):  # noqa: F811
    dev = env1.device
    b = [upload(dev, np.zeros(64, np.float32)) for _ in range(4)]
    try:
        with pytest.raises(ValueError, match="fit"):
            sigmoid_gate_back(dev, env1.kernels, b[0], b[1], b[2], b[3], ops_step(env1), 8, 10, 4)
        with pytest.raises(ValueError, match="own"):
            sigmoid_gate_back(dev, env1.kernels, b[0], b[1], b[2], b[0], ops_step(env1), 8, 16, 8)
    finally:
        free(dev, *b)


# Broken variants: each must fail the check that the real kernel passes above.
@pytest.mark.parametrize("what,old,new", [
    ("dg without s(-g)", "dgate[at] = d * s[i] * sp * sm;", "dgate[at] = d * s[i] * sp;"),
    ("dx left ungated", "dy[i] = d * sp;", "dy[i] = d;"),
    ("the gate read from the row's start", "let at = j * pg.stride + pg.offset + i % pg.n;",
     "let at = j * pg.stride + i % pg.n;"),
])
def test_broken_variants_fail(env1, what, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite|outside"):
        check_gate_back(patched(env1, "backward_elementwise", old, new), 5, 256, 768, 512, seed=3)
