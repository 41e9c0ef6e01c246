// matvec.wgsl's loop for IQ4_XS (pasted there: reads its W, x, p, WG). Constant: B_W4, the binding of W2, a second
// view of the same buffer as vec2<u32>: blocks of 136 bytes are 8-byte aligned (not 16), as is each field. One step
// is a 32-value sub-block u (ib = u % 8 of block u / 8; quant.wgsl's layout: value 32ib + j is the low nibble of
// qs[16ib + j], 32ib + 16 + j its high nibble), read as two vec2 loads, its header's two words (d and scales_h,
// scales_l) through W, and its 6-bit scale unpacked once per 32 values (the group loop unpacked it per 8, at 0.38-0.62 TB/s on the H200);
// neighbouring threads read neighbouring 16-byte runs. The 16 levels sit in workgroup memory, one load a value
// (16 words in 16 banks: no conflicts), where quant.wgsl's iq4_levels spends a dozen integer operations picking a
// byte out of four constant words. Units per row: cols / 32.

@group(0) @binding({{B_W4}}) var<storage, read> W2: array<vec2<u32>>;

var<workgroup> iq4_lv: array<f32, 16>;

fn lv4(n: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(iq4_lv[n.x], iq4_lv[n.y], iq4_lv[n.z], iq4_lv[n.w]);
}

// Sub-block ib of the block at vec2 index b, dotted with its 32 inputs x0..x7 (4 values each).
fn iq4_xs_step(b: u32, ib: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>,
               x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let dsh = W[2u * b + IQ4_XS_D_SH / 4u];
    let sl = W[2u * b + IQ4_XS_SL / 4u];
    let qa = W2[b + IQ4_XS_QS / 8u + 2u * ib];      // qs bytes 16ib..16ib + 7
    let qb = W2[b + IQ4_XS_QS / 8u + 2u * ib + 1u]; // 16ib + 8..16ib + 15
    let ls = ((sl >> (4u * ib)) & 15u) | (((dsh >> (16u + 2u * ib)) & 3u) << 4u);
    let dl = unpack2x16float(dsh).x * (f32(ls) - 32.0);
    return dl * (dot(lv4(nibs_lo(qa.x)), x0) + dot(lv4(nibs_lo(qa.y)), x1) + dot(lv4(nibs_lo(qb.x)), x2)
               + dot(lv4(nibs_lo(qb.y)), x3) + dot(lv4(nibs_hi(qa.x)), x4) + dot(lv4(nibs_hi(qa.y)), x5)
               + dot(lv4(nibs_hi(qb.x)), x6) + dot(lv4(nibs_hi(qb.y)), x7));
}

fn accumulate(rb: vec4<u32>, lid: u32) -> vec4<f32> {
    for (var i = lid; i < 16u; i += WG) {
        iq4_lv[i] = iq4_levels(vec4<u32>(i)).x;
    }
    workgroupBarrier();
    var acc = vec4<f32>(0.0);
    for (var u = lid; u < p.cols / 32u; u += WG) {
        let e = 32u * u;
        let x0 = in4(e);
        let x1 = in4(e + 4u);
        let x2 = in4(e + 8u);
        let x3 = in4(e + 12u);
        let x4 = in4(e + 16u);
        let x5 = in4(e + 20u);
        let x6 = in4(e + 24u);
        let x7 = in4(e + 28u);
        let b = (rb + vec4<u32>((u >> 3u) * IQ4_XS_BYTES)) >> vec4<u32>(3u);
        let ib = u & 7u;
        acc += vec4<f32>(iq4_xs_step(b.x, ib, x0, x1, x2, x3, x4, x5, x6, x7),
                         iq4_xs_step(b.y, ib, x0, x1, x2, x3, x4, x5, x6, x7),
                         iq4_xs_step(b.z, ib, x0, x1, x2, x3, x4, x5, x6, x7),
                         iq4_xs_step(b.w, ib, x0, x1, x2, x3, x4, x5, x6, x7));
    }
    return acc;
}
