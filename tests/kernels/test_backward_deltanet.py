"""Qwen3.5's gated delta-net backward (wgsl/backward_deltanet.wgsl via lab.ops.backward_deltanet.deltanet_back)
against the float64 oracle (lab/host/reference/grads_deltanet.py deltanet_grad, itself held to central differences in
test_backward_oracle.py): windows from position 0 of 1 token, shorter than a chunk, exactly one chunk, one past it and
three chunks; heads of 16 and 64 (the forward's multiples of 16); 2 key heads under 4 value heads (the broadcast
h % n_k_heads), 1 under 3, 3 under 3; alpha + dt_bias past softplus's threshold in one case. Rows past the step are NaN
in the inputs (no sum may read them), every scratch buffer starts NaN (no entry may read what another has not
written), and a sentinel fills the outputs (no row past the step, and none of dproj's q k v columns, may be written);
the parameters' gradients are added into earlier values. Then the same bits on a second run, the arguments' checks,
and broken kernels the same check must catch.

Errors per element against the sum of its terms' magnitudes (the oracle's `magnitudes` mode, plus the earlier value
for the parameters' gradients), in units of 2^-24, for each gradient (dz, dbeta, dalpha; dq, dk, dv; dnorm_w, ddt,
dA); the tolerance grads_deltanet.delta_tol(t, S), with its count of roundings there.
"""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, upload, within  # noqa: F401  (env1: fixture)

from lab import gpu
from lab.host.reference import ops as ref_ops
from lab.host.reference.grads_deltanet import Shape, delta_tol, deltanet_grad
from lab.host.reference.kernels import f32
from lab.ops import dispatches, step_bytes
from lab.ops.backward_deltanet import CHUNK, LOOP_LIMIT, DeltaScratch, back_iterations, deltanet_back

SPARE = 2           # rows past the step: NaN in the inputs, the sentinel in the outputs
SENTINEL = 7.0
EPS = 1e-6


def _run(env: Env, op_list, t: int) -> None:
    step = ops_step(env)
    env.device.run(dispatches(op_list, t), writes=[(step, 0, step_bytes(0, t, 8192))])


