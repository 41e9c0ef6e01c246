"""RMSNorm backward (wgsl/backward_norm.wgsl via lab.ops.backward.rms_norm_back) against the float64 oracle
(lab/host/reference/grads.py), on the subgroup and the fallback reduction path, at widths and token counts that fill
no workgroup evenly; then broken variants of the kernel that the same check must catch."""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, assert_close, env, free, ops_step, patched, read, run, upload  # noqa: F401  (env: fixture)

from lab.host.reference.grads import NORM_BACK_DW_TOL, NORM_BACK_DX_TOL, rms_norm_grad
from lab.host.reference.kernels import f32, rel_err
from lab.ops.backward import rms_norm_back

SENTINEL = 7.0


def _inputs(rng, n_rows: int, n: int, g: int):
    x = f32(rng.standard_normal((n_rows, n)) * rng.uniform(0.5, 3.0, (n_rows, 1)))
    if n_rows > 1:
        x[1] *= 1e-3          # mean square ~1e-6, below eps: where eps sits in r matters
    if n_rows > 2:
        x[2] *= 300.0         # residual streams reach hundreds
    w = f32(rng.uniform(0.2, 2.0, g))
    dy = f32(rng.standard_normal((n_rows, n)) * rng.uniform(0.5, 2.0, (n_rows, 1)))
    return x, w, dy


