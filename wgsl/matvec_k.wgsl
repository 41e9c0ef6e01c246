// matvec.wgsl's loop for Q4_K and Q5_K (pasted there: reads its W, x, p, WG). Constants: KT (Q4_K or Q5_K,
// the prefix of quant.wgsl's layout names), QH (qh_none, or qh_q5_k for the 5th bits), QH16 (Q5_K: the
// vec4 index of qh within a block).
// One step is a 16-byte piece of a block's qs (piece i of 8: chunk j = i / 2, values l0 = 16 (i % 2)..+15 of
// sub-block 2j in the low nibbles and of 2j + 1 in the high), read as one vec4<u32> through W4, a second view
// of the same buffer: neighbouring threads read neighbouring pieces, 512 contiguous bytes a subgroup of 32.
// The block's d, dmin and 6-bit scales are unpacked once per 32 values (the group loop unpacked them per 8,
// and the K-quants ran at 0.21-0.36 TB/s on the H200; docs/performance.md), and the mins need only the sum
// of the inputs per sub-block, the same for the 4 rows: sum_e (d sc q_e - dmin m) x_e = d sc sum(q x) - dmin m sum(x).
// Rows and blocks are 16-byte aligned (144 and 176 bytes a block). Pieces per row: cols / 32.

@group(0) @binding({{B_W4}}) var<storage, read> W4: array<vec4<u32>>;

// (d sc_a, d sc_b, dmin m_a, dmin m_b) of chunk j of the block at word w.
fn k_head(w: u32, j: u32) -> vec4<f32> {
    let dm = unpack2x16float(W[w + {{KT}}_DM / 4u]);
    let sw = w + {{KT}}_SCALES / 4u;
    let s = k_scales(W[sw], W[sw + 1u], W[sw + 2u], j);
    return vec4<f32>(dm.x * s.xy, dm.y * s.zw);
}

fn qh_none(i: u32) -> vec4<u32> { return vec4<u32>(0u); }
fn qh_q5_k(i: u32) -> vec4<u32> { return W4[i]; }

// Four values of a piece: the nibbles of word q, plus 16 where bit `bit` of q's qh bytes h is set, joined in the
// word before the one conversion a value (converting the bit apart made Q5_K 1.05-1.15 TB/s on the H200, joined
// 1.6-1.7: the conversions bounded it, not the reads; docs/performance.md).
fn k_lo(q: u32, h: u32, bit: u32) -> vec4<f32> {
    return vec4<f32>(u8x4((q & 0x0F0F0F0Fu) | (((h >> bit) & 0x01010101u) << 4u)));
}
fn k_hi(q: u32, h: u32, bit: u32) -> vec4<f32> {
    return vec4<f32>(u8x4(((q >> 4u) & 0x0F0F0F0Fu) | (((h >> bit) & 0x01010101u) << 4u)));
}

// One row's piece: (sum q x over the low half, over the high half); xa* are the low values' inputs, xb* the high.
fn k_piece(q: vec4<u32>, h: vec4<u32>, j: u32, xa0: vec4<f32>, xa1: vec4<f32>, xa2: vec4<f32>, xa3: vec4<f32>,
           xb0: vec4<f32>, xb1: vec4<f32>, xb2: vec4<f32>, xb3: vec4<f32>) -> vec2<f32> {
    let a = 2u * j;
    let b = a + 1u;
    return vec2<f32>(dot(k_lo(q.x, h.x, a), xa0) + dot(k_lo(q.y, h.y, a), xa1) + dot(k_lo(q.z, h.z, a), xa2) + dot(k_lo(q.w, h.w, a), xa3),
                     dot(k_hi(q.x, h.x, b), xb0) + dot(k_hi(q.y, h.y, b), xb1) + dot(k_hi(q.z, h.z, b), xb2) + dot(k_hi(q.w, h.w, b), xb3));
}

fn accumulate(rb: vec4<u32>, lid: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    let wb = rb >> vec4<u32>(2u);
    for (var i = lid; i < p.cols / 32u; i += WG) {
        let blk = i >> 3u;
        let j = (i >> 1u) & 3u;
        let half = i & 1u;
        let e = 256u * blk + 64u * j + 16u * half;
        let xa0 = in4(e);
        let xa1 = in4(e + 4u);
        let xa2 = in4(e + 8u);
        let xa3 = in4(e + 12u);
        let xb0 = in4(e + 32u);
        let xb1 = in4(e + 36u);
        let xb2 = in4(e + 40u);
        let xb3 = in4(e + 44u);
        let s = vec2<f32>(dot(xa0 + xa1 + xa2 + xa3, vec4<f32>(1.0)), dot(xb0 + xb1 + xb2 + xb3, vec4<f32>(1.0)));
        let w = wb + vec4<u32>(blk * ({{KT}}_BYTES / 4u));
        let v = (w >> vec4<u32>(2u)) + vec4<u32>({{KT}}_QS / 16u + 2u * j + half);
        let hv = (w >> vec4<u32>(2u)) + vec4<u32>({{QH16}}u + half);
        let p0 = k_piece(W4[v.x], {{QH}}(hv.x), j, xa0, xa1, xa2, xa3, xb0, xb1, xb2, xb3);
        let p1 = k_piece(W4[v.y], {{QH}}(hv.y), j, xa0, xa1, xa2, xa3, xb0, xb1, xb2, xb3);
        let p2 = k_piece(W4[v.z], {{QH}}(hv.z), j, xa0, xa1, xa2, xa3, xb0, xb1, xb2, xb3);
        let p3 = k_piece(W4[v.w], {{QH}}(hv.w), j, xa0, xa1, xa2, xa3, xb0, xb1, xb2, xb3);
        acc += vec4<f32>(dot(k_head(w.x, j), vec4<f32>(p0, -s)), dot(k_head(w.y, j), vec4<f32>(p1, -s)),
                         dot(k_head(w.z, j), vec4<f32>(p2, -s)), dot(k_head(w.w, j), vec4<f32>(p3, -s)));
    }
    return acc;
}
