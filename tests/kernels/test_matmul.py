"""matvec (decode) and matmul (prefill) with fused dequantization, on the native backend (lavapipe here).

Reference: weights dequantized by gguf.quants (independent of our WGSL), product in float64.
Tolerances are in quant_oracle (DOT_TOL, with the reasoning) and relative to each output's own
sum |W||x|, so they do not depend on the scale of a type's values.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab import gpu
from lab.format.ggml import BY_NAME
from lab.gpu.shaders import KernelCache
from lab.host.reference import quant as qo
from lab.host.reference.quant import DOT_TOL
from lab.ops.matmul import IQ_GRID, matmul, matvec
from lab.ops.weights import alloc_weight, placements, upload_weight
from tests.kernels.quant_rig import Rig


def cols_for(name: str) -> int:
    """Three blocks for quantized types (K: 768; others: 96, so not a multiple of the 64-column matmul chunk;
    NVFP4: 192, its rows are whole 64s); float types 264 (a multiple of 8, not of 64)."""
    if name in qo.K_TYPES:
        return 3 * 256
    return 96 if BY_NAME[name].block == 32 else 192 if BY_NAME[name].block == 64 else 264


ROWS = 333   # not a multiple of 4 (matvec) or 64 (matmul tile)


_cache: dict = {}


def tensor(name: str, rows: int = ROWS, cols: int | None = None, seed: int = 0):
    key = (name, rows, cols, seed)
    if key not in _cache:
        raw = qo.random_tensor(name, rows, cols or cols_for(name), seed)
        _cache[key] = (raw, qo.dequant(raw, name))
    return _cache[key]


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 100).standard_normal(shape).astype(np.float32)


# -- weights: allocation and placement ----------------------------------------------------------------

def test_alloc_split_and_placements(device):
    t = BY_NAME["Q4_0"]                       # 18-byte blocks: row bytes not a multiple of 4
    rows, cols = 50, 96                       # 54 bytes per row
    w = alloc_weight(device, "split", t, rows, cols, max_binding=1100)
    try:
        assert [p.n_rows for p in w.parts] == [20, 20, 10]     # greedy: 20 * 54 = 1080 <= 1100
        assert [p.first_row for p in w.parts] == [0, 20, 40]
        pl = placements(w)
        assert [(off, n) for _, off, n in pl] == [(0, 1080), (1080, 1080), (2160, 540)]
        assert all(p.buffer.size % 4 == 0 and p.buffer.size <= 1100 and p.buffer.kind == gpu.WEIGHTS
                   for p in w.parts)
        with pytest.raises(ValueError):
            upload_weight(device, w, bytes(rows * 54 - 1))
    finally:
        for p in w.parts:
            device.destroy(p.buffer)
    one = alloc_weight(device, "whole", t, rows, cols)
    assert len(one.parts) == 1 and one.parts[0].buffer.size == 2700 and placements(one) == [(one.parts[0], 0, 2700)]
    device.destroy(one.parts[0].buffer)
    with pytest.raises(gpu.GpuError, match="binding limit"):
        alloc_weight(device, "big", t, rows, cols, max_binding=50)
    with pytest.raises(gpu.GpuError, match="not supported"):
        alloc_weight(device, "q8k", BY_NAME["Q8_K"], 4, 256)
    with pytest.raises(ValueError):
        alloc_weight(device, "odd", BY_NAME["Q4_K"], 4, 100)


# -- per type ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", qo.TYPES)
def test_matvec(device, kernels, name):
    raw, W = tensor(name)
    x = rand(W.shape[1])
    with Rig(device, kernels) as r:
        y = r.matvec(r.weight(name, raw), x)
    assert qo.dot_err(y, W, x) <= DOT_TOL


@pytest.mark.parametrize("name", qo.TYPES)
def test_matvec_without_subgroups(device_nosg, kernels_nosg, name):
    assert "subgroups" not in device_nosg.info.features
    raw, W = tensor(name)
    x = rand(W.shape[1], seed=1)
    with Rig(device_nosg, kernels_nosg) as r:
        y = r.matvec(r.weight(name, raw), x)
    assert qo.dot_err(y, W, x) <= DOT_TOL


@pytest.mark.parametrize("sg", [True, False])
@pytest.mark.parametrize("name,wg", [("Q4_K", 4), ("Q4_K", 32), ("Q4_K", 256), ("Q6_K", 16), ("Q4_K", 16),
                                     ("Q2_K", 16), ("Q3_K", 4), ("IQ4_XS", 4), ("IQ4_XS", 256)])
def test_matvec_workgroup_sizes(device, kernels, device_nosg, kernels_nosg, sg, name, wg):
    """The GPU's workgroup sizes (32 threads for a tall head, 16 for a tall head of short K-quant rows, 256 for long
    rows; this CPU adapter picks 64..256 by row length; SwiftShader 4) on both reduction paths."""
    raw, W = tensor(name)
    x = rand(W.shape[1], seed=2)
    with Rig(*((device, kernels) if sg else (device_nosg, kernels_nosg))) as r:
        y = r.matvec(r.weight(name, raw), x, wg=wg)
    assert qo.dot_err(y, W, x) <= DOT_TOL
    assert any(f"WG={wg}" in k.label.split() for k in r.kernels._cache.values())


@pytest.mark.parametrize("name,x_at,loop", [("Q4_K", 0, "matvec_k.wgsl"), ("Q5_K", 8, "matvec_k.wgsl"),
                                           ("Q6_K", 0, "matvec_q6_k.wgsl"), ("Q6_K", 3, "matvec_groups.wgsl"),
                                           ("Q4_K", 2, "matvec_groups.wgsl"), ("Q8_0", 0, "matvec_groups.wgsl"),
                                           ("Q2_K", 0, "matvec_q2_k.wgsl"), ("Q3_K", 4, "matvec_q3_k.wgsl"),
                                           ("IQ4_XS", 0, "matvec_iq4_xs.wgsl"), ("Q3_K", 2, "matvec_groups.wgsl"),
                                           *((t, 0, "matvec_iq.wgsl") for t in IQ_GRID),
                                           ("IQ2_S", 3, "matvec_groups.wgsl"), ("IQ1_M", 2, "matvec_groups.wgsl")])
def test_matvec_loop_choice(device, name, x_at, loop):
    """K types take their own loop where the input offset allows vec4 reads, else the group loop: each of the
    two stays tested above, so this pins which one a shape gets."""
    raw, W = tensor(name)
    kc = KernelCache(device)
    x = rand(W.shape[1])
    with Rig(device, kc) as r:
        xb = r.buffer(qo.f32(np.concatenate([np.zeros(x_at), x])), "x")
        yb = r.buffer(4 * W.shape[0], "y")
        r.run(matvec(device, kc, r.weight(name, raw), xb, yb, x_offset=x_at), 1)
        assert qo.dot_err(r.read(yb, W.shape[0]), W, x) <= DOT_TOL
    assert [f"LOOP={loop}" in k.label.split() for k in kc._cache.values()] == [True]


@pytest.mark.parametrize("sg", [True, False])
@pytest.mark.parametrize("name", list(IQ_GRID))
def test_matvec_grid_loop(device, kernels, device_nosg, kernels_nosg, name, sg):
    """The grid types' own loop on both reduction paths, at the workgroup size matvec_wg gives it and at 16 threads
    (a tall head of short rows)."""
    raw, W = tensor(name)
    x = rand(W.shape[1], seed=16)
    with Rig(*((device, kernels) if sg else (device_nosg, kernels_nosg))) as r:
        w = r.weight(name, raw)
        for wg in (None, 16):
            assert qo.dot_err(r.matvec(w, x, wg=wg), W, x) <= DOT_TOL, wg
    labels = [k.label.split() for k in r.kernels._cache.values()]
    ours = [lab for lab in labels if {f"IQ={name}", "LOOP=matvec_iq.wgsl", "IN=in_plain"} <= set(lab)]
    assert any("WG=16" in lab for lab in ours) and any("WG=16" not in lab for lab in ours)


def test_grid_table_once_per_owner(device):
    """The grid loop's grid is one CONSTANT buffer per grid and owner (not one per op), freed with its owner's
    buffers and made again after."""
    raw, W = tensor("IQ2_S")
    x = rand(W.shape[1], seed=17)
    kc = KernelCache(device)
    owner = object()
    with Rig(device, kc) as r:
        w = r.weight("IQ2_S", raw)
        with device.owning(owner):
            for _ in range(2):
                assert qo.dot_err(r.matvec(w, x), W, x) <= DOT_TOL
        grids = [b for b in device.owned_by(owner) if b.label == "IQ2S grid"]
        assert len(grids) == 1 and grids[0].kind == gpu.CONSTANT and grids[0].size == 1024 * 8
        device.free(owner)
        with device.owning(owner):
            assert qo.dot_err(r.matvec(w, x), W, x) <= DOT_TOL
        assert [b.label for b in device.owned_by(owner)].count("IQ2S grid") == 1
        device.free(owner)


def test_matvec_wg_rule():
    from lab.ops.matmul import matvec_wg
    assert matvec_wg(576, 49152) == 32 and matvec_wg(1536, 576) == 256 and matvec_wg(576, 960) == 128
    assert matvec_wg(576, 49152, software=True) == 8 and matvec_wg(4096, 14336, software=True, type_name="Q4_K") == 8
    assert matvec_wg(4096, 14336, type_name="Q4_K") == 64 and matvec_wg(4864, 896, type_name="Q6_K") == 128
    # tall heads of short rows: as many threads as a row has units of the type's loop
    assert matvec_wg(1024, 248320, type_name="Q6_K") == 16 and matvec_wg(2048, 128256, type_name="Q6_K") == 32
    assert matvec_wg(4096, 128256, type_name="Q6_K") == 64 and matvec_wg(1024, 151936, type_name="Q4_K") == 32
    assert matvec_wg(576, 49152, software=True, swiftshader=True) == 4
    assert matvec_wg(4096, 14336, software=True, type_name="Q4_K", swiftshader=True) == 4
    # the grid types' loop: 32-value units, as the K loops
    assert matvec_wg(4096, 14336, type_name="IQ2_XXS") == 64 and matvec_wg(4096, 896, type_name="IQ3_S") == 128
    assert matvec_wg(512, 151936, type_name="IQ1_M") == 16
    # Q2_K and Q3_K step 64 values, as Q6_K; IQ4_XS 32
    assert matvec_wg(2048, 128256, type_name="Q3_K") == 32 and matvec_wg(2048, 128256, type_name="IQ4_XS") == 64
    assert matvec_wg(1024, 151936, type_name="Q2_K") == 16 and matvec_wg(4096, 896, type_name="Q2_K") == 128


def test_subgroup_path_is_used(device, kernels):
    if "subgroups" not in device.info.features:
        pytest.skip("this adapter has no subgroups")
    raw, W = tensor("Q4_0")
    with Rig(device, kernels) as r:
        r.matvec(r.weight("Q4_0", raw), rand(W.shape[1]))
    labels = [k.label for k in kernels._cache.values() if k.label.startswith("matvec")]
    assert labels and all(" SG= " in lab and "NOSG=// " in lab for lab in labels)


def test_matmul_kernel_follows_the_adapter(device):
    """A CPU adapter (SwiftShader, lavapipe) takes matmul_lanes.wgsl by default, a GPU matmul.wgsl's tiles
    (lab.ops.matmul.matmul's docstring has the measurements)."""
    raw, W = tensor("Q4_0")
    kc = KernelCache(device)
    X = rand(5, W.shape[1])
    with Rig(device, kc) as r:
        assert qo.dot_err(r.matmul(r.weight("Q4_0", raw), X), W, X) <= DOT_TOL
    families = {k.label.split(":")[0] for k in kc._cache.values() if k.label.startswith("matmul")}
    assert families == {"matmul_lanes" if device.info.software else "matmul"}, families


@pytest.mark.parametrize("lanes", [False, True], ids=["tiles", "lanes"])   # lanes: a CPU adapter's kernel
@pytest.mark.parametrize("name", qo.TYPES)
def test_matmul(device, kernels, name, lanes):
    raw, W = tensor(name)
    with Rig(device, kernels) as r:
        w = r.weight(name, raw)
        for t in (1, 5, 37, 70):
            X = rand(t, W.shape[1], seed=t)
            Y = r.matmul(w, X, lanes=lanes)
            assert qo.dot_err(Y, W, X) <= DOT_TOL, f"t={t}"


# -- options: accumulate, offsets, strides, token count ------------------------------------------

def test_matvec_accumulate_and_offsets(device, kernels):
    raw, W = tensor("Q5_1")
    rows, cols = W.shape
    x = rand(cols, seed=3)
    y0 = rand(rows + 20, seed=4)
    with Rig(device, kernels) as r:
        w = r.weight("Q5_1", raw)
        y = r.matvec(w, x, y0=y0, x_offset=5, y_offset=7, accumulate=True, y_len=rows + 20)
        y_over = r.matvec(w, x, y0=y0, x_offset=5, y_offset=7, accumulate=False, y_len=rows + 20)
    np.testing.assert_array_equal(y[:7], y0[:7])                  # outside the slice: untouched
    np.testing.assert_array_equal(y[7 + rows:], y0[7 + rows:])
    # y0 + W x is rounded once more at the magnitude of y0 (~1, against sum |W||x| ~ 50): twice the tolerance
    assert qo.dot_err(y[7:7 + rows] - y0[7:7 + rows], W, x) <= DOT_TOL * 2
    assert qo.dot_err(y_over[7:7 + rows], W, x) <= DOT_TOL
    np.testing.assert_array_equal(y_over[:7], y0[:7])


@pytest.mark.parametrize("lanes", [False, True], ids=["tiles", "lanes"])
def test_matmul_accumulate_and_token_count(device, kernels, lanes):
    raw, W = tensor("Q4_K")
    rows, cols = W.shape
    t, mt = 5, 9
    X = rand(t, cols, seed=5)
    y0 = rand(mt * rows, seed=6)
    with Rig(device, kernels) as r:
        Y = r.matmul(r.weight("Q4_K", raw), X, y0=y0, accumulate=True, max_tokens=mt, lanes=lanes)
    Y0 = y0.reshape(mt, rows)
    np.testing.assert_array_equal(Y[t:], Y0[t:])                  # tokens past n_tokens untouched
    assert qo.dot_err(Y[:t] - Y0[:t], W, X) <= DOT_TOL * 2         # as in the matvec case


@pytest.mark.parametrize("lanes", [False, True], ids=["tiles", "lanes"])
def test_matmul_strides_into_fused_buffer(device, kernels, lanes):
    """Q and K projections writing side by side into one [t, q+k] buffer, reading a strided input."""
    rq, wq = tensor("Q8_0", rows=64, seed=1)
    rk, wk = tensor("Q8_0", rows=40, seed=2)
    cols = wq.shape[1]
    t, xs, ys = 6, cols + 3, 64 + 40
    X = rand(t, cols, seed=7)
    xbuf = np.full((t, xs), 1e6, np.float32)
    xbuf[:, 2:2 + cols] = X                    # token i at 2 + i * xs
    flat = xbuf.ravel()
    with Rig(device, kernels) as r:
        q, k = r.weight("Q8_0", rq), r.weight("Q8_0", rk)
        xb = r.buffer(qo.f32(flat), "x")
        yb = r.buffer(t * ys * 4, "qk")
        step = r.step(t)
        ops = (matmul(device, r.kernels, q, xb, yb, step, max_tokens=t, x_offset=2, x_stride=xs, y_stride=ys,
                      lanes=lanes)
               + matmul(device, r.kernels, k, xb, yb, step, max_tokens=t, x_offset=2, x_stride=xs,
                        y_offset=64, y_stride=ys, lanes=lanes))
        r.run(ops, t)
        Y = r.read(yb, t * ys).reshape(t, ys)
    assert qo.dot_err(Y[:, :64], wq, X) <= DOT_TOL
    assert qo.dot_err(Y[:, 64:], wk, X) <= DOT_TOL


# -- fused prologues and epilogue (decode) -------------------------------------------------------

def _fused_rig(r, name, raw, cols, x, x_at=3, **kw):
    """The input at offset x_at: 3 takes the group loop for every type, 4 the K types' own loops, which read x
    as vec4s (lab/ops/matmul.py MATVEC_LOOPS)."""
    xb = r.buffer(qo.f32(np.concatenate([np.full(x_at, 1e6), x])), "x")
    yb = r.buffer(4 * raw.shape[0], "y")
    extra = {}
    if "norm" in kw:
        nw = r.buffer(qo.f32(kw.pop("norm")), "norm w")
        xnb = r.buffer(qo.f32(np.full(cols + 2, np.nan)), "xn")
        extra = {"norm": (nw, 1e-5), "xn": xnb, "xn_offset": 2}
    if "bias" in kw:
        extra["bias"] = r.buffer(qo.f32(np.concatenate([np.zeros(4), kw.pop("bias")])), "bias")
        extra["bias_offset"] = 4
    r.run(matvec(r.device, r.kernels, r.weight(name, raw), xb, yb, x_offset=x_at, **extra, **kw), 1)
    xn = r.read(extra["xn"], cols + 2) if "xn" in extra else None
    return r.read(yb, raw.shape[0]), xn


@pytest.mark.parametrize("name,wg,x_at", [("Q4_1", None, 3), ("Q6_K", None, 3), ("Q4_1", 128, 3), ("Q6_K", 256, 3),
                                          ("Q4_K", None, 4), ("Q5_K", 128, 4), ("Q6_K", None, 4),
                                          ("IQ2_S", None, 4), ("IQ3_XXS", 16, 4), ("IQ1_M", None, 4),
                                          ("Q2_K", None, 4), ("Q3_K", 16, 4), ("IQ4_XS", None, 4)])
@pytest.mark.parametrize("sg", [True, False])
def test_matvec_norm_prologue(device, kernels, device_nosg, kernels_nosg, name, wg, x_at, sg):
    """RMSNorm folded into the matvec: every workgroup computes the mean of squares itself (at this CPU
    adapter's workgroup size and at the GPU's)."""
    raw, W = tensor(name)
    cols = W.shape[1]
    x = rand(cols, seed=11) * 3 + 0.5                  # mean not 0, rms not 1: a missing norm shows
    nw = rand(cols, seed=12)
    xn_ref = (x.astype(np.float64) / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5)) * nw
    with Rig(*((device, kernels) if sg else (device_nosg, kernels_nosg))) as r:
        y, xn = _fused_rig(r, name, raw, cols, x, x_at, norm=nw, wg=wg)
    assert qo.dot_err(y, W, xn_ref) <= DOT_TOL
    # the stored normed input: a few f32 roundings of values of size |xn| (rel 1e-6), untouched around it
    np.testing.assert_allclose(xn[2:], xn_ref, rtol=0, atol=1e-6 * np.max(np.abs(xn_ref)))
    assert np.isnan(xn[:2]).all()


