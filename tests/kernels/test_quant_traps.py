"""The checks catch real dequantization bugs: each trap rewrites one small snippet of wgsl/quant.wgsl
into a plausible mistake and asserts that the very checks of test_get_rows / test_matmul FAIL for it
(and that the unmodified source passes the same check, on the same data, in the same harness).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels import quant_oracle as qo
from tests.kernels.quant_oracle import DEQUANT_TOL, DOT_TOL, Rig

# (id, type, function in quant.wgsl, snippet, broken replacement)
TRAPS = [
    ("q4_k scale and min sources swapped", "Q4_K", "k_scale_min",
     "return vec2<f32>(f32(sc), f32(mn));", "return vec2<f32>(f32(mn), f32(sc));"),
    ("q4_k j<4 / j>=4 branches swapped", "Q4_K", "k_scale_min",
     "let hi = s >= 4u;", "let hi = s < 4u;"),
    ("q4_k high scale bits from b[s] instead of b[s-4]", "Q4_K", "k_scale_min",
     "(c & 15u) | ((e >> 6u) << 4u)", "(c & 15u) | ((a >> 6u) << 4u)"),
    ("q4_0 high/low nibble order", "Q4_0", "dq_q4_0",
     "Dq(d * (nib_lo(q) - 8.0), d * (nib_hi(q) - 8.0))", "Dq(d * (nib_hi(q) - 8.0), d * (nib_lo(q) - 8.0))"),
    ("q5_0 high/low nibble order", "Q5_0", "dq_q5_0",
     "Dq(d * (nib_lo(q) + 16.0 * vec4<f32>(h) - 16.0), d * (nib_hi(q) + 16.0 * vec4<f32>(h2) - 16.0))",
     "Dq(d * (nib_hi(q) + 16.0 * vec4<f32>(h) - 16.0), d * (nib_lo(q) + 16.0 * vec4<f32>(h2) - 16.0))"),
    ("q5_0 fifth bit of the upper half from bit j+12", "Q5_0", "dq_q5_0",
     "vec4<u32>(16u, 17u, 18u, 19u)", "vec4<u32>(12u, 13u, 14u, 15u)"),
    ("q5_0 qh read as an aligned word (22-byte blocks)", "Q5_0", "dq_q5_0",
     "let qh = ld_u32(blk + Q5_0_QH);", "let qh = W[(blk + Q5_0_QH) >> 2u];"),
    ("q8_0 quants read unsigned", "Q8_0", "dq_q8_0",
     "d * i8x4(ld_u32(blk + Q8_0_QS + 8u * gi))", "d * vec4<f32>(u8x4(ld_u32(blk + Q8_0_QS + 8u * gi)))"),
    ("q5_k fifth bit of the high nibbles from bit 2j", "Q5_K", "dq_q5_k",
     "bit_of_bytes(qh, 2u * j + 1u)", "bit_of_bytes(qh, 2u * j)"),
    ("q6_k second scale at +1 instead of +2", "Q6_K", "dq_q6_k",
     "ld_u8(sc + 2u)", "ld_u8(sc + 1u)"),
]


def _checks(device, name):
    """The dequant check (get_rows over all rows) and the product check (matvec): their errors."""
    raw = qo.random_tensor(name, 24, 512 if name in qo.K_TYPES else 96, seed=11)
    ref = qo.dequant(raw, name)
    x = np.random.default_rng(12).standard_normal(ref.shape[1]).astype(np.float32)
    with Rig(device) as r:                      # a fresh KernelCache: compiled from the current folder
        w = r.weight(name, raw)
        got = r.get_rows(w, list(range(raw.shape[0])))
        y = r.matvec(w, x)
    return qo.dequant_err(got, ref), qo.dot_err(y, ref, x)


@pytest.mark.parametrize("trap", TRAPS, ids=[t[0] for t in TRAPS])
def test_trap_is_caught(device, tmp_path, trap):
    _, name, fn, old, new = trap
    good_deq, good_dot = _checks(device, name)
    assert good_deq <= DEQUANT_TOL and good_dot <= DOT_TOL
    with qo.mutated_wgsl(tmp_path, fn, old, new):
        bad_deq, bad_dot = _checks(device, name)
    assert bad_deq > DEQUANT_TOL, f"dequant check missed: {trap[0]}"
    assert bad_dot > DOT_TOL, f"matvec check missed: {trap[0]}"