def _nan_scratch(dev, T, nk, nv, S) -> DeltaScratch:
    sc = DeltaScratch.alloc(dev, T, nk, nv, S, label="test delta")
    for b in vars(sc).values():
        dev.write(b, np.full(b.size // 4, np.nan, np.float32).tobytes())
    return sc


def inputs(t: int, nk: int, nv: int, S: int, seed: int, past_20: bool = False):
    """(shape, proj, conv, dt_bias, ssm_a, norm_w, dy) for t tokens plus SPARE NaN rows: proj rows [q k v | z | beta
    | alpha] as the engine's in-projection lays them, the conv's output as silu of a conv would leave it."""
    rng = np.random.default_rng(seed)
    K, V = nk * S, nv * S
    C = 2 * K + V
    sh = Shape(nk, nv, S, C, C + V, C + V + nv, EPS)
    W, rows = C + V + 2 * nv, t + SPARE
    proj = np.full((rows, W), np.nan, np.float32)
    proj[:t] = rng.standard_normal((t, W)) * rng.uniform(0.5, 2.0, (1, W))
    if past_20:
        proj[:t:2, sh.alpha_offset] = 24.0 + rng.standard_normal(len(proj[:t:2]))
    conv = np.full((rows, C), np.nan, np.float32)
    conv[:t] = ref_ops.silu(rng.standard_normal((t, C)) * 1.5)
    dy = np.full((rows, V), np.nan, np.float32)
    dy[:t] = rng.standard_normal((t, V))
    dt, a = f32(rng.standard_normal(nv)), f32(-np.exp(0.5 * rng.standard_normal(nv)))
    return sh, proj, conv, dt, a, f32(rng.uniform(0.5, 1.5, S)), dy


def check_delta_back(env: Env, t: int, nk: int, nv: int, S: int, seed: int = 0, full: bool = True,
                     past_20: bool = False, outputs: dict | None = None) -> dict:
    """Each gradient's error in units of 2^-24; AssertionError past delta_tol, at a non-finite value, at a row
    past the step or a q k v column of dproj written. `outputs`: filled with the raw results (the same-bits test)."""
    dev, rows = env.device, t + SPARE
    sh, proj, conv, dt, a, w, dy = inputs(t, nk, nv, S, seed, past_20)
    want = deltanet_grad(proj[:t], conv[:t], dt, a, w, dy[:t], sh)
    mag = deltanet_grad(proj[:t], conv[:t], dt, a, w, dy[:t], sh, magnitudes=True)
    # the earlier values the parameters' gradients are added into, of the gradients' own size (a larger one would
    # swamp the bound's scale and hide a wrong gradient under it)
    rng = np.random.default_rng(seed + 1)
    p0 = {k: f32(rng.standard_normal(len(getattr(want, k))) * max(np.max(np.abs(getattr(want, k))), 1e-3))
          for k in ("dnorm_w", "ddt", "da")}
    bufs = {k: upload(dev, v, k) for k, v in (("proj", proj), ("conv", conv), ("dt", dt), ("a", a), ("w", w),
                                               ("dy", dy))}
    dproj = upload(dev, np.full(proj.shape, SENTINEL, np.float32), "dproj")
    dconv = upload(dev, np.full(conv.shape, SENTINEL, np.float32), "dconv")
    pb = {k: upload(dev, v, k) for k, v in p0.items()} if full else {}
    sc = _nan_scratch(dev, rows, nk, nv, S)
    try:
        _run(env, deltanet_back(dev, env.kernels, bufs["proj"], bufs["conv"], bufs["dt"], bufs["a"], bufs["w"],
                                bufs["dy"], dproj, dconv, sc, ops_step(env), n_k_heads=nk, n_v_heads=nv,
                                head_dim=S, proj_stride=proj.shape[1], z_offset=sh.z_offset,
                                beta_offset=sh.beta_offset, alpha_offset=sh.alpha_offset, eps=EPS, max_tokens=rows,
                                **pb), t)
        got_proj, got_conv = read(dev, dproj).reshape(proj.shape), read(dev, dconv).reshape(conv.shape)
        got_p = {k: read(dev, b) for k, b in pb.items()}
    finally:
        free(dev, *bufs.values(), dproj, dconv, *pb.values(), *vars(sc).values())
    if outputs is not None:
        outputs.update(dproj=got_proj.tobytes(), dconv=got_conv.tobytes(), **{k: v.tobytes() for k, v in got_p.items()})
    what = f"deltanet_back t={t} nk={nk} nv={nv} S={S}"
    K, V, C = sh.K, sh.V, 2 * sh.K + sh.V
    if not (np.all(got_proj[t:] == SENTINEL) and np.all(got_conv[t:] == SENTINEL)):
        raise AssertionError(f"{what}: wrote rows past the step's tokens")
    if not np.all(got_proj[:, :C] == SENTINEL):
        raise AssertionError(f"{what}: wrote dproj's q k v columns (the conv's backward writes them)")
    cols = {"dz": (C, C + V), "dbeta": (C + V, C + V + nv), "dalpha": (C + V + nv, C + V + 2 * nv)}
    parts = {name: (got_proj[:t, a0:a1], want.dproj[:, a0:a1], mag.dproj[:, a0:a1]) for name, (a0, a1) in cols.items()}
    for name, (a0, a1) in {"dq": (0, K), "dk": (K, 2 * K), "dv": (2 * K, C)}.items():
        parts[name] = (got_conv[:t, a0:a1], want.dconv[:, a0:a1], mag.dconv[:, a0:a1])
    if full:
        for name, key in (("dnorm_w", "dnorm_w"), ("ddt", "ddt"), ("dA", "da")):
            parts[name] = (got_p[key], p0[key] + getattr(want, key), np.abs(p0[key]) + getattr(mag, key))
    tol = delta_tol(t, S)
    errs = {name: within(f"{what} {name}", got, ref, scale, tol, "its terms' magnitudes")
            for name, (got, ref, scale) in parts.items()}
    return errs


@pytest.mark.parametrize("t,nk,nv,S,past_20", [
    (1, 2, 4, 16, False), (5, 1, 3, 16, True), (CHUNK, 2, 4, 64, False), (CHUNK + 1, 3, 3, 16, False),
    (2 * CHUNK + 8, 2, 4, 64, True)])
def test_deltanet_back(env1, t, nk, nv, S, past_20):  # noqa: F811
    e = check_delta_back(env1, t, nk, nv, S, seed=t * 100 + nv * 10 + S, past_20=past_20)
    print(f"deltanet_back t={t} nk={nk} nv={nv} S={S}: " + ", ".join(f"{k} {v:.1f}" for k, v in e.items())
          + f" units of 2^-24 (tolerance {delta_tol(t, S) * 2 ** 24:.0f})")


def test_without_the_parameters_gradients(env1):  # noqa: F811
    """LoRA's step: the input gradients alone, no norm_dw or param_back op."""
    check_delta_back(env1, 7, 2, 4, 16, seed=7, full=False)


def test_the_same_bits_every_run(env1):  # noqa: F811
    """Every sum in a fixed order: two runs of the same window give the same bits in every output."""
    a, b = {}, {}
    check_delta_back(env1, CHUNK + 3, 2, 4, 16, seed=9, outputs=a)
    check_delta_back(env1, CHUNK + 3, 2, 4, 16, seed=9, outputs=b)
    assert a == b


def test_arguments_are_checked(env1):  # noqa: F811
    dev, k, step = env1.device, env1.kernels, ops_step(env1)
    nk, nv, S, t = 1, 2, 16, 4
    W, C = 2 * nk * S + nv * S + nv * S + 2 * nv, 2 * nk * S + nv * S
    big = [upload(dev, np.zeros(t * W, np.float32)) for _ in range(6)]
    sc = DeltaScratch.alloc(dev, t, nk, nv, S)
    kw = dict(n_k_heads=nk, n_v_heads=nv, head_dim=S, proj_stride=W, z_offset=C, beta_offset=C + nv * S,
              alpha_offset=C + nv * S + nv, eps=EPS, max_tokens=t)
    try:
        with pytest.raises(ValueError, match="own"):
            deltanet_back(dev, k, big[0], big[1], big[2], big[3], big[4], big[5], big[0], big[1], sc, step, **kw)
        with pytest.raises(ValueError, match="head_dim"):
            deltanet_back(dev, k, *big, big[0], big[1], sc, step, **{**kw, "head_dim": 24})
        with pytest.raises(ValueError, match="multiple"):
            deltanet_back(dev, k, *big, big[0], big[1], sc, step, **{**kw, "n_k_heads": 3})
        with pytest.raises(ValueError, match="alpha"):
            deltanet_back(dev, k, *big, big[0], big[1], sc, step, **{**kw, "alpha_offset": W - 1})
        with pytest.raises(ValueError, match="together"):
            deltanet_back(dev, k, *big, big[0], big[1], sc, step, dnorm_w=big[2], **kw)
        small = DeltaScratch.alloc(dev, 1, nk, nv, S)
        with pytest.raises(ValueError, match="scratch"):
            deltanet_back(dev, k, *big, big[0], big[1], small, step, **kw)
        free(dev, *vars(small).values())
    finally:
        free(dev, *big, *vars(sc).values())


def test_a_chunk_stays_within_the_loop_budget():
    """The longest walk, a chunk's backward, fits lavapipe's budget at the widest head the forward takes (256)."""
    assert back_iterations(256) <= LOOP_LIMIT


def test_a_window_past_the_loop_budget_is_refused(env1):  # noqa: F811
    dev = env1.device
    if not dev.info.loop_budget:
        pytest.skip(f"{dev.info.name} stops no loops")
    nk, nv, S = 1, 64, 16
    t = LOOP_LIMIT // nv + 1      # the gated norm weight's walk: t nv + t
    W, C = 2 * nk * S + nv * S + nv * S + 2 * nv, 2 * nk * S + nv * S
    bufs = [upload(dev, np.zeros(t * W, np.float32)) for _ in range(9)]
    sc = DeltaScratch.alloc(dev, t, nk, nv, S)
    kw = dict(n_k_heads=nk, n_v_heads=nv, head_dim=S, proj_stride=W, z_offset=C, beta_offset=C + nv * S,
              alpha_offset=C + nv * S + nv, eps=EPS, max_tokens=t)
    try:
        deltanet_back(dev, env1.kernels, *bufs[:8], sc, ops_step(env1), **kw)     # LoRA's walks are short
        with pytest.raises(gpu.GpuError, match="loop"):
            deltanet_back(dev, env1.kernels, *bufs[:8], sc, ops_step(env1), dnorm_w=bufs[8],
                          ddt=upload(dev, np.zeros(nv, np.float32)), da=upload(dev, np.zeros(nv, np.float32)), **kw)
    finally:
        free(dev, *bufs, *vars(sc).values())


# Broken variants: each must fail the check that the real kernels pass above (a window of three chunks, 2 key heads
# under 4 value heads). By default the three the issue names; the rest with --slow (each compiles the family again).
BROKEN = [
    ("the decay's gradient left out", "dg += decay * chunk[cj + r * S + i] * ds[r];", ""),
    ("beta's sigmoid derivative wrong", "sums.x * beta * (1.0 - beta)", "sums.x * beta"),
    ("dS not carried back a token", "ds[r] *= decay;", "ds[r] = 0.0;"),
]
BROKEN_SLOW = [
    ("dS carried back without the decay", "ds[r] *= decay;", ""),
    ("dS not carried into the chunk before", "for (var r = 0u; r < S; r++) { ds[r] = ds_buf[ds0 + r * S + i]; }", ""),
    ("a chunk's states from zero, not its checkpoint", "if (p.chunk > 0u) {", "if (false) {"),
    ("the backward reading the state after the token, not before", "let cj = cs0 + (j - j0) * SS;\n",
     "let cj = cs0 + min(j - j0 + 1u, C - 1u) * SS;\n"),
    ("dk without the read-out's term", "ak += ds_buf[ds0 + i * S + c] * vd[c] + sp * vp[c];",
     "ak += ds_buf[ds0 + i * S + c] * vd[c];"),
    ("the L2 norm's backward without its projection", "dconv[b + i] = (gs - qkv1[b + i] * dot) * r;",
     "dconv[b + i] = gs * r;"),
    ("the key heads' shares from one value head", "h += nk) { gs", "h += nv) { gs"),
    ("dz through silu, not its derivative", "norm_w[c] * silu_grad(z);", "norm_w[c] * silu(z);"),
    ("the rms norm's backward without its mean", "- n * m) * r;", ") * r;"),
    ("dA from the decay, not the softplus", "sa += gates0[g + 4u] * gates0[g + 2u];", "sa += gates0[g + 4u];"),
]


@pytest.mark.parametrize("what,old,new", [*BROKEN, *(pytest.param(*v, marks=pytest.mark.slow) for v in BROKEN_SLOW)])
def test_broken_variants_fail(env1, what, old, new):  # noqa: F811
    full = "gates0" in old      # dA's variant needs full fine-tuning's entries; the others show in the input gradients
    with pytest.raises(AssertionError, match="exceeds|non-finite") as caught:
        check_delta_back(patched(env1, "backward_deltanet", old, new), 2 * CHUNK + 8, 2, 4, 16, seed=3, full=full)
    print(f"{what}: {caught.value}")
