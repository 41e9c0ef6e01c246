"""The optimizer's step (wgsl/optimizer.wgsl via lab.ops.optimizer) against the float64 oracle
(lab/host/reference/optim.py): the gradient norm and clip scale, several AdamW steps with a changing learning rate,
clipping on and off, from a fresh and from a resumed state, and SGD; at sizes that fill no workgroup (256) or
reduction slice (4,096) evenly, with buffers longer than n whose tail no op may read (NaN in the gradients) or write
(a sentinel elsewhere). Then broken variants of the kernel that the same checks must catch, the oracle held to
numbers worked out by hand, and the schedule against the oracle.

Errors are per element against the scale each tolerance names (optim.py), printed with -s in units of 2^-24.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from checks import Env, env1, free, patched, read, upload, within  # noqa: F401  (env1: fixture)

from lab.host.reference import optim as oracle
from lab.host.reference.kernels import f32
from lab.host.reference.optim import U32
from lab.ops import groups_1d
from lab.ops import optimizer as opt

SENTINEL = 7.0
EXTRA = 5                 # floats past n in every buffer
BETAS = dict(beta1=0.9, beta2=0.999, eps=1e-8)


def _tail(values: np.ndarray, fill: float) -> np.ndarray:
    return np.concatenate([f32(values), np.full(EXTRA, fill, np.float32)])


def _step(env: Env, ops, state, lr: float, t: int) -> None:
    env.device.run([op.at(1) for op in ops], writes=[(state, 0, opt.state_bytes(lr, t))])


def _grads(rng, n: int, amp: float) -> np.ndarray:
    g = rng.standard_normal(n) * amp
    g[rng.random(n) < 0.05] *= 1e-7           # gradients below eps's reach (sqrt(vhat) ~ eps): where eps sits matters
    return f32(g)


# -- the gradient norm ---------------------------------------------------------------------------------------------

def check_norm_state(what: str, state: np.ndarray, grads: np.ndarray, max_norm: float) -> float:
    """state's sumsq and clip against the oracle's for these gradients; returns the clip's relative error bound."""
    depth = opt.reduction_depth(len(grads))
    sumsq = oracle.grad_sumsq(grads)
    within(what + " sumsq", state[2], sumsq, sumsq, oracle.sumsq_tol(depth))
    clip = oracle.clip_scale(sumsq, max_norm)
    within(what + " clip", state[3], clip, clip, oracle.clip_tol(depth) if max_norm > 0 else 0.0)
    return oracle.clip_tol(depth) if max_norm > 0 else 0.0


def run_grad_norm(env: Env, grads: np.ndarray, max_norm: float, max_binding: int | None = None) -> np.ndarray:
    """grad_norm on `grads` (NaN past them); the state read back. The gradients must come back unchanged."""
    dev, n = env.device, len(grads)
    gb = upload(dev, _tail(grads, np.nan))
    scratch = upload(dev, np.full(opt.grad_norm_scratch_floats(n), np.nan, np.float32))
    state = opt.make_state(dev, "test.state")
    ops = opt.grad_norm(dev, env.kernels, gb, n, state, scratch, max_norm=max_norm, max_binding=max_binding)
    _step(env, ops, state, 1e-3, 1)
    out, back = read(dev, state), read(dev, gb)
    free(dev, gb, scratch, state)
    if not np.array_equal(back[:n], grads):
        raise AssertionError("grad_norm changed the gradients")
    return out


@pytest.mark.parametrize("n,max_norm", [(1, 0.0), (255, 1.0), (9192, 20.0), (9192, 1e6), (20000, 0.0)])
def test_grad_norm(env1, n, max_norm):  # noqa: F811
    grads = _grads(np.random.default_rng(n), n, 1.5)
    state = run_grad_norm(env1, grads, max_norm)
    check_norm_state(f"grad_norm n={n} max_norm={max_norm}", state, grads, max_norm)
    sumsq = oracle.grad_sumsq(grads)
    print(f"grad_norm n={n}: sumsq {abs(float(state[2]) - sumsq) / sumsq / U32:.2f} u, clip {state[3]:.6g}")


