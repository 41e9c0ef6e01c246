"""The f16 KV cache (lab/ops/attention.py KV_TYPES "f16", halves two to a u32 word in core WGSL): every kernel that
writes a cache (kv_write, rope's fused write, matvec's rotary epilogue) and every one that reads it (each attention
entry, the KV panel's norms), natively; also on the same adapter with shader-f16 turned off, which it does not need.

What is held: a write stores each value within one f16 step of the f32 one (WGSL lets an adapter round a store to
either neighbour, so not bit for bit) and leaves every other row's bytes; attention over an f16 cache is the f64
oracle over the values the cache holds, within test_attention.py's f32 bound (`tolerance`: the arithmetic is f32
either way, only the stored values are rounded). The f16 rounding itself is not a tolerance here: the oracle reads
the same rounded values. Its size on a model is tests/engine/test_f16_cache.py's.

A kernel that read an f16 cache as f32 (the type left out of its constants) is caught (`test_f32_view_is_caught`).
"""

from __future__ import annotations

import numpy as np
import pytest
from checks import check_rope, env1  # noqa: F401
from test_attention import GEMMA, LONG, MHA, QWEN, SMOL, assert_ok, out_error, passes, run_case, tolerance
from test_matmul import check_matvec_rope_epilogue

from lab import gpu
from lab.gpu.shaders import KernelCache
from lab.ops import attention as A


def f16_case(device, kernels, **kw):
    return run_case(device, kernels, kv="f16", **kw)


# --------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("shape,pos", [(SMOL, 0), (SMOL, 300), (QWEN, 17), (GEMMA, 300), (MHA, 40)],
                         ids=["smol0", "smol300", "qwen", "gemma", "mha"])
def test_decode_split(device, kernels, shape, pos):
    assert_ok(f16_case(device, kernels, **shape, pos=pos, t=1, n_ctx=320, mode="decode", seed=pos))


def test_decode_split_long_context(device, kernels):
    """Qwen2.5 at 8k keys of the bench's cache: 131 chunks merged by the combine, a part-filled last chunk."""
    shape, n_ctx, pos, window = LONG[0]
    assert_ok(f16_case(device, kernels, **shape, pos=pos, t=1, n_ctx=n_ctx, mode="decode", window=window, seed=3))


@pytest.mark.parametrize("shape,pos", [(SMOL, 63), (SMOL, 150), (GEMMA, 300)], ids=["smol63", "smol150", "gemma"])
def test_decode_whole(device, kernels, shape, pos):
    assert_ok(f16_case(device, kernels, **shape, pos=pos, t=1, n_ctx=320, mode="whole", seed=pos))


@pytest.mark.parametrize("shape", [SMOL, QWEN, GEMMA, MHA], ids=["smol", "qwen", "gemma", "mha"])
def test_prefill(device, kernels, shape):
    assert_ok(f16_case(device, kernels, **shape, pos=11, t=5, mode="prefill", seed=4))


@pytest.mark.parametrize("shape", [SMOL, GEMMA], ids=["smol", "gemma"])
def test_prefill_narrow_tiles(device, kernels, shape):
    assert_ok(f16_case(device, kernels, **shape, pos=11, t=5, mode="prefill", seed=5, narrow=True))


@pytest.mark.parametrize("shape", [SMOL, QWEN, GEMMA], ids=["smol", "qwen", "gemma"])
def test_prefill_rows(device, kernels, shape):
    if "subgroups" not in device.info.features:
        pytest.skip("prefill_rows needs subgroups")
    assert_ok(f16_case(device, kernels, **shape, pos=3, t=40, mode="prefill", seed=6, rows=True))


@pytest.mark.parametrize("mode,t,pos", [("decode", 1, 17), ("prefill", 7, 9)])
def test_probe_window_softcap(device, kernels, mode, t, pos):
    """The probe variant (decode_probs reads K too), a window and a soft-cap with scores near 30."""
    assert_ok(f16_case(device, kernels, **SMOL, pos=pos, t=t, mode=mode, probe=True, seed=7))
    assert_ok(f16_case(device, kernels, **SMOL, pos=pos, t=t, mode=mode, window=4, softcap=30.0, big=30.0, seed=8))


