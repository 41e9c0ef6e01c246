"""The checks catch real dequantization bugs: each trap rewrites one small snippet of wgsl/quant.wgsl (or of a
type's own matvec loop) into a plausible mistake and asserts that the very checks of test_get_rows / test_matmul
FAIL for it (and that the unmodified source passes the same check, on the same data, in the same
harness).
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.format.ggml import BY_NAME
from lab.host.reference import quant as qo
from lab.host.reference.quant import DEQUANT_TOL, DOT_TOL
from lab.ops.matmul import MATVEC_LOOPS
from tests.kernels.quant_rig import Rig, mutated_wgsl

# (id, type, function in quant.wgsl, snippet, broken replacement)
TRAPS = [
    ("q4_k scale and min sources swapped", "Q4_K", "k_scales",
     "return vec4<f32>(vec2<f32>(sc), vec2<f32>(mn));", "return vec4<f32>(vec2<f32>(mn), vec2<f32>(sc));"),
    ("q4_k j<2 / j>=2 branches swapped", "Q4_K", "k_scales",
     "let hi = j >= 2u;", "let hi = j < 2u;"),
    ("q4_k high scale bits from b[s] instead of b[s-4]", "Q4_K", "k_scales",
     "(c & vec2<u32>(15u)) | ((a >> vec2<u32>(6u))", "(c & vec2<u32>(15u)) | ((b >> vec2<u32>(6u))"),
    ("q5_k chunk scales from bytes 2j, 2j+1 of the other pair", "Q5_K", "k_scales",
     "let i = 16u * (j & 1u);", "let i = 16u * (1u - (j & 1u));"),
    ("q4_0 high/low nibble order", "Q4_0", "dq_q4_0",
     "Dq(d * (nib_lo(q) - 8.0), d * (nib_hi(q) - 8.0))", "Dq(d * (nib_hi(q) - 8.0), d * (nib_lo(q) - 8.0))"),
    ("q5_0 high/low nibble order", "Q5_0", "dq_q5_0",
     "Dq(d * (q5_lo(q, h) - 16.0), d * (q5_hi(q, h2) - 16.0))", "Dq(d * (q5_hi(q, h) - 16.0), d * (q5_lo(q, h2) - 16.0))"),
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
    ("tq2_0 trit offset dropped (field read as the value)", "TQ2_0", "dq_tq2_0",
     "d * (crumbs_lo(q) - 1.0)", "d * crumbs_lo(q)"),
    ("tq2_0 field pair of chunk c from bits 2(c%2), not 4(c%2)", "TQ2_0", "dq_tq2_0",
     ">> (4u * (c & 1u))", ">> (2u * (c & 1u))"),
    ("tq2_0 scale read from the block's first bytes", "TQ2_0", "dq_tq2_0",
     "ld_f16(blk + TQ2_0_D)", "ld_f16(blk + TQ2_0_QS)"),
    ("tq1_0 base-3 digits least significant first", "TQ1_0", "tq1_quad",
     "b * pow3(k)", "b * pow3(4u - k)"),
    ("tq1_0 digits as plain base 3 (b / 3^k % 3), not ggml's fixed point", "TQ1_0", "tq1_quad",
     "let v = (b * pow3(k)) & vec4<u32>(0xFFu);\n    return vec4<f32>((v * 3u) >> vec4<u32>(8u));",
     "return vec4<f32>((b / pow3(k)) % vec4<u32>(3u));"),
    ("tq1_0 second run with the first's 32-byte width", "TQ1_0", "tq1_quad",
     "select(select(32u, 16u, run1), 4u, run2)", "select(select(32u, 32u, run1), 4u, run2)"),
    ("tq1_0 trit offset dropped", "TQ1_0", "dq_tq1_0",
     "d * (tq1_quad(blk, e) - 1.0)", "d * tq1_quad(blk, e)"),
    ("mxfp4 scale 2^(e - 127) (the levels are doubled: 2^(e - 128))", "MXFP4", "dq_mxfp4",
     "(e - 1u) << 23u", "e << 23u"),
    ("fp4 codes 8-15 read as positive (sign bit ignored)", "MXFP4", "fp4_levels",
     "select(W2, W3, odd), n >= vec4<u32>(8u)", "select(W0, W1, odd), n >= vec4<u32>(8u)"),
    ("mxfp4 high/low nibble order", "MXFP4", "dq_mxfp4",
     "Dq(d * fp4_levels(nibs_lo(q)), d * fp4_levels(nibs_hi(q)))",
     "Dq(d * fp4_levels(nibs_hi(q)), d * fp4_levels(nibs_lo(q)))"),
    ("nvfp4 sub-block scale per group (d[g % 4]), not per 16 values", "NVFP4", "dq_nvfp4",
     "(8u * (gi >> 1u))", "(8u * (gi & 3u))"),
    ("nvfp4 ue4m3 scale not halved", "NVFP4", "ue4m3_half",
     "(ex + 119u)", "(ex + 120u)"),
    ("nvfp4 high/low nibble order", "NVFP4", "dq_nvfp4",
     "Dq(d * fp4_levels(nibs_lo(q)), d * fp4_levels(nibs_hi(q)))",
     "Dq(d * fp4_levels(nibs_hi(q)), d * fp4_levels(nibs_lo(q)))"),
    ("fp4 level 7 is 10 instead of 12", "NVFP4", "fp4_levels",
     "0x0C080604u", "0x0A080604u"),
    # the grid types (tables: lab/format/iq_grids.py)
    ("iq2_xxs grid index from the neighbouring byte of a0", "IQ2_XXS", "dq_iq2_xxs",
     "(a0 >> (8u * l)) & 0xFFu", "(a0 >> (8u * (l ^ 1u))) & 0xFFu"),
    ("ksigns without the parity bit (value 7's sign always +)", "IQ2_XXS", "ksigns",
     "i | ((countOneBits(i) & 1u) << 7u)", "i"),
    ("iq2_xxs sign indices in reverse order", "IQ2_XXS", "dq_iq2_xxs",
     "(a1 >> (7u * l)) & 127u", "(a1 >> (7u * (3u - l))) & 127u"),
    ("iq2_xxs scale nibble from bits 24-27, not 28-31", "IQ2_XXS", "dq_iq2_xxs",
     "f32(a1 >> 28u)", "f32((a1 >> 24u) & 15u)"),
    ("grid point p read from the other half of its word (point p ^ 1)", "IQ2_XXS", "grid_point",
     "(16u * (p & 1u))", "(16u * (~p & 1u))"),
    ("iq3_xxs the two points of a group swapped (grid index byte order)", "IQ3_XXS", "dq_iq3_xxs",
     "let p1 = q & 0xFFu;\n    let p2 = q >> 8u;", "let p1 = q >> 8u;\n    let p2 = q & 0xFFu;"),
    ("grid levels 4-7 from the first level word past level 4 (IQ3's eight levels)", "IQ3_XXS", "grid_values",
     "c >= vec4<u32>(4u)", "c > vec4<u32>(4u)"),
    ("iq3_xxs sign index of group l from bits 8l (not 7l)", "IQ3_XXS", "dq_iq3_xxs",
     "(a >> (7u * l)) & 127u", "(a >> (8u * l)) & 127u"),
    ("iq3_xxs scale halved twice (IQ2_XXS's quarter)", "IQ3_XXS", "dq_iq3_xxs",
     "(0.5 + f32(a >> 28u)) * 0.5", "(0.5 + f32(a >> 28u)) * 0.25"),
    ("iq3_xxs sub-blocks' scale words in reverse order", "IQ3_XXS", "dq_iq3_xxs",
     "IQ3_XXS_SS + 4u * ib", "IQ3_XXS_SS + 4u * (7u - ib)"),
    ("iq2_xs grid index of 8 bits, not 9", "IQ2_XS", "dq_iq2_xs",
     "let p = q & 511u;", "let p = q & 255u;"),
    ("iq2_xs sign index from bits 8-14, not 9-15", "IQ2_XS", "dq_iq2_xs",
     "ksigns(q >> 9u)", "ksigns((q >> 8u) & 127u)"),
    ("iq2 scale nibble alternating per group, not per 16 values", "IQ2_XS", "iq2_scale",
     "(4u * ((gi >> 1u) & 1u))", "(4u * (gi & 1u))"),
    ("iq2_xs sub-blocks' scale bytes in reverse order", "IQ2_XS", "dq_iq2_xs",
     "IQ2_XS_SCALES + (gi >> 2u)", "IQ2_XS_SCALES + (7u - (gi >> 2u))"),
    ("iq2_s grid index high bits from bit l of qh, not 2l", "IQ2_S", "dq_iq2_s",
     ">> (2u * (gi & 3u))) & 3u) << 8u", ">> (gi & 3u)) & 3u) << 8u"),
    ("iq2_s sign byte through ksigns (IQ2_XS's 7-bit rule)", "IQ2_S", "dq_iq2_s",
     "let s = ld_u8(blk + IQ2_S_SIGNS + gi);", "let s = ksigns(ld_u8(blk + IQ2_S_SIGNS + gi) & 127u);"),
    ("iq2_s one scale byte for two sub-blocks", "IQ2_S", "dq_iq2_s",
     "IQ2_S_SCALES + ib)", "IQ2_S_SCALES + (ib >> 1u))"),
    ("iq3_s second point's high index bit from bit 2l, not 2l + 1", "IQ3_S", "dq_iq3_s",
     "((h & 2u) << 7u)", "((h & 1u) << 8u)"),
    ("iq3_s scale nibbles of a byte swapped", "IQ3_S", "dq_iq3_s",
     ">> (4u * (ib & 1u))) & 15u", ">> (4u * (1u - (ib & 1u)))) & 15u"),
    ("iq3_s scale d * 2s, not d * (1 + 2s)", "IQ3_S", "dq_iq3_s",
     "f32(1u + 2u * sc)", "f32(2u * sc)"),
    ("iq3_s sign bits of the hi point from bits 0-3", "IQ3_S", "dq_iq3_s",
     "signs4(s, 4u)", "signs4(s, 0u)"),
    ("iq3_s one qh byte for two sub-blocks (ggml's loop steps qh per pair)", "IQ3_S", "dq_iq3_s",
     "IQ3_S_QH + ib)", "IQ3_S_QH + (ib >> 1u))"),
    ("iq1_s delta sign flipped (bit 15 set means -0.125)", "IQ1_S", "dq_iq1_s",
     "select(IQ1_DELTA, -IQ1_DELTA, (qh & 0x8000u) != 0u)", "select(-IQ1_DELTA, IQ1_DELTA, (qh & 0x8000u) != 0u)"),
    ("iq1_s scale from bits 11-13 of qh, not 12-14", "IQ1_S", "dq_iq1_s",
     "((qh >> 12u) & 7u)", "((qh >> 11u) & 7u)"),
    ("iq1_s grid index high bits 4 apart, not 3", "IQ1_S", "dq_iq1_s",
     "(qh >> (3u * (gi & 3u)))", "(qh >> (4u * (gi & 3u)))"),
    ("iq1 grid values read unsigned (-1 as 255)", "IQ1_S", "iq1_values",
     "bitcast<vec4<i32>>(grid_values(h, 0u, 2u, IQ1S_LEVELS) << vec4<u32>(24u)) >> vec4<u32>(24u)",
     "vec4<i32>(grid_values(h, 0u, 2u, IQ1S_LEVELS))"),
    ("iq1_m d's second nibble from bits 20-23 of the scales, not 28-31", "IQ1_M", "dq_iq1_m",
     "((s01 >> 24u) & 0xF0u)", "((s01 >> 16u) & 0xF0u)"),
    ("iq1_m 3-bit scales: sub-block and half order swapped within a u16", "IQ1_M", "dq_iq1_m",
     "6u * (ib & 1u) + 3u * ((gi >> 1u) & 1u)", "3u * (ib & 1u) + 6u * ((gi >> 1u) & 1u)"),
    ("iq1_m delta sign flipped", "IQ1_M", "dq_iq1_m",
     "(qh & 8u) != 0u", "(qh & 8u) == 0u"),
    ("iq1_m qh nibble per pair of groups, not per group", "IQ1_M", "dq_iq1_m",
     "+ 4u * (gi & 1u))", "+ 4u * ((gi >> 1u) & 1u))"),
    ("q1_0 set bit read as -d (the grid types' sign convention)", "Q1_0", "pm1",
     "2.0 * vec4<f32>(bit) - 1.0", "1.0 - 2.0 * vec4<f32>(bit)"),
    ("q1_0 high/low nibble order", "Q1_0", "dq_q1_0",
     "Dq(d * pm1(b, 0u), d * pm1(b, 4u))", "Dq(d * pm1(b, 4u), d * pm1(b, 0u))"),
    ("q1_0 blocks of 64 (Q2_0's), not 128", "Q1_0", "dq_q1_0",
     "(g >> 4u) * Q1_0_BYTES", "(g >> 3u) * Q1_0_BYTES"),
    ("q2_0 offset dropped (field read as the value)", "Q2_0", "dq_q2_0",
     "d * (lo - 1.0)", "d * lo"),
    ("q2_0 fields of a byte most significant first", "Q2_0", "dq_q2_0",
     "vec4<u32>(0u, 2u, 4u, 6u)", "vec4<u32>(6u, 4u, 2u, 0u)"),
    ("q2_0 scale read from the quants' first bytes", "Q2_0", "dq_q2_0",
     "ld_f16(blk + Q2_0_D)", "ld_f16(blk + Q2_0_QS)"),
    # the K types' own matvec loops (lab/ops/matmul.py MATVEC_LOOPS): only the matvec check reads them
    ("q4_k loop: the mins' input sums added instead of subtracted", "Q4_K", "accumulate",
     "vec4<f32>(p0, -s)", "vec4<f32>(p0, s)", "matvec_k.wgsl"),
    ("q4_k loop: piece qs one vec4 off (half ignored)", "Q4_K", "accumulate",
     "{{KT}}_QS / 16u + 2u * j + half", "{{KT}}_QS / 16u + 2u * j", "matvec_k.wgsl"),
    ("q4_k loop: high nibbles' inputs 16 values early", "Q4_K", "accumulate",
     "let xb0 = in4(e + 32u);", "let xb0 = in4(e + 16u);", "matvec_k.wgsl"),
    ("q5_k loop: fifth bit of the high nibbles from bit 2j", "Q5_K", "k_piece",
     "let b = a + 1u;", "let b = a;", "matvec_k.wgsl"),
    ("q5_k loop: the fifth bit joined as 8, not 16", "Q5_K", "k_hi",
     "(((h >> bit) & 0x01010101u) << 4u)", "(((h >> bit) & 0x01010101u) << 3u)", "matvec_k.wgsl"),
    ("q5_1 fifth bit joined as 8, not 16", "Q5_1", "q5_hi",
     "& vec4<u32>(15u)) | (h << vec4<u32>(4u)));", "& vec4<u32>(15u)) | (h << vec4<u32>(3u)));"),
    ("q6_k loop: scales of the other 16-value half", "Q6_K", "q6_scales",
     "ll == 1u);", "ll == 0u);", "matvec_q6_k.wgsl"),
    ("q6_k loop: -32 offset dropped", "Q6_K", "accumulate",
     "let c = 32.0 * sx;", "let c = 0.0 * sx;", "matvec_q6_k.wgsl"),
    ("q6_k loop: quarter 3 from qh bits 4-5", "Q6_K", "q6_dots",
     "((h >> 2u) & 0x30303030u)", "(h & 0x30303030u)", "matvec_q6_k.wgsl"),
    ("q2_k loop: the mins added instead of subtracted", "Q2_K", "q2_row",
     "dm.x * dot(vec4<f32>(s & vec4<u32>(15u)), r) - dm.y", "dm.x * dot(vec4<f32>(s & vec4<u32>(15u)), r) + dm.y",
     "matvec_q2_k.wgsl"),
    ("q2_k loop: scale and min nibbles swapped", "Q2_K", "q2_row",
     "dot(vec4<f32>(s & vec4<u32>(15u)), r) - dm.y * dot(vec4<f32>(s >> vec4<u32>(4u)), sx)",
     "dot(vec4<f32>(s >> vec4<u32>(4u)), r) - dm.y * dot(vec4<f32>(s & vec4<u32>(15u)), sx)", "matvec_q2_k.wgsl"),
    ("q2_k loop: sub-blocks of a run's two halves share a scale byte", "Q2_K", "q2_row",
     ">> vec4<u32>(8u * h, 8u * h + 16u, 8u * h, 8u * h + 16u)", ">> vec4<u32>(0u, 16u, 0u, 16u)",
     "matvec_q2_k.wgsl"),
    ("q2_k loop: runs 1 and 2 read each other's bits", "Q2_K", "q2_dots",
     "dot(vec4<f32>((b >> vec4<u32>(2u)) & m), x1)", "dot(vec4<f32>((b >> vec4<u32>(4u)) & m), x1)",
     "matvec_q2_k.wgsl"),
    ("q3_k loop: hmask bit of run 1 from bit 4n (run 0's)", "Q3_K", "q3_dots",
     "((h << 1u) & hb)", "((h << 2u) & hb)", "matvec_q3_k.wgsl"),
    ("q3_k loop: the -4 offset dropped", "Q3_K", "accumulate",
     "let c = 4.0 * sx;", "let c = 0.0 * sx;", "matvec_q3_k.wgsl"),
    ("q3_k loop: high scale bits of runs 1 and 2 swapped", "Q3_K", "q3_scales",
     "vec4<u32>(sh, sh + 16u, sh + 2u, sh + 18u)", "vec4<u32>(sh, sh + 2u, sh + 16u, sh + 18u)", "matvec_q3_k.wgsl"),
    ("q3_k loop: low scale nibble of the wrong half", "Q3_K", "q3_scales",
     "let sh = 8u * h + 4u * n;", "let sh = 8u * h + 4u * (1u - n);", "matvec_q3_k.wgsl"),
    ("q3_k loop: blocks read as word-aligned (110-byte blocks)", "Q3_K", "q3_words",
     "(o & 2u) != 0u", "false", "matvec_q3_k.wgsl"),
    ("q3_k loop: the step's words in the wrong order", "Q3_K", "q3_at",
     "select(v.z, v.w, l == 3u)", "select(v.w, v.z, l == 3u)", "matvec_q3_k.wgsl"),
    ("iq4_xs loop: scales_h bit pair of sub-block ib at bit ib", "IQ4_XS", "iq4_xs_step",
     "(dsh >> (16u + 2u * ib))", "(dsh >> (16u + ib))", "matvec_iq4_xs.wgsl"),
    ("iq4_xs loop: scales_l nibbles swapped within a byte", "IQ4_XS", "iq4_xs_step",
     "(sl >> (4u * ib))", "(sl >> (4u * (ib ^ 1u)))", "matvec_iq4_xs.wgsl"),
    ("iq4_xs loop: sub-blocks of a block in the wrong order", "IQ4_XS", "accumulate",
     "let ib = u & 7u;", "let ib = (u + 1u) & 7u;", "matvec_iq4_xs.wgsl"),
    ("iq4_xs loop: high nibbles' inputs swapped between the two qs words", "IQ4_XS", "iq4_xs_step",
     "dot(lv4(nibs_hi(qa.x)), x4) + dot(lv4(nibs_hi(qa.y)), x5)",
     "dot(lv4(nibs_hi(qa.y)), x4) + dot(lv4(nibs_hi(qa.x)), x5)", "matvec_iq4_xs.wgsl"),
    ("iq4_xs loop: the level table in reverse order", "IQ4_XS", "accumulate",
     "iq4_levels(vec4<u32>(i)).x", "iq4_levels(vec4<u32>(15u - i)).x", "matvec_iq4_xs.wgsl"),
    # the grid types' own loop (wgsl/matvec_iq.wgsl): its steps, its grid binding, its values from float bit patterns
    ("iq2_xxs loop: group 1's grid index from byte 2 of a0", "IQ2_XXS", "iq2_xxs_step",
     "pt8((a0 >> 8u) & 0xFFu", "pt8((a0 >> 16u) & 0xFFu", "matvec_iq.wgsl"),
    ("iq2_xxs loop: group 1's sign index from bits 8-14, not 7-13", "IQ2_XXS", "iq2_xxs_step",
     "ksigns((a1 >> 7u) & 127u)", "ksigns((a1 >> 8u) & 127u)", "matvec_iq.wgsl"),
    ("iq2_xxs loop: scale nibble from bits 24-27", "IQ2_XXS", "iq2_xxs_step",
     "uf(a1 >> 28u)", "uf((a1 >> 24u) & 15u)", "matvec_iq.wgsl"),
    ("grid loop: sub-blocks of a block in the wrong order (IQ2_XS)", "IQ2_XS", "accumulate",
     "let ib = u & 7u;", "let ib = (u + 1u) & 7u;", "matvec_iq.wgsl"),
    ("grid loop: sub-blocks of a block in the wrong order (IQ1_M)", "IQ1_M", "accumulate",
     "let ib = u & 7u;", "let ib = (u + 1u) & 7u;", "matvec_iq.wgsl"),
    ("iq3_xxs loop: the two points of group 0 swapped", "IQ3_XXS", "iq3_xxs_step",
     "pt4x2(q0 & 0xFFu, (q0 >> 8u) & 0xFFu,", "pt4x2((q0 >> 8u) & 0xFFu, q0 & 0xFFu,", "matvec_iq.wgsl"),
    ("iq3_xxs loop: group 1's sign index from bits 8-14", "IQ3_XXS", "iq3_xxs_step",
     "ksigns((a >> 7u) & 127u)", "ksigns((a >> 8u) & 127u)", "matvec_iq.wgsl"),
    ("iq3_xxs loop: scale halved twice (IQ2_XXS's quarter)", "IQ3_XXS", "iq3_xxs_step",
     "(0.5 + uf(a >> 28u)) * 0.5", "(0.5 + uf(a >> 28u)) * 0.25", "matvec_iq.wgsl"),
    ("iq2_xs loop: grid index of 8 bits, not 9", "IQ2_XS", "iq2_xs_step",
     "pt8(q0 & 511u", "pt8(q0 & 255u", "matvec_iq.wgsl"),
    ("iq2_xs loop: sign index from bits 8-14, not 9-15", "IQ2_XS", "iq2_xs_step",
     "ksigns((q0 >> 9u) & 127u)", "ksigns((q0 >> 8u) & 127u)", "matvec_iq.wgsl"),
    ("iq2_xs loop: the scale byte's nibbles for the wrong halves", "IQ2_XS", "iq2_xs_step",
     "(0.5 + uf(sc & 15u)) * lo + (0.5 + uf(sc >> 4u)) * hi", "(0.5 + uf(sc >> 4u)) * lo + (0.5 + uf(sc & 15u)) * hi",
     "matvec_iq.wgsl"),
    ("iq2_s loop: group 0's index bits 8-9 from qh bits 2-3", "IQ2_S", "iq2_s_step",
     "((qh & 3u) << 8u)", "((qh & 12u) << 6u)", "matvec_iq.wgsl"),
    ("iq2_s loop: group 0 signed by group 1's sign byte", "IQ2_S", "iq2_s_step",
     "sg & 0xFFu, x0, x1", "(sg >> 8u) & 0xFFu, x0, x1", "matvec_iq.wgsl"),
    ("iq2_s loop: one scale byte for two sub-blocks", "IQ2_S", "iq2_s_step",
     "IQ2_S_SCALES + ib)", "IQ2_S_SCALES + (ib >> 1u))", "matvec_iq.wgsl"),
    ("iq3_s loop: point 1's 9th bit from qh bit 0", "IQ3_S", "iq3_s_step",
     "((h >> 1u) & 256u)", "(h & 256u)", "matvec_iq.wgsl"),
    ("iq3_s loop: scale nibbles of a byte swapped", "IQ3_S", "iq3_s_step",
     ">> (4u * (ib & 1u))) & 15u", ">> (4u * (1u - (ib & 1u)))) & 15u", "matvec_iq.wgsl"),
    ("iq3_s loop: group 1 signed by group 0's sign byte", "IQ3_S", "iq3_s_step",
     "(sg >> 8u) & 0xFFu, x2, x3", "sg & 0xFFu, x2, x3", "matvec_iq.wgsl"),
    ("iq1_s loop: group 1's index high bits 4 apart from group 0's, not 3", "IQ1_S", "iq1_s_step",
     "((qh & 0x38u) << 5u)", "((qh & 0x70u) << 4u)", "matvec_iq.wgsl"),
    ("iq1_s loop: delta sign flipped", "IQ1_S", "iq1_s_step",
     "select(IQ1_DELTA, -IQ1_DELTA, (qh & 0x8000u) != 0u)", "select(-IQ1_DELTA, IQ1_DELTA, (qh & 0x8000u) != 0u)",
     "matvec_iq.wgsl"),
    ("iq1_s loop: scale from bits 11-13", "IQ1_S", "iq1_s_step",
     "((qh >> 12u) & 7u)", "((qh >> 11u) & 7u)", "matvec_iq.wgsl"),
    ("iq1_m loop: the halves' 3-bit scales swapped", "IQ1_M", "iq1_m_step",
     "uf(2u * (sc & 7u) + 1u) * lo + uf(2u * (sc >> 3u) + 1u) * hi",
     "uf(2u * (sc >> 3u) + 1u) * lo + uf(2u * (sc & 7u) + 1u) * hi", "matvec_iq.wgsl"),
    ("iq1_m loop: one delta sign per pair of groups", "IQ1_M", "iq1_m_step",
     "vec4<u32>(3u, 7u, 11u, 15u)", "vec4<u32>(3u, 3u, 11u, 11u)", "matvec_iq.wgsl"),
    ("grid loop: the index word read two bytes on (IQ2_S)", "IQ2_S", "iq2_s_step",
     "ld4(b + IQ2_S_QS + 4u * ib)", "ld4(b + IQ2_S_QS + 4u * ib + 2u)", "matvec_iq.wgsl"),
    ("grid loop: IQ3 point p from the other half of its vec2", "IQ3_S", "gw4",
     "G[p >> 1u][p & 1u]", "G[p >> 1u][~p & 1u]", "matvec_iq.wgsl"),
    ("grid loop: 8-value points read pairwise swapped (point p ^ 1)", "IQ2_S", "gw8",
     "return G[p];", "return G[p ^ 1u];", "matvec_iq.wgsl"),
    ("grid loop: IQ2's hi half signed by bits 0-3", "IQ2_XS", "pt8",
     "flip_hi(gv_u(g.y), s)", "flip_lo(gv_u(g.y), s)", "matvec_iq.wgsl"),
    ("grid loop: IQ1's int8 without the top bit flipped (-1 as 255)", "IQ1_M", "gv_i",
     "bytes23(w ^ 0x80808080u)", "bytes23(w)", "matvec_iq.wgsl"),
    ("grid loop: 2^23's bits one exponent high", "IQ2_XXS", "gv_u",
     "bytes23(w) - 8388608.0", "bytes23(w) - 4194304.0", "matvec_iq.wgsl"),
    ("grid loop: sign bit k from bit k + 1 of the low nibble", "IQ3_XXS", "flip_lo",
     "vec4<u32>(31u, 30u, 29u, 28u)", "vec4<u32>(30u, 29u, 28u, 27u)", "matvec_iq.wgsl"),
    ("grid loop: the high nibble's signs from the low nibble", "IQ2_S", "flip_hi",
     "vec4<u32>(27u, 26u, 25u, 24u)", "vec4<u32>(31u, 30u, 29u, 28u)", "matvec_iq.wgsl"),
    ("grid loop: an unaligned 8-byte field's second word from the first's high half only", "IQ3_S", "ld8",
     "(b >> 16u) | (c << 16u)", "b >> 16u", "matvec_iq.wgsl"),
    ("grid loop: scale field read as its bits (no 2^23 subtracted)", "IQ2_XS", "uf",
     "bitcast<f32>(v | F23) - 8388608.0", "bitcast<f32>(v | F23)", "matvec_iq.wgsl"),
]

# The quant.wgsl functions a type's own loop calls as well (so its matvec must catch their traps too).
LOOP_CALLS = {"matvec_k.wgsl": {"k_scales"}, "matvec_iq4_xs.wgsl": {"iq4_levels"}, "matvec_iq.wgsl": {"ksigns"}}


def _checks(device, name):
    """Errors of the dequant check (get_rows over all rows) and of the product check (matvec) through the
    type's own loop (input at offset 0) and through the group loop (offset 3: scalar input, quant.wgsl's dq)."""
    raw = qo.random_tensor(name, 24, 512 if name in qo.K_TYPES else 128 if BY_NAME[name].block == 64 else 96,
                           seed=11)
    ref = qo.dequant(raw, name)
    x = np.random.default_rng(12).standard_normal(ref.shape[1]).astype(np.float32)
    with Rig(device) as r:                      # a fresh KernelCache: compiled from the current folder
        w = r.weight(name, raw)
        got = r.get_rows(w, list(range(raw.shape[0])))
        return {"dequant": qo.dequant_err(got, ref), "matvec": qo.dot_err(r.matvec(w, x), ref, x),
                "matvec groups": qo.dot_err(r.matvec(w, x, x_offset=3), ref, x)}


def _must_catch(name: str, fn: str, file: str) -> set[str]:
    """The checks whose code holds the mutated function: a loop file's only the matvec; quant.wgsl's the dequant and
    the group loop, and the type's own loop too when that calls it (LOOP_CALLS)."""
    if file != "quant.wgsl":
        return {"matvec"}
    own = name not in MATVEC_LOOPS or fn in LOOP_CALLS.get(MATVEC_LOOPS[name][0], set())
    return {"dequant", "matvec groups"} | ({"matvec"} if own else set())