def test_grad_norm_bit_reproducible_and_chunked(env1):  # noqa: F811
    """Two runs give the same bytes, and so does the gradient bound in three chunks: the order is n's alone."""
    grads = _grads(np.random.default_rng(3), 20000, 1.0)
    a = run_grad_norm(env1, grads, 50.0)
    b = run_grad_norm(env1, grads, 50.0)
    c = run_grad_norm(env1, grads, 50.0, max_binding=2 * 4 * opt.SLICE)
    assert a.tobytes() == b.tobytes() == c.tobytes()


def test_grad_norm_many(env1):  # noqa: F811
    """One norm over three gradient buffers (a LoRA step's A, B, ... in their own buffers): the global norm."""
    dev, rng = env1.device, np.random.default_rng(11)
    pieces = [_grads(rng, n, amp) for n, amp in ((67, 1.0), (5000, 0.2), (1, 30.0))]
    bufs = [upload(dev, _tail(g, np.nan)) for g in pieces]
    parts = sum(opt.grad_norm_scratch_floats(len(g)) for g in pieces)
    scratch, state = upload(dev, np.full(parts, np.nan, np.float32)), opt.make_state(dev, "test.state")
    ops = opt.grad_norm_many(dev, env1.kernels, [(b, len(g)) for b, g in zip(bufs, pieces)], state, scratch,
                             max_norm=3.0)
    _step(env1, ops, state, 1e-3, 1)
    got = read(dev, state)
    free(dev, *bufs, scratch, state)
    grads = np.concatenate(pieces)
    depth = opt.reduction_depth(*(len(g) for g in pieces))
    sumsq = oracle.grad_sumsq(grads)
    within("grad_norm_many sumsq", got[2], sumsq, sumsq, oracle.sumsq_tol(depth))
    clip = oracle.clip_scale(sumsq, 3.0)
    within("grad_norm_many clip", got[3], clip, clip, oracle.clip_tol(depth))


# -- AdamW ---------------------------------------------------------------------------------------------------------

def _start(rng, n: int, t0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, m, v) before the first step: fresh moments at t0 = 1, a resumed run's otherwise."""
    p = f32(rng.standard_normal(n) * rng.uniform(0.05, 2.0, n))
    if t0 == 1:
        return p, np.zeros(n, np.float32), np.zeros(n, np.float32)
    return p, f32(rng.standard_normal(n) * 0.1), f32(rng.standard_normal(n) ** 2 * 0.01)


def check_adamw(env: Env, n: int, lrs: list[float], t0: int = 1, max_norm: float = 0.0, weight_decay: float = 0.0,
                seed: int = 0, max_binding: int | None = None) -> dict[str, float]:
    """len(lrs) steps of grad_norm then adamw (one plan, only the state and the gradients written between steps),
    from t0, against the oracle run from the same f32 start; returns the errors in units of 2^-24."""
    dev, rng = env.device, np.random.default_rng(seed)
    p0, m0, v0 = _start(rng, n, t0)
    bufs = {"p": upload(dev, _tail(p0, SENTINEL)), "g": upload(dev, _tail(np.zeros(n), np.nan)),
            "m": upload(dev, _tail(m0, SENTINEL)), "v": upload(dev, _tail(v0, SENTINEL)),
            "scratch": upload(dev, np.full(opt.grad_norm_scratch_floats(n), np.nan, np.float32))}
    state = opt.make_state(dev, "test.state")
    ops = opt.grad_norm(dev, env.kernels, bufs["g"], n, state, bufs["scratch"], max_norm=max_norm,
                        max_binding=max_binding)
    ops += opt.adamw(dev, env.kernels, bufs["p"], bufs["g"], bufs["m"], bufs["v"], state, n, **BETAS,
                     weight_decay=weight_decay, max_binding=max_binding)
    p, m, v, big_m = (x.astype(np.float64) for x in (p0, m0, v0, np.abs(m0)))
    p_scale, clip_err, what = np.zeros(n), 0.0, f"adamw n={n} t0={t0} max_norm={max_norm} wd={weight_decay}"
    for k, lr in enumerate(lrs):
        lr, t = float(np.float32(lr)), t0 + k           # the oracle takes the f32 lr the kernel reads
        g = _grads(rng, n, rng.uniform(0.3, 3.0))
        dev.write(bufs["g"], g.tobytes())
        _step(env, ops, state, lr, t)
        clip_err = check_norm_state(f"{what} step {t}", read(dev, state), g, max_norm)
        clip = oracle.clip_scale(oracle.grad_sumsq(g), max_norm)
        kw = dict(lr=lr, t=t, clip=clip, weight_decay=weight_decay, **BETAS)
        _, big_m, _, big_u = oracle.adamw_step(np.abs(p), np.abs(g), big_m, v, **kw)    # the scales: on |g|
        p_scale += np.abs(p)
        p, m, v, _ = oracle.adamw_step(p, g, m, v, **kw)
        p_scale += lr * big_u
    got = {k: read(dev, bufs[k]) for k in ("p", "m", "v")}
    free(dev, *bufs.values(), state)
    for k, fill in (("p", SENTINEL), ("m", SENTINEL), ("v", SENTINEL)):
        if not np.all(got[k][n:] == fill):
            raise AssertionError(f"{what}: wrote {k} past n")
    tol = oracle.adamw_tols(len(lrs), clip_err)
    return {"m": within(what + " m", got["m"][:n], m, big_m, tol["m"]),
            "v": within(what + " v", got["v"][:n], v, v, tol["v"]),
            "p": within(what + " p", got["p"][:n], p, p_scale, tol["p"])}