@pytest.mark.parametrize("name,x_at", [("Q5_0", 3), ("Q4_K", 4), ("Q6_K", 4), ("IQ2_XXS", 4), ("IQ3_S", 4),
                                       ("IQ1_S", 4), ("Q2_K", 4), ("Q3_K", 4), ("IQ4_XS", 4)])
@pytest.mark.parametrize("glu", ["swiglu", "geglu"])
def test_matvec_glu_prologue(device, kernels, glu, name, x_at):
    """act(gate) * up folded into the down projection's input, from a [gate | up] row."""
    raw, W = tensor(name)
    cols = W.shape[1]
    gu = rand(2 * cols, seed=13) * 2
    g, u = gu[:cols].astype(np.float64), gu[cols:].astype(np.float64)
    act = g / (1 + np.exp(-g)) if glu == "swiglu" else \
        0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    with Rig(device, kernels) as r:
        y, _ = _fused_rig(r, name, raw, cols, gu, x_at, glu=glu)
    assert qo.dot_err(y, W, act * u) <= DOT_TOL


@pytest.mark.parametrize("sg", [True, False])
@pytest.mark.parametrize("name", list(IQ_GRID))
def test_matvec_grid_loop_fused(device, kernels, device_nosg, kernels_nosg, name, sg):
    """The grid types' own loop with the RMSNorm prologue, the GLU prologue, and a weight split over three bindings
    (the same sums as whole)."""
    raw, W = tensor(name)
    cols = W.shape[1]
    x = rand(cols, seed=11) * 3 + 0.5
    nw = rand(cols, seed=12)
    xn_ref = (x.astype(np.float64) / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5)) * nw
    gu = rand(2 * cols, seed=13) * 2
    g, u = gu[:cols].astype(np.float64), gu[cols:].astype(np.float64)
    with Rig(*((device, kernels) if sg else (device_nosg, kernels_nosg))) as r:
        y, xn = _fused_rig(r, name, raw, cols, x, 4, norm=nw)
        assert qo.dot_err(y, W, xn_ref) <= DOT_TOL
        np.testing.assert_allclose(xn[2:], xn_ref, rtol=0, atol=1e-6 * np.max(np.abs(xn_ref)))
        y, _ = _fused_rig(r, name, raw, cols, gu, 4, glu="swiglu")
        assert qo.dot_err(y, W, g / (1 + np.exp(-g)) * u) <= DOT_TOL
        split = r.weight(name, raw, max_binding=130 * raw.shape[1] + 3)
        assert [p.n_rows for p in split.parts] == [130, 130, 73]
        np.testing.assert_array_equal(r.matvec(split, x), r.matvec(r.weight(name, raw), x))
    ours = (f"IQ={name}", "LOOP=matvec_iq.wgsl", "NORM=", "IN=in_norm")
    assert any(all(h in k.label.split() for h in ours) for k in r.kernels._cache.values())