def test_cache_is_half_the_bytes():
    assert A.kv_cache_bytes(2048, 3, 64, "f16") * 2 == A.kv_cache_bytes(2048, 3, 64) == 4 * 2048 * 3 * 64
    with pytest.raises(KeyError):
        A.kv_cache_bytes(64, 1, 64, "bf16")


class F32View(KernelCache):
    """Attention built as if the cache held f32 (its KV constants dropped): what a builder that forgot the type does."""

    def get(self, name, entry="main", **consts):
        if name == "attention":
            consts = {**consts, **A.kv_consts("f32")}
        return super().get(name, entry, **consts)


def test_f32_view_is_caught(device):
    """The case passes with the right kernel; read as f32 (a word of two halves as one float, half the rows), the
    same case misses by orders of magnitude past the bound, or is refused for its short cache."""
    case = dict(**SMOL, pos=40, t=1, n_ctx=160, mode="decode", seed=9)
    assert passes(f16_case(device, KernelCache(device), **case))
    try:
        r = f16_case(device, F32View(device), **case)
    except (gpu.GpuError, ValueError, RuntimeError) as exc:    # a binding smaller than the f32 layout wants
        print(f"\nf32 view refused: {exc}")
        return
    err = out_error(r)
    print(f"\nf32 view of an f16 cache: error {err:.3g} of max|V| (tolerance {tolerance(r):.3g})")
    assert not passes(r)


def test_without_shader_f16():
    """Nothing of it needs the f16 extension: the same cases on the adapter with shader-f16 left off."""
    from lab.host.native import open_native
    dev = open_native(disable=("shader-f16",))
    assert "shader-f16" not in dev.info.features
    kernels = KernelCache(dev)
    assert_ok(f16_case(dev, kernels, **SMOL, pos=70, t=1, n_ctx=160, mode="decode", seed=11))
    assert_ok(f16_case(dev, kernels, **QWEN, pos=9, t=7, mode="prefill", seed=12))
    with pytest.raises(ValueError, match="one of f32, f16"):
        A.kv_consts("bf16")


# --------------------------------------------------------------------------------------------- cache writes
@pytest.mark.parametrize("mode", ["adjacent", "neox"])
@pytest.mark.parametrize("t,pos,heads", [(4, 13, (4, 2)), (1, 21, (6, 2)), (5, 30, (4, 1))])
def test_rope_cache_write(env1, mode, t, pos, heads):  # noqa: F811
    """rope's fused write (prefill and decode rows; the last case runs past the 32-row cache, whose rows are dropped)."""
    check_rope(env1, mode, t=t, pos=pos, head_dim=32, fused=heads, n_ctx=32, kv="f16")


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("name,pos,parts", [("Q4_K", 37, 1), ("Q8_0", 41, 3), ("F16", 0, 1)])
def test_matvec_rope_epilogue(device, kernels, name, pos, parts, neox):
    """Decode's QKV projection with RoPE and the cache write in its epilogue (adjacent or NeoX pairs: an f16 word is
    two adjacent values either way, from two lanes whose rotation partners differ under NeoX)."""
    check_matvec_rope_epilogue(device, kernels, name, 4, 4, 2, 16, 16, pos, parts, kv="f16", neox=neox)


def test_kv_write_leaves_other_rows(device, kernels):
    """kv_write's rows pos .. pos+t-1 rounded (run_case checks them within one f16 step), the rest bit for bit."""
    r = f16_case(device, kernels, **SMOL, pos=20, t=6, n_ctx=64, mode="prefill", seed=10)
    assert_ok(r)
    assert r["got_k"].dtype == np.float16
    others = np.r_[0:20, 26:64]
    assert r["got_k"][others].tobytes() == r["kc0"][others].tobytes()
    assert r["got_v"][others].tobytes() == r["vc0"][others].tobytes()
    assert not np.array_equal(r["got_k"][20:26], r["kc0"][20:26])