LRS = [1e-2, 3e-3, 2e-2, 5e-3]


@pytest.mark.parametrize("n,t0,max_norm,wd", [
    (1, 1, 0.0, 0.0),             # one parameter, no clip, no decay
    (255, 1, 2.0, 0.1),           # a workgroup less one; the clip active on every step (norm ~ 16 amp >= 4.6)
    (1000, 1, 40.0, 0.01),        # clipped on some steps only
    (9192, 700, 0.0, 0.1),        # resumed at t = 700: t ln b2 = -0.70, past the series (bc2 by 1 - exp)
    (300, 100_000, 2.0, 0.01),    # late: b1^t and b2^t underflow, both corrections 1
])
def test_adamw(env1, n, t0, max_norm, wd):  # noqa: F811
    e = check_adamw(env1, n, LRS, t0, max_norm, wd, seed=n + t0)
    print(f"adamw n={n} t0={t0}: " + ", ".join(f"{k} {v:.2f} u" for k, v in e.items()))


def test_adamw_chunked(env1):  # noqa: F811
    """The parameters bound in three chunks: the same checks hold."""
    check_adamw(env1, 20000, LRS[:2], 1, 60.0, 0.01, seed=9, max_binding=2 * 4 * opt.SLICE)


@pytest.mark.slow
def test_adamw_large(env1):  # noqa: F811
    e = check_adamw(env1, 1_000_003, LRS[:3], 1, 500.0, 0.01, seed=1)
    print("adamw n=1000003: " + ", ".join(f"{k} {v:.2f} u" for k, v in e.items()))


def test_adamw_oracle_by_hand():
    """The oracle against two steps worked by hand (b1 0.9, b2 0.999, eps 1e-8, wd 0.01; p 1, m = v = 0):
    step 1, g 0.5, lr 0.1: decayed p = 1 - 0.1 * 0.01 = 0.999; m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025;
      mhat = 0.05 / 0.1 = 0.5; vhat = 0.00025 / 0.001 = 0.25; u = 0.5 / (0.5 + 1e-8) = 0.99999998000000040;
      p = 0.999 - 0.1 u = 0.89900000199999996.
    step 2, g -0.25, lr 0.05: decayed p = p (1 - 0.0005) = 0.89855050199899996; m = 0.045 - 0.025 = 0.02;
      v = 0.00024975 + 0.0000625 = 0.00031225; bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.998001 = 0.001999;
      mhat = 0.10526315789473684, vhat = 0.15620310155077539, sqrt 0.39522538070166418;
      u = 0.26633703292153797; p = 0.89855050199899996 - 0.05 u = 0.88523365035292306.
    And the clip: gradients (3, 4), max_norm 1: 1 / (5 + 1e-6) = 0.19999996000000800."""
    kw = dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    p, m, v, u = oracle.adamw_step([1.0], [0.5], [0.0], [0.0], lr=0.1, t=1, **kw)
    assert np.allclose([m[0], v[0], u[0], p[0]], [0.05, 0.00025, 0.99999998000000040, 0.89900000199999996],
                       rtol=1e-15, atol=0)
    p, m, v, u = oracle.adamw_step(p, [-0.25], m, v, lr=0.05, t=2, **kw)
    assert np.allclose([m[0], v[0], u[0], p[0]], [0.02, 0.00031225, 0.26633703292153797, 0.88523365035292306],
                       rtol=1e-14, atol=0)
    assert oracle.clip_scale(25.0, 1.0) == pytest.approx(0.19999996000000800, rel=1e-15)
    assert oracle.clip_scale(25.0, 0.0) == 1.0 and oracle.clip_scale(0.25, 1.0) == 1.0
    assert oracle.sgd_step([1.0, 2.0], [0.5, -4.0], lr=0.25).tolist() == [0.875, 3.0]


