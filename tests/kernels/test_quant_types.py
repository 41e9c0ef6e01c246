"""The quant types added after the first eleven (wgsl/quant.wgsl) in get_rows, matvec and the prefill GEMM, against the
oracle of lab/host/reference/quant.py (gguf.quants, numpy independent of our WGSL and, for the grid types, with its own
copy of ggml's grids; for Q1_0 and Q2_0 numpy written from the block format) with the product in float64, at shapes
beyond test_matmul's: five blocks a row (fewer for NVFP4), rows that fill neither a matvec workgroup (4 rows) nor a GEMM
tile (32), token counts around the 32-token tile, every matvec workgroup size a real adapter takes, with and without
subgroups; weights cut over bindings where blocks are not whole words; every 8-bit scale code of the two float formats.
Random blocks reach every quant, grid index, sign index and scale code.
(test_get_rows, test_matmul and test_quant_traps cover these types too, through qo.TYPES and TRAPS.)
"""

from __future__ import annotations

import numpy as np
import pytest

from lab import gpu
from lab.format.ggml import BY_NAME, KERNEL_TYPES
from lab.host.reference import quant as qo
from lab.host.reference.quant import DEQUANT_TOL, DOT_TOL
from lab.ops.weights import alloc_weight, dequant_consts
from tests.kernels.quant_rig import Rig

ROWS = 97                                   # 97 % 4 == 1, 97 % 32 == 1
# type -> (columns, (block elements, block bytes) as ggml-common.h declares them, HALF of quant.wgsl). Five blocks a
# row; 160 (IQ4_NL, MXFP4), 320 (Q2_0) and 640 (Q1_0) are not multiples of the GEMM's 64- or 256-column runs.
TYPES = {
    "Q2_K": (5 * 256, (256, 84), 32), "Q3_K": (5 * 256, (256, 110), 32), "IQ4_NL": (5 * 32, (32, 18), 16),
    "IQ4_XS": (5 * 256, (256, 136), 16),
    "TQ1_0": (5 * 256, (256, 54), 4), "TQ2_0": (5 * 256, (256, 66), 32), "MXFP4": (5 * 32, (32, 17), 16),
    "NVFP4": (3 * 64, (64, 36), 8),         # 192: three blocks, not a multiple of 128
    "IQ2_XXS": (5 * 256, (256, 66), 4), "IQ3_XXS": (5 * 256, (256, 98), 4), "IQ2_XS": (5 * 256, (256, 74), 4),
    "IQ2_S": (5 * 256, (256, 82), 4), "IQ3_S": (5 * 256, (256, 110), 4), "IQ1_S": (5 * 256, (256, 50), 4),
    "IQ1_M": (5 * 256, (256, 56), 4),
    "Q1_0": (5 * 128, (128, 18), 4), "Q2_0": (5 * 64, (64, 18), 4),
}
# Values that are exact products (no rounding anywhere, on any IEEE GPU), held to the oracle bit for bit: an f16 scale
# (11-bit significand) times sub-block factors and a level or grid value of a few bits fits f32's 24 bits
# (reference/quant.py, DEQUANT_TOL's note). Q2_K's d * sc * q - dmin * m rounds once (the subtraction), where fma
# contraction may move the last bit: DEQUANT_TOL for it.
EXACT = set(TYPES) - {"Q2_K"}
# ... and whose values times get_rows's scale 0.75 stay exact in whatever order the kernel multiplies: the ternary,
# 4-bit float and 1- and 2-bit types, of at most 13 significant bits. The K and grid types' values carry up to 22, and
# the kernel's products may round: DEQUANT_TOL.
SCALE_EXACT = {"TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0"}
# Weights cut over bindings: blocks that are not whole words (rows start mid-word in every part but the first), and
# one of each family.
SPLIT = ("Q3_K", "IQ4_NL", "TQ1_0", "MXFP4") + qo.IQ_TYPES + qo.BIT_TYPES


_cache: dict = {}


def tensor(name: str, rows: int = ROWS, seed: int = 0):
    key = (name, rows, seed)
    if key not in _cache:
        raw = qo.random_tensor(name, rows, TYPES[name][0], seed)
        _cache[key] = (raw, qo.dequant(raw, name))
    return _cache[key]


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 200).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", TYPES)
def test_table_and_block_sizes(name):
    """The kernel table, ggml's block sizes and quant.wgsl's group rule (2*HALF divides the block and 64)."""
    _, (block, nbytes), half = TYPES[name]
    assert KERNEL_TYPES[name] == (f"dq_{name.lower()}", half)
    assert (BY_NAME[name].block, BY_NAME[name].nbytes) == (block, nbytes)
    assert dequant_consts(BY_NAME[name])["HALF"] == half
    assert block % (2 * half) == 0 and 64 % (2 * half) == 0


@pytest.mark.parametrize("name", TYPES)
def test_get_rows(device, kernels, name):
    """Every row (shuffled, with repeats), and scaled: the oracle's values exactly where they are exact products."""
    raw, ref = tensor(name)
    ids = np.random.default_rng(3).permutation(ROWS).tolist() + [0, ROWS - 1, 5]
    with Rig(device, kernels) as r:
        w = r.weight(name, raw)
        got = r.get_rows(w, ids)
        got_scaled = r.get_rows(w, [9, 2], scale=0.75)
    err = qo.dequant_err(got, ref[ids])
    print(f"\n{name} get_rows: max abs {np.max(np.abs(got - ref[ids])):.3g}, rel {err:.3g} "
          f"(values up to {np.max(np.abs(ref)):.3g})")
    if name in EXACT:
        np.testing.assert_array_equal(got, ref[ids])
    assert err <= DEQUANT_TOL
    if name in SCALE_EXACT:
        np.testing.assert_array_equal(got_scaled, np.float32(0.75) * ref[[9, 2]])
    assert qo.dequant_err(got_scaled, 0.75 * ref[[9, 2]].astype(np.float64)) <= DEQUANT_TOL


