"""Q2_K, Q3_K, IQ4_NL and IQ4_XS (wgsl/quant.wgsl) in get_rows, matvec and the prefill GEMM, against gguf.quants
(numpy, independent of our WGSL) with the product in float64, at shapes beyond test_matmul's: several
super-blocks per row, rows that fill neither a matvec workgroup (4 rows) nor a GEMM tile (32), token counts
around the 32-token tile, every matvec workgroup size a real adapter takes, with and without subgroups.
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

NEW = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS")
ROWS = 97                                   # 97 % 4 == 1, 97 % 32 == 1
COLS = {"Q2_K": 5 * 256, "Q3_K": 5 * 256, "IQ4_XS": 5 * 256,
        "IQ4_NL": 5 * 32}                   # 160: not a multiple of the GEMM's 64-column chunk
# Values that are exact products (no rounding anywhere, on any IEEE GPU): an f16 scale (11-bit significand)
# times a 6-bit sub-block scale times a level of at most 7 bits fits f32's 24-bit significand. Q2_K's
# d * sc * q - dmin * m has one rounding (the subtraction), where fma contraction may move the last bit:
# DEQUANT_TOL (quant_oracle) for it.
EXACT = {"Q3_K", "IQ4_NL", "IQ4_XS"}


_cache: dict = {}


def tensor(name: str, rows: int = ROWS, seed: int = 0):
    key = (name, rows, seed)
    if key not in _cache:
        raw = qo.random_tensor(name, rows, COLS[name], seed)
        _cache[key] = (raw, qo.dequant(raw, name))
    return _cache[key]


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 200).standard_normal(shape).astype(np.float32)


def test_table_and_block_sizes():
    """The kernel table and ggml's block sizes (ggml-common.h: 84, 110, 18, 136 bytes)."""
    assert {n: KERNEL_TYPES[n] for n in NEW} == {"Q2_K": ("dq_q2_k", 32), "Q3_K": ("dq_q3_k", 32),
                                                 "IQ4_NL": ("dq_iq4_nl", 16), "IQ4_XS": ("dq_iq4_xs", 16)}
    assert [(BY_NAME[n].block, BY_NAME[n].nbytes) for n in NEW] == [(256, 84), (256, 110), (32, 18), (256, 136)]
    for n in NEW:
        half = dequant_consts(BY_NAME[n])["HALF"]
        assert BY_NAME[n].block % (2 * half) == 0 and 64 % (2 * half) == 0   # quant.wgsl's group rule


@pytest.mark.parametrize("name", NEW)
def test_get_rows(device, kernels, name):
    """Every row (shuffled, with repeats), scaled: gguf's values exactly where they are exact products."""
    raw, ref = tensor(name)
    ids = np.random.default_rng(3).permutation(ROWS).tolist() + [0, ROWS - 1, 5]
    with Rig(device, kernels) as r:
        w = r.weight(name, raw)
        got = r.get_rows(w, ids)
        got_scaled = r.get_rows(w, [9, 2], scale=3.0)
    err = qo.dequant_err(got, ref[ids])
    print(f"\n{name} get_rows: max abs {np.max(np.abs(got - ref[ids])):.3g}, rel {err:.3g} "
          f"(values up to {np.max(np.abs(ref)):.3g})")
    if name in EXACT:
        np.testing.assert_array_equal(got, ref[ids])
    assert err <= DEQUANT_TOL
    assert qo.dequant_err(got_scaled, 3.0 * ref[[9, 2]].astype(np.float64)) <= DEQUANT_TOL


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


@pytest.mark.parametrize("name", ["Q3_K", "IQ4_NL"])
def test_split_over_bindings(device, kernels, name):
    """Unaligned blocks (110 and 18 bytes) in a weight cut into parts of 40, 40, 17 rows: identical results."""
    raw, W = tensor(name)
    x, X = rand(W.shape[1], seed=3), rand(33, W.shape[1], seed=4)
    with Rig(device, kernels) as r:
        whole = r.weight(name, raw)
        split = r.weight(name, raw, max_binding=40 * raw.shape[1] + 3)
        assert [p.n_rows for p in split.parts] == [40, 40, 17]
        np.testing.assert_array_equal(r.matvec(split, x), r.matvec(whole, x))
        np.testing.assert_array_equal(r.matmul(split, X), r.matmul(whole, X))
        np.testing.assert_array_equal(r.get_rows(split, [96, 0, 40, 39]), r.get_rows(whole, [96, 0, 40, 39]))


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "IQ4_XS", "IQ4_NL"])
def test_partial_blocks_refused(device, name):
    """K-quants and IQ4_XS need rows of whole 256-element super-blocks, IQ4_NL of 32-element blocks."""
    with pytest.raises(ValueError, match="whole number"):
        alloc_weight(device, "odd", BY_NAME[name], 4, BY_NAME[name].block + 32 if name != "IQ4_NL" else 48)


@pytest.mark.parametrize("bad", ["Q8_1", "Q8_K", "I8"])
def test_unsupported_weight_type_names_itself_and_the_list(device, bad):
    with pytest.raises(gpu.GpuError) as e:
        alloc_weight(device, "w", BY_NAME[bad], 4, 256)
    msg = str(e.value)
    assert msg.startswith(f"{bad} weights are not supported")
    assert all(n in msg for n in KERNEL_TYPES) and all(n in msg for n in NEW)
