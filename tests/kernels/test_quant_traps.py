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
    ("q2_k scale and min nibbles swapped", "Q2_K", "dq_q2_k",
     "let sc = vec2<f32>(f32(sw & 15u), f32((sw >> 16u) & 15u));\n"
     "    let mn = vec2<f32>(f32((sw >> 4u) & 15u), f32((sw >> 20u) & 15u));",
     "let mn = vec2<f32>(f32(sw & 15u), f32((sw >> 16u) & 15u));\n"
     "    let sc = vec2<f32>(f32((sw >> 4u) & 15u), f32((sw >> 20u) & 15u));"),
    ("q2_k hi sub-block reads the lo 2-bit field", "Q2_K", "dq_q2_k",
     "dm.x * sc.y * crumbs_hi(q)", "dm.x * sc.y * crumbs_lo(q)"),
    ("q2_k scale byte of the second 16 elements not taken", "Q2_K", "dq_q2_k",
     ">> (8u * ((gi & 7u) >> 2u))", ">> (8u * ((gi & 7u) >> 3u))"),
    ("q3_k hmask bit of the hi sub-block from bit 2c", "Q3_K", "dq_q3_k",
     "bit_of_bytes(hm, 2u * c + 1u)", "bit_of_bytes(hm, 2u * c)"),
    ("q3_k hmask read as 'set means subtract 4'", "Q3_K", "dq_q3_k",
     "crumbs_lo(q) - 4.0 + 4.0 * bit_of_bytes(hm, 2u * c)", "crumbs_lo(q) - 4.0 * bit_of_bytes(hm, 2u * c)"),
    ("q3_k high scale bits from bits 2(c%2) of scales[8..]", "Q3_K", "dq_q3_k",
     ">> (8u * h + 2u * c)", ">> (8u * h + 2u * (c & 1u))"),
    ("iq4 table entry 9 is 12 instead of 13", "IQ4_NL", "iq4_levels",
     "0x26190D01u", "0x26190C01u"),
    ("iq4 levels 4-7 and 8-11 picked for each other", "IQ4_NL", "iq4_levels",
     "n >= vec4<u32>(8u)", "n >= vec4<u32>(4u)"),
    ("iq4_nl high/low nibble order", "IQ4_NL", "dq_iq4_nl",
     "Dq(d * iq4_levels(nibs_lo(q)), d * iq4_levels(nibs_hi(q)))",
     "Dq(d * iq4_levels(nibs_hi(q)), d * iq4_levels(nibs_lo(q)))"),
    ("iq4_xs scales_h bit pair of sub-block ib at bit ib", "IQ4_XS", "dq_iq4_xs",
     "(dsh >> (16u + 2u * ib))", "(dsh >> (16u + ib))"),
    ("iq4_xs scales_l nibbles swapped within a byte", "IQ4_XS", "dq_iq4_xs",
     ">> (4u * ib)) & 15u)", ">> (4u * (ib ^ 1u))) & 15u)"),
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
