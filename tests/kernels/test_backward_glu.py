"""SwiGLU / GeGLU backward (wgsl/backward_glu.wgsl via lab.ops.backward.glu_back) against the float64 oracle
(lab/host/reference/grads.py) over fused [gate | up] rows, at widths and token counts that fill no workgroup evenly;
then broken variants the same check must catch."""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, assert_close, env1, free, ops_step, patched, read, run, upload  # noqa: F401  (env1: fixture)

from lab.host.reference.grads import GLU_BACK_TOL, glu_grad
from lab.host.reference.kernels import f32, rel_err
from lab.ops.backward import glu_back

SENTINEL = 7.0


def check_glu_back(env: Env, act: str, t: int, n: int, amp: float = 4.0, seed: int = 0) -> tuple[float, float]:
    """d[gate | up] for t tokens of t + 1 rows (the last must stay as it was), gates drawn at `amp` times a normal.
    Returns the (d gate, d up) errors; raises AssertionError past the tolerance."""
    rng = np.random.default_rng(seed)
    dev, n_rows = env.device, t + 1
    gu = f32(np.concatenate([rng.standard_normal((n_rows, n)) * amp, rng.standard_normal((n_rows, n)) * 2.0], 1))
    dh = f32(rng.standard_normal((n_rows, n)))
    gub, dhb, outb = upload(dev, gu), upload(dev, dh), upload(dev, np.full_like(gu, SENTINEL))
    run(env, glu_back(dev, env.kernels, gub, dhb, outb, ops_step(env), n, act), 5, t)
    got = read(dev, outb).reshape(n_rows, 2 * n)
    free(dev, gub, dhb, outb)
    want = glu_grad(gu[:t], dh[:t], act)
    what = f"{act}_back t={t} n={n} amp={amp}"
    # each half relative to its own magnitude: d up = dh act(g) grows with the gate, d gate = dh u act'(g) does not
    for half, name in ((slice(0, n), "d gate"), (slice(n, 2 * n), "d up")):
        assert_close(got[:t, half], want[:, half], GLU_BACK_TOL, f"{what} {name}")
    if not np.all(got[t:] == SENTINEL):
        raise AssertionError(f"{what}: wrote rows past the step's tokens")
    return rel_err(got[:t, :n], want[:, :n]), rel_err(got[:t, n:], want[:, n:])


@pytest.mark.parametrize("act", ["swiglu", "geglu"])
@pytest.mark.parametrize("t,n", [(1, 67), (3, 257), (13, 1000)])
def test_glu_back(env1, act, t, n):  # noqa: F811
    e_gate, e_up = check_glu_back(env1, act, t, n, seed=t * 1000 + n)
    print(f"{act}_back t={t} n={n}: d gate {e_gate:.2e} d up {e_up:.2e}")


@pytest.mark.parametrize("act", ["swiglu", "geglu"])
def test_large_gates_stay_finite(env1, act):  # noqa: F811
    # |gate| up to ~400: exp overflows in silu's sigmoids, g^3 reaches 6e7 and z is clamped in gelu
    check_glu_back(env1, act, t=3, n=257, amp=100.0, seed=11)


def test_buffers(env1):  # noqa: F811
    b = upload(env1.device, np.zeros(8, np.float32))
    with pytest.raises(ValueError):
        glu_back(env1.device, env1.kernels, b, None, b, None, 4)
    with pytest.raises(ValueError):
        glu_back(env1.device, env1.kernels, None, None, b, None, 4, act="relu")
    free(env1.device, b)


# Broken variants: each must fail the check that the real kernel passes above.
@pytest.mark.parametrize("act,old,new,amp", [
    ("swiglu", "return s * (1.0 + g * sm);", "return s;", 4.0),                 # silu' as if silu were g * const
    ("swiglu", "let sm = 1.0 / (1.0 + exp(g));", "let sm = 1.0 / (1.0 + exp(-g));", 4.0),  # s(g) for 1 - s(g)
    ("geglu", "(1.0 + 3.0 * 0.044715 * g * g)", "(1.0 + 0.044715 * g * g)", 4.0),   # dz/dg without the cubic's 3
    ("geglu", "abs(z0) < 10.0", "abs(z0) < 1.0", 4.0),                          # the clamp's cut far too early
    # the clamp ignored: at |g| ~ 400 sech^2(10) ~ 8e-9 times dz/dg ~ 2e4 is no longer ~0
    ("geglu", "select(0.0, 0.5 * g * sech2 * dz, abs(z0) < 10.0)", "0.5 * g * sech2 * dz", 100.0),
    ("swiglu", "dgu[i.x + p.n] = d * silu(g);", "dgu[i.x + p.n] = d * g;", 4.0),  # d up without the activation
])
def test_broken_variants_fail(env1, act, old, new, amp):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_glu_back(patched(env1, "backward_glu", old, new), act, t=3, n=257, amp=amp, seed=3257)