def test_adamw_by_hand_on_the_gpu(env1):  # noqa: F811
    """The hand-worked steps above on the GPU: within f32's reach of the hand's numbers."""
    dev = env1.device
    p, g, m, v = (upload(dev, np.array([x], np.float32)) for x in (1.0, 0.5, 0.0, 0.0))
    state = opt.make_state(dev, "test.state")
    ops = opt.adamw(dev, env1.kernels, p, g, m, v, state, 1, **BETAS, weight_decay=0.01)
    _step(env1, ops, state, float(np.float32(0.1)), 1)
    assert read(dev, p)[0] == pytest.approx(0.89900000199999996, rel=4e-7)
    dev.write(g, np.float32(-0.25).tobytes())
    _step(env1, ops, state, float(np.float32(0.05)), 2)
    assert read(dev, p)[0] == pytest.approx(0.88523365035292306, rel=4e-7)   # f32 lr's own 3e-8 included
    assert read(dev, m)[0] == pytest.approx(0.02, rel=4e-7) and read(dev, v)[0] == pytest.approx(0.00031225, rel=4e-7)
    free(dev, p, g, m, v, state)


def check_direction(env: Env, t: int, n: int = 4096) -> float:
    """One step from p = 0 at lr 1 without decay, so p = -u: the step's direction alone, against U = Mhat / (sqrt(vhat)
    + eps) (adamw_tols' scale, the same recurrences on |g| and |m|), at step t from a resumed m and v (fresh at t = 1).
    Returns the error in units of 2^-24."""
    dev, rng = env.device, np.random.default_rng(t)
    g = _grads(rng, n, 1.0)
    _, m0, v0 = _start(rng, n, t)
    bufs = [upload(dev, x) for x in (np.zeros(n, np.float32), g, m0, v0)]
    state = opt.make_state(dev, "test.state")
    _step(env, opt.adamw(dev, env.kernels, *bufs, state, n, **BETAS), state, 1.0, t)
    p = read(dev, bufs[0])
    free(dev, *bufs, state)
    _, _, _, u = oracle.adamw_step(np.zeros(n), g, m0, v0, lr=1.0, t=t, **BETAS)
    _, _, _, big_u = oracle.adamw_step(np.zeros(n), np.abs(g), np.abs(m0), v0, lr=1.0, t=t, **BETAS)
    return within(f"adamw direction t={t}", -p, u, big_u, oracle.adamw_tols(1, 0.0)["p"])


DIRECTION_TS = (1, 2, 6, 700, 5000, 100_000)      # both corrections by the series, b1's by 1 - exp, both, ..., both 1


def test_adamw_direction(env1):  # noqa: F811
    print("adamw direction: " + ", ".join(f"t={t} {check_direction(env1, t):.1f} u" for t in DIRECTION_TS))


def test_bias_correction_by_pow_fails(env1):  # noqa: F811
    """1 - pow(b, t), the dead end wgsl/optimizer.wgsl's header measures: past the tolerance at t = 1 and t = 700."""
    bad = patched(env1, "optimizer", "vec2<f32>(one_minus_pow(st.t, a.ln_b1), one_minus_pow(st.t, a.ln_b2))",
                  "vec2<f32>(1.0 - pow(a.b1, st.t), 1.0 - pow(a.b2, st.t))")
    for t in (1, 700):
        with pytest.raises(AssertionError, match="exceeds"):
            check_direction(bad, t)