def check_rms_norm_back(env: Env, t: int, n: int, group: int | None = None, n_rows: int | None = None,
                        eps: float = 1e-5, seed: int = 0, accumulate: bool = False) -> tuple[float, float]:
    """Runs dx and dw for t tokens of n_rows (t + 1 by default: a row past the step must stay as it was); dw starts
    from random values (the kernel adds into it). Returns the (dx, dw) errors; raises AssertionError past the
    tolerances. accumulate: dx starts from random values the kernel must add into (a residual stream's gradient)."""
    rng = np.random.default_rng(seed)
    dev, g = env.device, n if group is None else group
    n_rows = t + 1 if n_rows is None else n_rows
    x, w, dy = _inputs(rng, n_rows, n, g)
    dx_want, dw_want = rms_norm_grad(x[:t], w, dy[:t], eps, g)
    dw0 = f32(rng.standard_normal(g) * np.max(np.abs(dw_want)))     # a sum from an earlier micro-batch
    dx0 = f32(rng.standard_normal(x.shape) * np.max(np.abs(dx_want))) if accumulate else np.zeros_like(x)
    dx0[t:] = SENTINEL
    xb, wb, dyb = upload(dev, x), upload(dev, w), upload(dev, dy)
    dxb, dwb = upload(dev, dx0 if accumulate else np.full_like(x, SENTINEL)), upload(dev, dw0)
    rsb = upload(dev, np.full(n_rows * (n // g), SENTINEL, np.float32))
    run(env, rms_norm_back(dev, env.kernels, xb, wb, dyb, dxb, dwb, rsb, ops_step(env), n, eps, group=group,
                           accumulate=accumulate), 3, t)
    dx, dw = read(dev, dxb).reshape(n_rows, n), read(dev, dwb)
    rs = read(dev, rsb)
    free(dev, xb, wb, dyb, dxb, dwb, rsb)
    what = f"rms_norm_back t={t} n={n} group={g}"
    # dx per group, relative to that group's largest gradient: the tiny row's and the large row's each held alone
    got, want = dx[:t].reshape(t, -1, g), (dx_want + dx0[:t]).reshape(t, -1, g)
    assert_close(got, want, NORM_BACK_DX_TOL, what + " dx", axis=(2,))
    assert_close(dw, dw0 + dw_want, NORM_BACK_DW_TOL, what + " dw (added to its earlier value)")
    if not (np.all(dx[t:] == SENTINEL) and np.all(rs[t * (n // g):] == SENTINEL)):
        raise AssertionError(f"{what}: wrote rows past the step's tokens")
    return rel_err(got, want, axis=(2,)), rel_err(dw, dw0 + dw_want)


@pytest.mark.parametrize("t,n,group", [
    (1, 67, None),          # one token, a width that fills no workgroup (64-wide: 3 past it)
    (3, 257, None),         # 256-wide workgroup plus one
    (13, 1000, None),       # 13 rows into dw; 1000 = 3 x 256 + 232
    (3, 6 * 72, 72),        # per head (Gemma's q/k norm width), 72 = 64 + 8
    (13, 3 * 67, 67),       # per group of an odd width: 39 (token, group) terms per dw column
])
def test_rms_norm_back(env, t, n, group):  # noqa: F811
    e_dx, e_dw = check_rms_norm_back(env, t, n, group, seed=t * 1000 + n)
    print(f"rms_norm_back {env.name} t={t} n={n} group={group}: dx {e_dx:.2e} dw {e_dw:.2e}")


def test_accumulate_adds_into_dx(env):  # noqa: F811
    check_rms_norm_back(env, t=5, n=257, seed=9, accumulate=True)
    check_rms_norm_back(env, t=3, n=6 * 72, group=72, seed=10, accumulate=True)


def test_without_dw_one_op(env):  # noqa: F811
    b = [upload(env.device, np.zeros(64, np.float32)) for _ in range(5)]
    assert len(rms_norm_back(env.device, env.kernels, b[0], b[1], b[2], b[3], None, b[4], ops_step(env), 8, 1e-5)) == 1
    free(env.device, *b)


def test_rows_past_the_step_stay(env):  # noqa: F811
    check_rms_norm_back(env, t=3, n=257, n_rows=13, seed=5)


def test_buffers_must_differ(env):  # noqa: F811
    b = upload(env.device, np.zeros(8, np.float32))
    with pytest.raises(ValueError):
        rms_norm_back(env.device, env.kernels, b, b, b, b, b, b, None, 8, 1e-5)
    with pytest.raises(ValueError):
        rms_norm_back(env.device, env.kernels, None, None, None, None, None, None, None, 100, 1e-5, group=30)
    free(env.device, b)


# Broken variants: each must fail the check that the real kernel passes above.
@pytest.mark.parametrize("old,new,t,n,group", [
    ("let c = md * r * r * r;", "let c = 0.0;", 3, 257, None),                  # dx without r's dependence on x
    ("let c = md * r * r * r;", "let c = md * r * r;", 3, 257, None),           # r^2 for r^3
    ("inverseSqrt(ms + p.eps)", "1.0 / (sqrt(ms) + p.eps)", 3, 257, None),      # eps outside the root (tiny row)
    ("* rs_in[k];", "* sign(rs_in[k]);", 13, 1000, None),                  # dw without the 1/rms factor
    ("dw[col] += s;", "dw[col] = s;", 3, 257, None),                           # dw overwritten, not accumulated
    ("g < p.n_groups; g++", "g < 1u; g++", 13, 3 * 67, 67),                    # dw over the first group only
    ("j < step.n_tokens; j++", "j + 1u < step.n_tokens; j++", 13, 1000, None),  # dw misses the last token
])
def test_broken_variants_fail(env, old, new, t, n, group):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_rms_norm_back(patched(env, "backward_norm", old, new), t, n, group, seed=t * 1000 + n)


def test_accumulate_ignored_fails(env):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_rms_norm_back(patched(env, "backward_norm", "p.acc != 0u", "false"), 5, 257, seed=9, accumulate=True)


def check_strided(env: Env, t: int, n: int, group: int, stride: int, offset: int, seed: int = 0) -> None:
    """The per-head Q/K norms' backward on a fused row: x, dy and dx rows of `stride` floats, the normed n from
    `offset`; every other float of dx must stay as it was."""
    rng = np.random.default_rng(seed)
    dev = env.device
    x, w, dy = _inputs(rng, t, n, group)
    dx_want, dw_want = rms_norm_grad(x, w, dy, 1e-6, group)
    wide = lambda a, fill: np.concatenate([np.full((t + 1, offset), fill, np.float32),        # noqa: E731
                                           np.vstack([a, np.full((1, n), fill, np.float32)]),
                                           np.full((t + 1, stride - offset - n), fill, np.float32)], axis=1)
    xb, dyb, wb = upload(dev, wide(x, 3.0)), upload(dev, wide(dy, -2.0)), upload(dev, w)
    dxb, dwb = upload(dev, np.full((t + 1, stride), SENTINEL, np.float32)), upload(dev, np.zeros(group, np.float32))
    rsb = upload(dev, np.zeros(t * (n // group), np.float32))
    run(env, rms_norm_back(dev, env.kernels, xb, wb, dyb, dxb, dwb, rsb, ops_step(env), n, 1e-6, group=group,
                           stride=stride, offset=offset), 0, t)
    dx = read(dev, dxb).reshape(t + 1, stride)
    dw = read(dev, dwb)
    free(dev, xb, dyb, wb, dxb, dwb, rsb)
    got = dx[:t, offset:offset + n].reshape(t, -1, group)
    assert_close(got, dx_want.reshape(t, -1, group), NORM_BACK_DX_TOL, "strided dx", axis=(2,))
    assert_close(dw, dw_want, NORM_BACK_DW_TOL, "strided dw")
    rest = dx.copy()
    rest[:t, offset:offset + n] = SENTINEL
    if not np.all(rest == SENTINEL):
        raise AssertionError("strided rms_norm_back wrote outside its heads")


def test_strided_heads_of_a_fused_row(env):  # noqa: F811
    check_strided(env, t=5, n=3 * 72, group=72, stride=7 * 72, offset=2 * 72, seed=3)   # K heads inside [q | k | v]


def test_strided_offset_ignored_fails(env):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite|outside"):
        check_strided(patched(env, "backward_norm", "row * p.stride + p.offset", "row * p.stride"), t=5, n=3 * 72,
                      group=72, stride=7 * 72, offset=2 * 72, seed=3)