@pytest.mark.parametrize("sg", [True, False], ids=["subgroups", "shared-tree"])
@pytest.mark.parametrize("name", TYPES)
def test_matvec(device, kernels, device_nosg, kernels_nosg, name, sg):
    """The workgroup sizes this CPU adapter picks (64..256) and the GPU's (32 for a tall head, 128, 256)."""
    raw, W = tensor(name)
    x = rand(W.shape[1], seed=1)
    ref = W.astype(np.float64) @ x.astype(np.float64)
    errs, abs_errs = [], []
    with Rig(*((device, kernels) if sg else (device_nosg, kernels_nosg))) as r:
        w = r.weight(name, raw)
        for wg in (32, 64, 128, 256):
            y = r.matvec(w, x, wg=wg)
            errs.append(qo.dot_err(y, W, x))
            abs_errs.append(np.max(np.abs(y - ref)))
            assert errs[-1] <= DOT_TOL, f"WG={wg}"
    print(f"\n{name} matvec: max rel (to sum |W||x|) {max(errs):.3g}, max abs {max(abs_errs):.3g} "
          f"(|y| up to {np.max(np.abs(ref)):.3g})")


@pytest.mark.parametrize("name", TYPES)
def test_gemm(device, kernels, name):
    """Token counts below, at, just past and over two 32-token tiles."""
    raw, W = tensor(name)
    errs = []
    with Rig(device, kernels) as r:
        w = r.weight(name, raw)
        for t in (1, 5, 32, 33, 70):
            X = rand(t, W.shape[1], seed=t)
            Y = r.matmul(w, X)
            errs.append(qo.dot_err(Y[:t], W, X))
            assert errs[-1] <= DOT_TOL, f"t={t}"
    print(f"\n{name} gemm: max rel (to sum |W||x|) {max(errs):.3g}")


@pytest.mark.parametrize("name", SPLIT)
def test_split_over_bindings(device, kernels, name):
    """A weight cut into parts of 40, 40, 17 rows: identical results."""
    raw, W = tensor(name)
    x, X = rand(W.shape[1], seed=3), rand(33, W.shape[1], seed=4)
    with Rig(device, kernels) as r:
        whole = r.weight(name, raw)
        split = r.weight(name, raw, max_binding=40 * raw.shape[1] + 3)
        assert [p.n_rows for p in split.parts] == [40, 40, 17]
        np.testing.assert_array_equal(r.matvec(split, x), r.matvec(whole, x))
        np.testing.assert_array_equal(r.matmul(split, X), r.matmul(whole, X))
        np.testing.assert_array_equal(r.get_rows(split, [96, 0, 40, 39]), r.get_rows(whole, [96, 0, 40, 39]))


@pytest.mark.parametrize("name", TYPES)
def test_partial_blocks_refused(device, name):
    """Rows must be whole blocks: a block and 32 more elements (48 for the 32-element blocks) is refused."""
    block = BY_NAME[name].block
    with pytest.raises(ValueError, match="whole number"):
        alloc_weight(device, "odd", BY_NAME[name], 4, block + 32 if block > 32 else 48)


@pytest.mark.parametrize("bad", ["Q8_1", "Q8_K", "I8"])
def test_unsupported_weight_type_names_itself_and_the_list(device, bad):
    with pytest.raises(gpu.GpuError) as e:
        alloc_weight(device, "w", BY_NAME[bad], 4, 256)
    msg = str(e.value)
    assert msg.startswith(f"{bad} weights are not supported")
    assert all(n in msg for n in KERNEL_TYPES) and all(n in msg for n in TYPES)


def test_every_mxfp4_scale_code(device, kernels):
    """Block i of a row of 256 blocks has E8M0 code e = i: values 2^(e - 128) * level, up to inf at e = 254, 255
    (12 * 2^126 overflows float32, in gguf.quants as on the GPU). e = 0, 1 give subnormal scales (2^-128, 2^-127),
    which a GPU may flush to zero: there gguf's value or 0."""
    raw = qo.random_tensor("MXFP4", 2, 256 * 32, seed=21)
    raw.reshape(2, 256, 17)[:, :, 0] = np.arange(256, dtype=np.uint8)
    with np.errstate(over="ignore"):
        ref = qo.dequant(raw, "MXFP4")
    with Rig(device, kernels) as r:
        got = r.get_rows(r.weight("MXFP4", raw), [1, 0])[[1, 0]]
    np.testing.assert_array_equal(got[:, 64:], ref[:, 64:])
    assert np.all((got[:, :64] == ref[:, :64]) | (got[:, :64] == 0))
    assert np.isinf(ref[:, -32:]).any()                 # the overflow is in the data


def test_every_nvfp4_scale_code(device, kernels):
    """The 256 UE4M3 codes as the sub-block scales of 64 blocks: 0 and 0x7F give 0, bit 7 is ignored (0xFF is
    not 0x7F), exponent 0 is m * 2^-10 (still normal float32 values)."""
    raw = qo.random_tensor("NVFP4", 4, 16 * 64, seed=22)
    raw.reshape(64, 36)[:, :4] = np.arange(256, dtype=np.uint8).reshape(64, 4)
    ref = qo.dequant(raw, "NVFP4")
    with Rig(device, kernels) as r:
        got = r.get_rows(r.weight("NVFP4", raw), [2, 0, 3, 1])[[1, 3, 0, 2]]
    np.testing.assert_array_equal(got, ref)
    assert np.all(ref.reshape(-1, 16)[[0, 0x7F]] == 0) and np.any(ref.reshape(-1, 16)[0xFF] != 0)