# Broken variants: each must fail the check that the real kernel passes above.
@pytest.mark.parametrize("old,new,n,t0,max_norm,wd", [
    # (a) no bias correction: the first steps move by 3.16 lr where AdamW's move by lr
    ("vec2<f32>(one_minus_pow(st.t, a.ln_b1), one_minus_pow(st.t, a.ln_b2))", "vec2<f32>(1.0, 1.0)",
     255, 1, 2.0, 0.1),
    # (b) weight decay coupled into the gradient (Adam's L2) instead of decoupled
    ("let gi = grad[i] * st.clip;\n    let decayed = w[i] - lr * a.wd * w[i];",
     "let gi = grad[i] * st.clip + a.wd * w[i];\n    let decayed = w[i];", 255, 1, 0.0, 0.1),
    # (c) the clip scale ignored
    ("grad[i] * st.clip", "grad[i]", 255, 1, 2.0, 0.0),
    # (d) the reduction drops its last partial: the 1,000 gradients past two full slices, or the only one
    ("i < f.parts;", "i + 1u < f.parts;", 9192, 1, 40.0, 0.0),
    ("i < f.parts;", "i + 1u < f.parts;", 255, 1, 2.0, 0.0),
    # the series of the bias correction cut to its first term (1 - b^t = -t ln b): 5e-4 off at t = 1
    ("for (var k = 9.0;", "for (var k = 1.0;", 255, 1, 0.0, 0.0),
])
def test_broken_variants_fail(env1, old, new, n, t0, max_norm, wd):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_adamw(patched(env1, "optimizer", old, new), n, LRS, t0, max_norm, wd, seed=n + t0)


# -- SGD and the clear ---------------------------------------------------------------------------------------------

def check_sgd(env: Env, n: int, lrs: list[float], seed: int = 0) -> float:
    """len(lrs) SGD steps against the oracle; the state's clip set to 0.25 by hand, which SGD must not read."""
    dev, rng = env.device, np.random.default_rng(seed)
    p0 = f32(rng.standard_normal(n))
    pb, gb = upload(dev, _tail(p0, SENTINEL)), upload(dev, _tail(np.zeros(n), np.nan))
    state = opt.make_state(dev, "test.state")
    ops = opt.sgd(dev, env.kernels, pb, gb, state, n)
    p, scale = p0.astype(np.float64), np.zeros(n)
    for k, lr in enumerate(lrs):
        lr, g = float(np.float32(lr)), _grads(rng, n, 2.0)
        dev.write(gb, g.tobytes())
        env.device.run([op.at(1) for op in ops], writes=[(state, 0, opt.STATE.pack(lr, k + 1, 0.0, 0.25))])
        scale += np.abs(p) + lr * np.abs(g)
        p = oracle.sgd_step(p, g, lr=lr)
    got = read(dev, pb)
    free(dev, pb, gb, state)
    if not np.all(got[n:] == SENTINEL):
        raise AssertionError(f"sgd n={n}: wrote past n")
    return within(f"sgd n={n}", got[:n], p, scale, oracle.sgd_tol(len(lrs)))


@pytest.mark.parametrize("n", [1, 255, 1000])
def test_sgd(env1, n):  # noqa: F811
    print(f"sgd n={n}: {check_sgd(env1, n, LRS, seed=n):.2f} u")


def test_sgd_broken_fails(env1):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds"):
        check_sgd(patched(env1, "optimizer", "w[i] - st_sgd.lr * grad[i]", "w[i] + st_sgd.lr * grad[i]"), 255, LRS)


@pytest.mark.parametrize("n,max_binding", [(1, None), (1000, None), (20000, 2 * 4 * opt.SLICE)])
def test_zero(env1, n, max_binding):  # noqa: F811
    dev = env1.device
    buf = upload(dev, _tail(np.arange(1, n + 1), SENTINEL))
    ops = opt.zero(dev, env1.kernels, buf, n, max_binding=max_binding)
    env1.device.run([op.at(1) for op in ops])
    got = read(dev, buf)
    free(dev, buf)
    assert np.all(got[:n] == 0) and np.all(got[n:] == SENTINEL)


