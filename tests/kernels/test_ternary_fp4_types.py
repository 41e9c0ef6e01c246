"""TQ1_0, TQ2_0 (ternary) and MXFP4, NVFP4 (4-bit floats) (wgsl/quant.wgsl) in get_rows, matvec and the prefill
GEMM, against gguf.quants (numpy, independent of our WGSL) with the product in float64, at shapes beyond
test_matmul's: several blocks per row, rows that fill neither a matvec workgroup (4 rows) nor a GEMM tile (32),
token counts around the 32-token tile, every matvec workgroup size a real adapter takes, with and without subgroups;
and every 8-bit scale code of the two float formats, specials included.
(test_get_rows, test_matmul and test_quant_traps cover these types too, through qo.TYPES and TRAPS.)
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.format.ggml import BY_NAME, KERNEL_TYPES
from lab.host.reference import quant as qo
from lab.host.reference.quant import DOT_TOL
from lab.ops.weights import alloc_weight, dequant_consts
from tests.kernels.quant_rig import Rig

NEW = ("TQ1_0", "TQ2_0", "MXFP4", "NVFP4")
ROWS = 97                                   # 97 % 4 == 1, 97 % 32 == 1
COLS = {"TQ1_0": 5 * 256, "TQ2_0": 5 * 256,
        "MXFP4": 5 * 32,                    # 160: not a multiple of the GEMM's 64-column chunk
        "NVFP4": 3 * 64}                    # 192: three blocks, not a multiple of 128
# Every value of these types is one exact product (reference/quant.py, DEQUANT_TOL's note): an f16 scale times
# -1, 0, 1 (2), or a power of two or a 4-bit-significand UE4M3 scale times a doubled E2M1 level of at most 4 bits.
# The kernels must give gguf's values bit for bit.


_cache: dict = {}


def tensor(name: str, rows: int = ROWS, seed: int = 0):
    key = (name, rows, seed)
    if key not in _cache:
        raw = qo.random_tensor(name, rows, COLS[name], seed)
        _cache[key] = (raw, qo.dequant(raw, name))
    return _cache[key]


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 300).standard_normal(shape).astype(np.float32)


def test_table_and_block_sizes():
    """The kernel table and ggml's block sizes (ggml-common.h: block_tq1_0 54 bytes, block_tq2_0 66,
    block_mxfp4 17, block_nvfp4 36)."""
    assert {n: KERNEL_TYPES[n] for n in NEW} == {"TQ1_0": ("dq_tq1_0", 4), "TQ2_0": ("dq_tq2_0", 32),
                                                 "MXFP4": ("dq_mxfp4", 16), "NVFP4": ("dq_nvfp4", 8)}
    assert [(BY_NAME[n].block, BY_NAME[n].nbytes) for n in NEW] == [(256, 54), (256, 66), (32, 17), (64, 36)]
    for n in NEW:
        half = dequant_consts(BY_NAME[n])["HALF"]
        assert BY_NAME[n].block % (2 * half) == 0 and 64 % (2 * half) == 0   # quant.wgsl's group rule


@pytest.mark.parametrize("name", NEW)
def test_get_rows(device, kernels, name):
    """Every row (shuffled, with repeats), and scaled: gguf's values exactly."""
    raw, ref = tensor(name)
    ids = np.random.default_rng(3).permutation(ROWS).tolist() + [0, ROWS - 1, 5]
    with Rig(device, kernels) as r:
        w = r.weight(name, raw)
        got = r.get_rows(w, ids)
        got_scaled = r.get_rows(w, [9, 2], scale=0.75)      # 3/4: exact on the exact values
    print(f"\n{name} get_rows: max abs {np.max(np.abs(got - ref[ids])):.3g} (values up to {np.max(np.abs(ref)):.3g})")
    np.testing.assert_array_equal(got, ref[ids])
    np.testing.assert_array_equal(got_scaled, np.float32(0.75) * ref[[9, 2]])


@pytest.mark.parametrize("sg", [True, False], ids=["subgroups", "shared-tree"])
@pytest.mark.parametrize("name", NEW)
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


@pytest.mark.parametrize("name", NEW)
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


@pytest.mark.parametrize("name", ["TQ1_0", "MXFP4"])
def test_split_over_bindings(device, kernels, name):
    """Unaligned blocks (54 bytes; 17, so rows of odd length) in a weight cut into parts of 40, 40, 17 rows:
    identical results."""
    raw, W = tensor(name)
    x, X = rand(W.shape[1], seed=3), rand(33, W.shape[1], seed=4)
    with Rig(device, kernels) as r:
        whole = r.weight(name, raw)
        split = r.weight(name, raw, max_binding=40 * raw.shape[1] + 3)
        assert [p.n_rows for p in split.parts] == [40, 40, 17]
        np.testing.assert_array_equal(r.matvec(split, x), r.matvec(whole, x))
        np.testing.assert_array_equal(r.matmul(split, X), r.matmul(whole, X))
        np.testing.assert_array_equal(r.get_rows(split, [96, 0, 40, 39]), r.get_rows(whole, [96, 0, 40, 39]))


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


@pytest.mark.parametrize("name,cols", [("TQ1_0", 288), ("TQ2_0", 288), ("MXFP4", 48), ("NVFP4", 96)])
def test_partial_blocks_refused(device, name, cols):
    """Rows must be whole blocks: 256 elements (TQ1_0, TQ2_0), 32 (MXFP4), 64 (NVFP4)."""
    with pytest.raises(ValueError, match="whole number"):
        alloc_weight(device, "odd", BY_NAME[name], 4, cols)