@pytest.mark.parametrize("name,x_at", [("Q8_0", 3), ("Q5_K", 4), ("Q3_K", 4)])
def test_matvec_bias_epilogue_and_accumulate(device, kernels, name, x_at):
    raw, W = tensor(name)
    rows, cols = W.shape
    x, b = rand(cols, seed=14), rand(rows, seed=15) * 4
    with Rig(device, kernels) as r:
        y, _ = _fused_rig(r, name, raw, cols, x, x_at, bias=b)
    # the bias adds one rounding at its own magnitude (~4, against sum |W||x| ~ 50): twice the tolerance
    assert qo.dot_err(y - b, W, x) <= DOT_TOL * 2
    with pytest.raises(ValueError):                    # one input prologue at a time
        with Rig(device, kernels) as r:
            _fused_rig(r, name, raw, cols, np.concatenate([x, x]), norm=x, glu="swiglu")


def _rotate(y, pos, n_heads, hd, n_rot, freqs, sign=1.0, neox=False):
    """RoPE of the first n_heads heads of a row, adjacent pairs (2i, 2i + 1) or NeoX's (i, i + n_rot / 2) (sign -1:
    the inverse rotation), float64."""
    y = np.array(y, np.float64)
    th = sign * pos * np.asarray(freqs, np.float64)
    c, s = np.cos(th), np.sin(th)
    i = np.arange(n_rot // 2)
    for h in range(n_heads):
        a = h * hd + (i if neox else 2 * i)
        b = a + n_rot // 2 if neox else a + 1
        x0, x1 = y[a].copy(), y[b].copy()
        y[a], y[b] = x0 * c - x1 * s, x0 * s + x1 * c
    return y


@pytest.mark.parametrize("name,x_at", [("Q8_0", 3), ("Q4_K", 4), ("F16", 4)])
@pytest.mark.parametrize("nh,nkv,hd,n_rot,pos,parts", [(4, 2, 16, 16, 37, 1), (3, 1, 32, 16, 5, 1),
                                                        (4, 2, 16, 16, 41, 3), (2, 2, 16, 16, 0, 1)])
def test_matvec_rope_epilogue(device, kernels, name, x_at, nh, nkv, hd, n_rot, pos, parts):
    """Decode's fused [q | k | v] projection with RoPE in its epilogue (adjacent pairs, partial rotary, GQA, a weight
    in several parts, position 0): Q and K leave rotated, K and V land in cache row pos; the without_kv twin leaves
    the caches alone."""
    check_matvec_rope_epilogue(device, kernels, name, x_at, nh, nkv, hd, n_rot, pos, parts)


@pytest.mark.parametrize("name,x_at", [("Q5_0", 3), ("Q4_K", 4)])
@pytest.mark.parametrize("nh,nkv,hd,n_rot,pos,parts", [(4, 2, 16, 16, 37, 1), (3, 1, 32, 16, 5, 1),
                                                        (4, 2, 16, 16, 41, 3), (2, 2, 16, 16, 0, 1),
                                                        (3, 1, 20, 8, 9, 2)])
def test_matvec_rope_epilogue_neox(device, kernels, name, x_at, nh, nkv, hd, n_rot, pos, parts):
    """The same with NeoX pairs (i, i + n_rot / 2) (Qwen2.5, phi3): each workgroup takes two pairs of a head's rotated
    rows, half the rotation apart, the rest in place; partial rotary, parts starting on heads."""
    check_matvec_rope_epilogue(device, kernels, name, x_at, nh, nkv, hd, n_rot, pos, parts, neox=True)


def check_matvec_rope_epilogue(device, kernels, name, x_at, nh, nkv, hd, n_rot, pos, parts, kv="f32", neox=False):
    """test_matvec_rope_epilogue's case; kv="f16" (tests/kernels/test_kv_f16.py): f16 caches, each written value
    within one f16 step of the row's (WGSL rounds a store to either neighbour); neox: NeoX pairs, the parts whole
    heads."""
    from lab.ops import KV_WRITE, make_step, step_bytes
    from lab.ops.rope import QkvRope, frequencies
    rows, cols, n_ctx = (nh + 2 * nkv) * hd, 256, 48
    raw = qo.random_tensor(name, rows, cols, seed=20)
    W = qo.dequant(raw, name)
    x = rand(cols, seed=21) * 2 + 0.3
    nw = rand(cols, seed=22)
    xn_ref = (x.astype(np.float64) / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5)) * nw
    freqs = frequencies(n_rot, 10000.0, 1.0, [1.0 + 0.5 * i for i in range(n_rot // 2)])
    kvd = nkv * hd
    rng = np.random.default_rng(23)
    store = np.float16 if kv == "f16" else np.float32
    k0, v0 = (rng.standard_normal((n_ctx, kvd)).astype(store) for _ in range(2))
    with Rig(device, kernels) as r:
        unit = hd if neox else 2                                          # whole pairs (NeoX: whole heads) a part
        per = ((rows + parts - 1) // parts + unit - 1) // unit * unit
        limit = None if parts == 1 else per * raw.shape[1]
        w = r.weight(name, raw, max_binding=limit)
        assert len(w.parts) == parts
        xb = r.buffer(qo.f32(np.concatenate([np.full(x_at, 1e6), x])), "x")
        yb = r.buffer(4 * rows, "y")
        nwb = r.buffer(qo.f32(nw), "norm w")
        xnb = r.buffer(4 * cols, "xn")
        kb, vb = r.buffer(k0.tobytes(), "k cache"), r.buffer(v0.tobytes(), "v cache")
        step = make_step(device, "t.step")
        spec = QkvRope(nh, nkv, hd, n_rot, tuple(freqs), step, kb, vb, n_ctx, kv, neox=neox)
        ops = matvec(device, kernels, w, xb, yb, x_offset=x_at, norm=(nwb, 1e-5), xn=xnb, rope=spec)
        assert all(op.role == KV_WRITE and op.without_kv is not None for op in ops)
        writes = [(step, 0, step_bytes(pos, 1, n_ctx))]
        device.run([op.without_kv.at(1) for op in ops], writes=writes)
        y_plain = r.read(yb, rows)
        assert device.read_sync(kb) == k0.tobytes() and device.read_sync(vb) == v0.tobytes()
        device.run([op.at(1) for op in ops], writes=writes)
        y = r.read(yb, rows)
        kc = np.frombuffer(device.read_sync(kb), store).reshape(n_ctx, kvd)
        vc = np.frombuffer(device.read_sync(vb), store).reshape(n_ctx, kvd)
        device.destroy(step)
    np.testing.assert_array_equal(y, y_plain)
    # rotated back with exact angles, the row is the projection: its rounding, plus the angle's (theta = pos * f in f32)
    assert qo.dot_err(_rotate(y, pos, nh + nkv, hd, n_rot, freqs, -1.0, neox), W, xn_ref) <= 2 * DOT_TOL
    q_end = nh * hd
    for got, want in ((kc[pos], y[q_end:q_end + kvd]), (vc[pos], y[q_end + kvd:])):   # the row's values, copied
        step = np.spacing(np.abs(want.astype(np.float16))).astype(np.float64) if kv == "f16" else 0.0
        assert np.all(np.abs(got.astype(np.float64) - want) <= step), "cache row differs from the projection's"

    others = np.arange(n_ctx) != pos
    np.testing.assert_array_equal(kc[others], k0[others])
    np.testing.assert_array_equal(vc[others], v0[others])


def test_matvec_rope_epilogue_refuses_split_pairs(device, kernels):
    from lab.ops.rope import QkvRope
    raw, _ = tensor("Q8_0", rows=48, cols=96)
    with Rig(device, kernels) as r:
        w = r.weight("Q8_0", raw)
        b = r.buffer(4 * 256, "any")
        spec = QkvRope(2, 1, 12, 12, tuple([1.0] * 6), b, b, b, 4)
        with pytest.raises(ValueError, match="whole pairs"):
            matvec(device, kernels, w, b, b, y_offset=1, rope=spec)
        neox = QkvRope(2, 1, 12, 12, tuple([1.0] * 6), b, b, b, 4, neox=True)
        with pytest.raises(ValueError, match="starting on a head"):     # a part from mid-head
            matvec(device, kernels, w, b, b, y_offset=2, rope=neox)
        with pytest.raises(ValueError, match="multiples of 4"):         # n_rot 6: pairs of odd count
            matvec(device, kernels, w, b, b, rope=QkvRope(2, 1, 12, 6, tuple([1.0] * 3), b, b, b, 4, neox=True))


# -- weights split over several bindings ---------------------------------------------------------

@pytest.mark.parametrize("name", ["Q4_K", "Q5_0", "F16", "IQ2_XS", "IQ3_S", "Q2_K", "Q3_K", "IQ4_XS"])
def test_split_weight_gives_identical_results(device, kernels, name):
    raw, W = tensor(name)
    rb = raw.shape[1]
    limit = 130 * rb + 3                       # parts of 130, 130, 73 rows
    x = rand(W.shape[1], seed=8)
    X = rand(37, W.shape[1], seed=9)
    with Rig(device, kernels) as r:
        whole = r.weight(name, raw)
        split = r.weight(name, raw, max_binding=limit)
        assert [p.n_rows for p in split.parts] == [130, 130, 73]
        np.testing.assert_array_equal(r.matvec(split, x), r.matvec(whole, x))
        np.testing.assert_array_equal(r.matmul(split, X), r.matmul(whole, X))


def test_matvec_grid_folds_past_65535_workgroups(device, kernels):
    """More than 4 * 65535 rows: the matvec grid folds into y (a 262k vocabulary's head does this)."""
    rows = 4 * 65535 + 61
    raw, W = tensor("Q4_0", rows=rows, cols=32, seed=3)
    x = rand(32, seed=10)
    with Rig(device, kernels) as r:
        y = r.matvec(r.weight("Q4_0", raw), x)
    assert qo.dot_err(y, W, x) <= DOT_TOL


# -- real tensors ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return qo.real_tensors(smollm2_path)


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return qo.real_tensors(gemma_path)


def _real(device, kernels, tensors, tname, row_slice=slice(None), t=5):
    name, data = tensors[tname]
    raw = np.ascontiguousarray(data[row_slice])
    W = qo.dequant(raw, name)
    x = rand(W.shape[1], seed=11)
    X = rand(t, W.shape[1], seed=12)
    with Rig(device, kernels) as r:
        w = r.weight(name, raw)
        y = r.matvec(w, x)
        Y = r.matmul(w, X)
    assert qo.dot_err(y, W, x) <= DOT_TOL, tname
    assert qo.dot_err(Y, W, X) <= DOT_TOL, tname
    return name


def test_real_smollm2(device, kernels, smollm2):
    assert _real(device, kernels, smollm2, "blk.0.attn_q.weight") == "Q4_1"         # 576 x 576
    assert _real(device, kernels, smollm2, "blk.0.ffn_down.weight") == "Q4_1"       # 576 x 1536
    # token_embd as an output head: 2,000 of its 49,152 rows
    assert _real(device, kernels, smollm2, "token_embd.weight", slice(1000, 3000)) == "Q8_0"


def test_real_gemma_k_quants(device, kernels, gemma):
    names = {t: ty for t, (ty, _) in gemma.items()}
    seen = set()
    for want in ("Q4_K", "Q6_K", "Q5_0"):
        tname = next(n for n, ty in names.items() if ty == want and n.startswith("blk."))
        seen.add(_real(device, kernels, gemma, tname, slice(0, 300)))
    assert seen == {"Q4_K", "Q6_K", "Q5_0"}


# -- the tensor-core GEMM's input (wgsl/q8_rows.wgsl; the GEMM itself runs only in the H200 page:
#    tests/browser/test_kernels_in_worker.py test_int8_matrix_case) --------------------------------------------------

def test_q8_rows_quantizes_as_numpy(device, kernels):
    """d = max|x| / 127 per block of 32 (2 ulp: the division), q = round(x * 127 / max|x|) within 1 and off by one
    for at most 1% of values (a value near .5 may round the other way when the reciprocal differs in its last bit),
    d * sum q as the second field; a zero block gives zeros; rows past t are not written."""
    from lab.ops.matmul import i8_scratch_bytes, q8_rows
    t, cols, x_at, xs = 7, 160, 3, 170
    rng = np.random.default_rng(9)
    X = (rng.standard_normal((t, cols)) * rng.uniform(0.1, 5.0, (t, 1))).astype(np.float32)
    X[1, :32] = 0.0
    X[2, 40] = 300.0
    buf = np.full((t, xs), 1e6, np.float32)
    buf[:, x_at:x_at + cols] = X
    with Rig(device, kernels) as r:
        q_bytes, d_bytes = i8_scratch_bytes(t + 1, cols)
        xb = r.buffer(qo.f32(np.concatenate([np.full(x_at, 1e6), buf.ravel()])), "x")
        xq, xd = r.buffer(q_bytes, "xq"), r.buffer(d_bytes, "xd")
        r.run(q8_rows(device, r.kernels, xb, xq, xd, r.step(t), cols, x_offset=2 * x_at, x_stride=xs), t)
        q = np.frombuffer(r.read(xq, q_bytes // 4).tobytes(), np.int8).reshape(-1, cols)
        dd = r.read(xd, d_bytes // 4).reshape(-1, cols // 32, 2)
    q_np, d_np = qo.q8_blocks(X)
    off = np.abs(q[:t].reshape(t, -1, 32) - q_np)
    assert off.max() <= 1 and off.mean() <= 0.01, (off.max(), off.mean())
    np.testing.assert_allclose(dd[:t, :, 0], d_np, rtol=2 * np.finfo(np.float32).eps, atol=0)
    np.testing.assert_allclose(dd[:t, :, 1], dd[:t, :, 0] * q[:t].reshape(t, -1, 32).sum(2), rtol=1e-6, atol=0)
    assert not q[1, :32].any() and not dd[1, 0].any()                  # the zero block
    assert not q[t:].any() and not dd[t:].any()                         # past t: untouched (zero-filled)
