"""The grid types (IQ2_XXS ...; wgsl/quant.wgsl, tables from lab/format/iq_grids.py) in get_rows, matvec and the
prefill GEMM, against gguf.quants (numpy, its own copy of ggml's grids, independent of our tables and WGSL) with the
product in float64, at shapes beyond test_matmul's: five blocks a row, rows that fill neither a matvec workgroup
(4 rows) nor a GEMM tile (32), token counts around the 32-token tile, every matvec workgroup size a real adapter
takes, with and without subgroups. Random blocks reach every grid index, sign index and scale code.
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

NEW = qo.IQ_TYPES
ROWS = 97                                   # 97 % 4 == 1, 97 % 32 == 1
COLS = 5 * 256                              # five blocks: 1280, not a multiple of the GEMM's 256-column runs
# ggml's block sizes (ggml-common.h: block_iq2_xxs 66 bytes, block_iq3_xxs 98, block_iq2_xs 74, block_iq3_s 110,
# block_iq2_s 82, block_iq1_s 50, block_iq1_m 56).
BLOCK_BYTES = {"IQ2_XXS": 66, "IQ3_XXS": 98, "IQ2_XS": 74, "IQ3_S": 110, "IQ2_S": 82, "IQ1_S": 50, "IQ1_M": 56}
# Every value is d times a small integer (or a half or quarter of one) rounded once into a sub-block scale, times a
# grid value of at most 6 bits and a sign: gguf.quants does the same float32 operations in the same order, so the
# kernels must give gguf's values bit for bit.


_cache: dict = {}


def tensor(name: str, rows: int = ROWS, seed: int = 0):
    key = (name, rows, seed)
    if key not in _cache:
        raw = qo.random_tensor(name, rows, COLS, seed)
        _cache[key] = (raw, qo.dequant(raw, name))
    return _cache[key]


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 400).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", NEW)
def test_table_and_block_sizes(name):
    """The kernel table (HALF 4: a group is 8 consecutive values) and ggml's block sizes."""
    assert KERNEL_TYPES[name] == (f"dq_{name.lower()}", 4)
    assert (BY_NAME[name].block, BY_NAME[name].nbytes) == (256, BLOCK_BYTES[name])
    assert dequant_consts(BY_NAME[name])["HALF"] == 4


@pytest.mark.parametrize("name", NEW)
def test_get_rows(device, kernels, name):
    """Every row (shuffled, with repeats), and scaled: gguf's values exactly."""
    raw, ref = tensor(name)
    ids = np.random.default_rng(3).permutation(ROWS).tolist() + [0, ROWS - 1, 5]
    with Rig(device, kernels) as r:
        w = r.weight(name, raw)
        got = r.get_rows(w, ids)
        got_scaled = r.get_rows(w, [9, 2], scale=0.75)
    print(f"\n{name} get_rows: max abs {np.max(np.abs(got - ref[ids])):.3g} (values up to {np.max(np.abs(ref)):.3g})")
    np.testing.assert_array_equal(got, ref[ids])
    np.testing.assert_allclose(got_scaled, np.float32(0.75) * ref[[9, 2]], rtol=1e-6, atol=0)


@pytest.mark.parametrize("sg", [True, False], ids=["subgroups", "shared-tree"])
@pytest.mark.parametrize("name", NEW)
def test_matvec(device, kernels, device_nosg, kernels_nosg, name, sg):
    """The workgroup sizes this CPU adapter picks (64..256) and the GPU's (32 for a tall head, 128, 256)."""
    raw, W = tensor(name)
    x = rand(W.shape[1], seed=1)
    ref = W.astype(np.float64) @ x.astype(np.float64)
    errs = []
    with Rig(*((device, kernels) if sg else (device_nosg, kernels_nosg))) as r:
        w = r.weight(name, raw)
        for wg in (32, 64, 128, 256):
            y = r.matvec(w, x, wg=wg)
            errs.append(qo.dot_err(y, W, x))
            assert errs[-1] <= DOT_TOL, f"WG={wg}"
    print(f"\n{name} matvec: max rel (to sum |W||x|) {max(errs):.3g} (|y| up to {np.max(np.abs(ref)):.3g})")


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


@pytest.mark.parametrize("name", NEW)
def test_split_over_bindings(device, kernels, name):
    """Blocks that are not whole words (66, 98, 74, 110, 82, 50 bytes: rows start mid-word in every part but the
    first) in a weight cut into parts of 40, 40, 17 rows: identical results."""
    raw, W = tensor(name)
    x, X = rand(W.shape[1], seed=3), rand(33, W.shape[1], seed=4)
    with Rig(device, kernels) as r:
        whole = r.weight(name, raw)
        split = r.weight(name, raw, max_binding=40 * raw.shape[1] + 3)
        assert [p.n_rows for p in split.parts] == [40, 40, 17]
        np.testing.assert_array_equal(r.matvec(split, x), r.matvec(whole, x))
        np.testing.assert_array_equal(r.matmul(split, X), r.matmul(whole, X))
        np.testing.assert_array_equal(r.get_rows(split, [96, 0, 40, 39]), r.get_rows(whole, [96, 0, 40, 39]))


@pytest.mark.parametrize("name", NEW)
def test_partial_blocks_refused(device, name):
    """Rows must be whole 256-element blocks."""
    with pytest.raises(ValueError, match="whole number"):
        alloc_weight(device, "odd", BY_NAME[name], 4, 288)
