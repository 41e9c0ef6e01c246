"""Soft-cap backward (wgsl/backward_elementwise.wgsl via lab.ops.backward.softcap_back) against the float64 oracle
(lab/host/reference/grads.py): from a saved copy of x, and from the capped values the forward (softcap_to) leaves in
place, over the step's rows or a fixed count of rows; then broken variants the same check must catch."""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, assert_close, env1, free, ops_step, patched, read, run, upload  # noqa: F401  (env1: fixture)

from lab.host.reference.grads import SOFTCAP_BACK_TOL, softcap_grad
from lab.host.reference.kernels import f32, rel_err
from lab.ops import elementwise
from lab.ops.backward import softcap_back

CAP = 3.0


def check_softcap_back(env: Env, t: int, n: int, rows: int = 0, saved_is: str = "x", seed: int = 0) -> float:
    """dy *= 1 - tanh(x / CAP)^2 over the first `rows` rows (0: the step's t) of t + 1; saved_is "y" runs the real
    forward in place on x first and hands the backward its output. Returns the error; raises AssertionError past
    the tolerance or when a row past the op's count changed."""
    rng = np.random.default_rng(seed)
    dev, n_rows, done = env.device, t + 1, rows or t
    x = f32(rng.standard_normal((n_rows, n)) * 8.0)       # from linear to saturated (|x / CAP| past 15 at the tail)
    x[0, :4] = [1e30, -1e30, 0.0, 1e-3]                    # huge arguments: the forward clamps, the gradient is 0
    dy = f32(rng.standard_normal((n_rows, n)))
    sb, gb = upload(dev, x), upload(dev, dy)
    ops = elementwise.softcap(dev, env.kernels, sb, ops_step(env), n, CAP, rows=rows) if saved_is == "y" else []
    run(env, ops + softcap_back(dev, env.kernels, gb, sb, ops_step(env), n, CAP, rows=rows, saved_is=saved_is), 0, t)
    got = read(dev, gb).reshape(n_rows, n)
    free(dev, sb, gb)
    want = softcap_grad(x[:done], dy[:done], CAP)
    assert_close(got[:done], want, SOFTCAP_BACK_TOL[saved_is], f"softcap_back from {saved_is} t={t} n={n} rows={rows}")
    if not np.array_equal(got[done:], dy[done:]):
        raise AssertionError("softcap_back changed rows past its count")
    return rel_err(got[:done], want)


@pytest.mark.parametrize("saved_is", ["x", "y"])
@pytest.mark.parametrize("t,n,rows", [(1, 67, 0), (3, 257, 0), (13, 1000, 0), (5, 1000, 1)])
def test_softcap_back(env1, saved_is, t, n, rows):  # noqa: F811
    e = check_softcap_back(env1, t, n, rows, saved_is, seed=t * 1000 + n)
    print(f"softcap_back from {saved_is} t={t} n={n} rows={rows}: {e:.2e}")


def test_arguments(env1):  # noqa: F811
    b = upload(env1.device, np.zeros(8, np.float32))
    for kw in ({"cap": 0.0}, {"saved_is": "z"}):
        with pytest.raises(ValueError):
            softcap_back(env1.device, env1.kernels, b, upload(env1.device, np.zeros(8, np.float32)), None, 8,
                         **{"cap": CAP, **kw})
    with pytest.raises(ValueError):
        softcap_back(env1.device, env1.kernels, b, b, None, 8, CAP)
    free(env1.device, b)


# Broken variants: each must fail the check that the real kernel passes above.
@pytest.mark.parametrize("saved_is,old,new", [
    ("x", "(4.0 * e / ((1.0 + e) * (1.0 + e)))", "(2.0 * e / (1.0 + e))"),   # 1 - tanh for 1 - tanh^2
    ("x", "abs(s[i] / p.cap)", "abs(s[i])"),                                  # the cap left out of the argument
    ("y", "((1.0 - th) * (1.0 + th))", "(1.0 - th * th * th)"),               # a wrong power of the saved tanh
    ("y", "let th = s[i] / p.cap;", "let th = s[i];"),                        # y taken for tanh, not y / cap
])
def test_broken_variants_fail(env1, saved_is, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_softcap_back(patched(env1, "backward_elementwise", old, new), 3, 257, 0, saved_is, seed=3257)