# -- plans, limits, arguments --------------------------------------------------------------------------------------

def test_chunks_and_grids_past_the_binding_limit(env1):  # noqa: F811
    """More floats than one binding holds (lavapipe: 128 MiB; the H100's Vulkan: 2 GiB): whole slices per chunk, grids
    folded into y. Arithmetic only: nothing that large is made."""
    limits = env1.device.info.limits
    n = limits["max_storage_buffer_binding_size"] // 4 + 12_345_679
    chunks = opt._chunks(env1.device, n, None)
    assert sum(c for _, c in chunks) == n and len(chunks) >= 2
    assert all(first % opt.SLICE == 0 and 4 * count <= limits["max_storage_buffer_binding_size"]
               for first, count in chunks)
    max_dim = limits["max_compute_workgroups_per_dimension"]
    for _, count in chunks:
        for per in (opt.WG, opt.SLICE):
            gx, gy, _ = groups_1d(count, per, max_dim)
            assert gx <= max_dim and gx * gy * per >= count
    assert opt.grad_norm_scratch_floats(n) == -(-n // opt.SLICE)


def test_arguments_refused(env1):  # noqa: F811
    dev = env1.device
    a, b, c, d = (upload(dev, np.zeros(8, np.float32)) for _ in range(4))
    big, state = upload(dev, np.zeros(50000, np.float32)), opt.make_state(dev)
    with pytest.raises(ValueError, match="different buffers"):
        opt.adamw(dev, env1.kernels, a, a, b, c, state, 8)
    with pytest.raises(ValueError, match="needs"):
        opt.sgd(dev, env1.kernels, a, b, state, 9)
    with pytest.raises(ValueError, match="beta2"):
        opt.adamw(dev, env1.kernels, a, b, c, d, state, 8, beta2=1.0)
    with pytest.raises(ValueError, match="scratch"):
        opt.grad_norm(dev, env1.kernels, big, 50000, state, a, max_norm=1.0)   # 13 partials, room for 8
    for t in (0, opt.MAX_T + 1, 1.5):
        with pytest.raises(ValueError):
            opt.state_bytes(1e-3, t)
    free(dev, a, b, c, d, big, state)


# -- the schedule --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lr,warmup,total,min_ratio", [(1e-3, 10, 100, 0.0), (3e-4, 0, 50, 0.1),
                                                       (1.0, 7, 7, 0.5), (2e-4, 1, 2, 0.0)])
def test_schedule(lr, warmup, total, min_ratio):
    steps = np.arange(1, total + 6)
    got = [opt.schedule(int(s), lr=lr, warmup=warmup, total=total, min_ratio=min_ratio) for s in steps]
    want = oracle.schedule(steps, lr=lr, warmup=warmup, total=total, min_ratio=min_ratio)
    assert np.allclose(got, want, rtol=1e-14, atol=0)     # both float64: only cos's last bits may differ


def test_schedule_by_hand():
    kw = dict(lr=1e-3, warmup=10, total=110)
    assert opt.schedule(1, **kw) == pytest.approx(1e-4, rel=1e-15)            # warm-up's first step: lr / 10
    assert opt.schedule(10, **kw) == pytest.approx(1e-3, rel=1e-15)           # its last: lr
    assert opt.schedule(60, **kw) == pytest.approx(5e-4, rel=1e-12)           # half the cosine: (lr + 0) / 2
    assert opt.schedule(35, **kw) == pytest.approx(1e-3 * (1 + math.sqrt(0.5)) / 2, rel=1e-12)   # a quarter
    assert opt.schedule(110, **kw) == 0.0 and opt.schedule(500, **kw, min_ratio=0.1) == pytest.approx(1e-4)
    for bad in (dict(step=0), dict(step=1, warmup=5, total=4), dict(step=1, min_ratio=1.5)):
        with pytest.raises(ValueError):
            opt.schedule(**{**dict(step=1, lr=1e-3, warmup=2, total=10), **bad})