_GOOD: dict[str, dict] = {}      # type -> its checks' errors on the unmodified source (the same for each of its traps)


def _by_default(traps: list[tuple]) -> list:
    """The first trap of each type in each file it touches by default (the harness's power to fail on every
    type's code), the other traps with --slow: a trap proves the checks, not the kernel, and the checks run by
    default in test_get_rows / test_matmul."""
    seen: set[tuple[str, str]] = set()
    out = []
    for t in traps:
        where = (t[1], t[5] if len(t) > 5 else "quant.wgsl")
        out.append(t if where not in seen else pytest.param(t, marks=pytest.mark.slow, id=t[0]))
        seen.add(where)
    return out


@pytest.mark.parametrize("trap", _by_default(TRAPS), ids=[t[0] for t in TRAPS])
def test_trap_is_caught(device, tmp_path, trap):
    _, name, fn, old, new, *file = trap
    file = file[0] if file else "quant.wgsl"
    if name not in _GOOD:       # once a type and process: same data, same harness, the sources as they are
        _GOOD[name] = _checks(device, name)
    good = _GOOD[name]
    assert all(v <= (DEQUANT_TOL if k == "dequant" else DOT_TOL) for k, v in good.items()), good
    with mutated_wgsl(tmp_path, fn, old, new, file):
        bad = _checks(device, name)
    missed = [k for k in _must_catch(name, fn, file) if bad[k] <= (DEQUANT_TOL if k == "dequant" else DOT_TOL)]
    assert not missed, f"{trap[0]}: missed by {missed} ({bad})"
