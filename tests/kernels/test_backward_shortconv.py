"""LFM2's short-conv backward (wgsl/backward_shortconv.wgsl via lab.ops.backward_shortconv.shortconv_back) against the
float64 oracle (lab/host/reference/grads_shortconv.py shortconv_grad, itself held to central differences in
test_backward_oracle.py): windows from position 0 shorter than the conv (t = 1, 2), and longer; channel counts that
fill no workgroup of 64; l_cache 3 (every LFM2 release), 2 and 8 (the range lfm2's reader takes); rows past the step
NaN in bcx and dy (no sum may read them) and a sentinel in dbcx's (none may be written); the conv weight's gradient
added into one already holding an earlier window's sum; the page's case (lab/host/reference/kernel_cases.py) natively.
Then broken variants the same check must catch. The same kernels' silu mode (Qwen3.5's conv in front of its
delta-net: y = silu(conv(x)) over the first n floats of rows of `stride`) against grads_deltanet.conv_silu_grad, with
the row's floats past n neither read into the sums nor written, and its own broken variants.

Error per element against the sum of its terms' magnitudes (the oracle on the inputs' absolute values, plus |dw0| for
the weight), in units of 2^-24; tolerances grads_shortconv.dbcx_tol(l_cache) and dw_tol(t), each with its count of
roundings there.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, run, upload, within  # noqa: F401  (env1: fixture)

from lab import gpu
from lab.host.reference import kernel_cases
from lab.host.reference.grads_deltanet import conv_dw_tol, conv_dx_tol, conv_silu_grad
from lab.host.reference.grads_shortconv import dbcx_tol, dw_tol, shortconv_grad
from lab.host.reference.kernels import f32
from lab.instruments import kernelcheck
from lab.ops.backward_shortconv import LOOP_LIMIT, dw_iterations, shortconv_back

SPARE = 2           # rows past the step: NaN in the inputs, the sentinel in dbcx
SENTINEL = 7.0


def check_shortconv_back(env: Env, t: int, n: int, taps: int, seed: int = 0, full: bool = True) -> tuple:
    """(dbcx error, dw error) in units of 2^-24 (dw's None without `full`); AssertionError past a tolerance, at a
    non-finite value (a NaN row read) or at a row past the step written."""
    rng = np.random.default_rng(seed)
    dev, rows = env.device, t + SPARE
    bcx = np.full((rows, 3 * n), np.nan, np.float32)
    bcx[:t] = rng.standard_normal((t, 3 * n)) * rng.uniform(0.5, 3.0, (1, 3 * n))
    dy = np.full((rows, n), np.nan, np.float32)
    dy[:t] = rng.standard_normal((t, n)) * rng.uniform(0.5, 2.0, (t, 1))
    w, dw0 = f32(rng.standard_normal((n, taps))), f32(rng.standard_normal((n, taps)) * 3.0)
    bb, wb, dyb = upload(dev, bcx, "bcx"), upload(dev, w, "w"), upload(dev, dy, "dy")
    outb = upload(dev, np.full((rows, 3 * n), SENTINEL, np.float32), "dbcx")
    dwb = upload(dev, dw0, "dw") if full else None
    run(env, shortconv_back(dev, env.kernels, bb, wb, dyb, outb, dwb, ops_step(env), n=n, l_cache=taps,
                            max_tokens=rows), 0, t)
    got = read(dev, outb).reshape(rows, 3 * n)
    got_dw = read(dev, dwb).reshape(n, taps) if full else None
    free(dev, bb, wb, dyb, outb, *([dwb] if full else []))
    want, want_dw = shortconv_grad(bcx[:t], w, dy[:t])
    scale, scale_dw = shortconv_grad(np.abs(bcx[:t]), np.abs(w), np.abs(dy[:t]))
    what = f"shortconv_back t={t} n={n} l_cache={taps}"
    e = within(f"{what} dbcx", got[:t], want, scale, dbcx_tol(taps), "its terms' magnitudes")
    if not np.all(got[t:] == SENTINEL):
        raise AssertionError(f"{what}: wrote rows past the step's tokens")
    if not full:
        return e, None
    e_dw = within(f"{what} dw", got_dw, dw0 + want_dw, np.abs(dw0) + scale_dw, dw_tol(t), "its terms' magnitudes")
    return e, e_dw


@pytest.mark.parametrize("t,n,taps", [(1, 67, 3), (2, 67, 3), (13, 200, 3), (40, 130, 3), (9, 70, 2), (11, 70, 8)])
def test_shortconv_back(env1, t, n, taps):  # noqa: F811
    e, e_dw = check_shortconv_back(env1, t, n, taps, seed=t * 1000 + n + taps)
    print(f"shortconv_back t={t} n={n} l_cache={taps}: dbcx {e:.2f}, dw {e_dw:.2f} units of 2^-24 "
          f"(tolerances {dbcx_tol(taps) * 2 ** 24:.0f}, {dw_tol(t) * 2 ** 24:.0f})")


def test_without_the_weights_gradient(env1):  # noqa: F811
    """LoRA's step: dbcx alone, one op."""
    check_shortconv_back(env1, 5, 67, 3, seed=5, full=False)
    b = upload(env1.device, np.zeros(3 * 67 * 5, np.float32))
    assert len(shortconv_back(env1.device, env1.kernels, b, b, b, upload(env1.device, np.zeros(3 * 67 * 5,
                              np.float32)), None, ops_step(env1), n=67, l_cache=3, max_tokens=5)) == 1


def test_the_same_bits_every_run(env1):  # noqa: F811
    """Every sum in a fixed order: two runs of the same window give the same dbcx and dw bits."""
    rng = np.random.default_rng(9)
    dev, t, n = env1.device, 17, 67
    bb, wb = upload(dev, f32(rng.standard_normal((t, 3 * n)))), upload(dev, f32(rng.standard_normal((n, 3))))
    dyb = upload(dev, f32(rng.standard_normal((t, n))))
    out = []
    for _ in range(2):
        ob, dwb = upload(dev, np.zeros((t, 3 * n), np.float32)), upload(dev, np.zeros((n, 3), np.float32))
        run(env1, shortconv_back(dev, env1.kernels, bb, wb, dyb, ob, dwb, ops_step(env1), n=n, l_cache=3,
                                 max_tokens=t), 0, t)
        out.append((read(dev, ob).tobytes(), read(dev, dwb).tobytes()))
        free(dev, ob, dwb)
    free(dev, bb, wb, dyb)
    assert out[0] == out[1]


def test_arguments_are_checked(env1):  # noqa: F811
    dev, k, step = env1.device, env1.kernels, ops_step(env1)
    n, t = 10, 4
    big, small = upload(dev, np.zeros(3 * n * t, np.float32)), upload(dev, np.zeros(n, np.float32))
    other = upload(dev, np.zeros(3 * n * t, np.float32))
    with pytest.raises(ValueError, match="own"):
        shortconv_back(dev, k, big, big, big, big, None, step, n=n, l_cache=3, max_tokens=t)
    with pytest.raises(ValueError, match="own"):
        shortconv_back(dev, k, big, big, small, other, big, step, n=n, l_cache=3, max_tokens=t)
    with pytest.raises(ValueError, match="bcx"):
        shortconv_back(dev, k, small, big, big, other, None, step, n=n, l_cache=3, max_tokens=t)
    with pytest.raises(ValueError, match="l_cache"):
        shortconv_back(dev, k, big, big, big, other, None, step, n=n, l_cache=1, max_tokens=t)
    free(dev, big, small, other)


def test_a_window_past_the_loop_budget_is_refused(env1):  # noqa: F811
    dev = env1.device
    if not dev.info.loop_budget:
        pytest.skip(f"{dev.info.name} stops no loops")
    n, taps = 2, 3
    t = next(t for t in range(LOOP_LIMIT) if dw_iterations(t, taps) > LOOP_LIMIT)
    bufs = [upload(dev, np.zeros(3 * n * t, np.float32)) for _ in range(3)]
    w, dw = upload(dev, np.zeros(n * taps, np.float32)), upload(dev, np.zeros(n * taps, np.float32))
    try:
        shortconv_back(dev, env1.kernels, bufs[0], w, bufs[1], bufs[2], None, ops_step(env1), n=n, l_cache=taps,
                       max_tokens=t)     # dbcx alone walks no tokens
        with pytest.raises(gpu.GpuError, match="loop"):
            shortconv_back(dev, env1.kernels, bufs[0], w, bufs[1], bufs[2], dw, ops_step(env1), n=n, l_cache=taps,
                           max_tokens=t)
    finally:
        free(dev, *bufs, w, dw)


def test_the_pages_case_natively(device, kernels):
    """make_backward_cases' shortconv_back case through lab/instruments/kernelcheck.py, as the page runs it."""
    case = next(c for c in kernel_cases.make_backward_cases() if c.spec["op"] == "shortconv_back")
    err, tol = case.check(asyncio.run(kernelcheck.run(device, kernels, case.spec))["outputs"])
    print(f"{case.name}: {err:.3g} (tolerance {tol:.3g})")
    assert err <= tol


# Broken variants: each must fail the check that the real kernel passes above.
@pytest.mark.parametrize("what,old,new", [
    ("du's taps reversed", "du += w[c * LC + i] * (dy[k * n + c]", "du += w[c * LC + (LC - 1u - i)] * (dy[k * n + c]"),
    ("du one token off", "let k = j + (LC - 1u) - i;", "let k = j + LC - i;"),
    ("du reading the row past the window", "if (k < t) { du", "if (k <= t) { du"),
    ("dC from u, not the conv", "dbcx[row + n + c] = dy[j * n + c] * conv;",
     "dbcx[row + n + c] = dy[j * n + c] * bcx[row + c] * bcx[row + 2u * n + c];"),
    ("dB through B, not x", "dbcx[row + c] = du * bcx[row + 2u * n + c];", "dbcx[row + c] = du * bcx[row + c];"),
    ("the conv's first tap at the token", "if (j + i >= LC - 1u) {\n            let k = (j + i - (LC - 1u)) * width;",
     "if (j >= i) {\n            let k = (j - i) * width;"),
    ("dw written, not added", "dw[c * LC + i] += acc[i];", "dw[c * LC + i] = acc[i];"),
    ("dw without C", "let d = dy[j * n + c] * bcx[row + n + c];", "let d = dy[j * n + c];"),
    ("dw's window not shifted", "for (var i = 0u; i + 1u < LC; i++) { win[i] = win[i + 1u]; }", ""),
])
def test_broken_variants_fail(env1, what, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_shortconv_back(patched(env1, "backward_shortconv", old, new), 13, 200, 3, seed=3)


# -- the silu mode ---------------------------------------------------------------------------------------------------
def check_silu_back(env: Env, t: int, n: int, taps: int, stride: int, seed: int = 0, full: bool = True) -> tuple:
    """(dx error, dw error) in units of 2^-24 for the silu mode over rows of `stride` floats (x the first n; the rest
    NaN, as rows past the step: no sum may read them); AssertionError past a tolerance, at a non-finite value, or at
    a float written past a row's first n or past the step."""
    rng = np.random.default_rng(seed)
    dev, rows = env.device, t + SPARE
    src = np.full((rows, stride), np.nan, np.float32)
    src[:t, :n] = rng.standard_normal((t, n)) * rng.uniform(0.5, 3.0, (1, n))
    dy = np.full((rows, n), np.nan, np.float32)
    dy[:t] = rng.standard_normal((t, n)) * rng.uniform(0.5, 2.0, (t, 1))
    w, dw0 = f32(rng.standard_normal((n, taps))), f32(rng.standard_normal((n, taps)))
    sb, wb, dyb = upload(dev, src, "src"), upload(dev, w, "w"), upload(dev, dy, "dy")
    outb = upload(dev, np.full((rows, stride), SENTINEL, np.float32), "dsrc")
    dwb = upload(dev, dw0, "dw") if full else None
    run(env, shortconv_back(dev, env.kernels, sb, wb, dyb, outb, dwb, ops_step(env), n=n, l_cache=taps,
                            max_tokens=rows, mode="silu", stride=stride), 0, t)
    got = read(dev, outb).reshape(rows, stride)
    got_dw = read(dev, dwb).reshape(n, taps) if full else None
    free(dev, sb, wb, dyb, outb, *([dwb] if full else []))
    want, want_dw = conv_silu_grad(src[:t, :n], w, dy[:t])
    scale, scale_dw = conv_silu_grad(src[:t, :n], w, dy[:t], magnitudes=True)
    what = f"silu conv back t={t} n={n} l_cache={taps} stride={stride}"
    e = within(f"{what} dx", got[:t, :n], want, scale, conv_dx_tol(taps), "its terms' magnitudes")
    if not (np.all(got[t:] == SENTINEL) and np.all(got[:, n:] == SENTINEL)):
        raise AssertionError(f"{what}: wrote past the step's tokens or a row's first n floats")
    if not full:
        return e, None
    e_dw = within(f"{what} dw", got_dw, dw0 + want_dw, np.abs(dw0) + scale_dw, conv_dw_tol(t, taps),
                  "its terms' magnitudes")
    return e, e_dw


@pytest.mark.parametrize("t,n,taps,stride", [(1, 67, 4, 80), (2, 67, 4, 67), (13, 200, 4, 230), (40, 130, 3, 140),
                                             (11, 70, 8, 75)])
def test_silu_back(env1, t, n, taps, stride):  # noqa: F811
    e, e_dw = check_silu_back(env1, t, n, taps, stride, seed=t * 1000 + n + taps)
    print(f"silu conv back t={t} n={n} l_cache={taps}: dx {e:.2f}, dw {e_dw:.2f} units of 2^-24 "
          f"(tolerances {conv_dx_tol(taps) * 2 ** 24:.0f}, {conv_dw_tol(t, taps) * 2 ** 24:.0f})")


def test_silu_without_the_weights_gradient(env1):  # noqa: F811
    check_silu_back(env1, 5, 67, 4, 80, seed=5, full=False)


def test_silu_arguments_are_checked(env1):  # noqa: F811
    dev, k, step = env1.device, env1.kernels, ops_step(env1)
    b = [upload(dev, np.zeros(40, np.float32)) for _ in range(4)]
    try:
        with pytest.raises(ValueError, match="mode"):
            shortconv_back(dev, k, b[0], b[1], b[2], b[3], None, step, n=2, l_cache=3, max_tokens=4, mode="tanh")
        with pytest.raises(ValueError, match="cannot hold"):
            shortconv_back(dev, k, b[0], b[1], b[2], b[3], None, step, n=4, l_cache=3, max_tokens=2, mode="silu",
                           stride=3)
        with pytest.raises(ValueError, match="gated"):
            shortconv_back(dev, k, b[0], b[1], b[2], b[3], None, step, n=2, l_cache=3, max_tokens=2, stride=7)
    finally:
        free(dev, *b)


@pytest.mark.parametrize("what,old,new", [
    ("silu' taken as silu", "(dy[k * p.n + c] * silu_grad(silu_pre(c, k)))", "(dy[k * p.n + c] * silu(silu_pre(c, k)))"),
    ("the pre-activation at the token, not the output it feeds", "silu_grad(silu_pre(c, k))", "silu_grad(silu_pre(c, j))"),
    ("dw without silu'", "let d = dy[j * p.n + c] * silu_grad(a);", "let d = dy[j * p.n + c];"),
])
def test_silu_broken_variants_fail(env1, what, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_silu_back(patched(env1, "backward_shortconv", old, new), 13, 200, 4, 230, seed=3)
