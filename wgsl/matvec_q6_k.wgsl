// matvec.wgsl's loop for Q6_K (pasted there: reads its W, x, p, WG). Blocks of 210 bytes are only half-word
// aligned, so fields go through ld_u32. One step is a 64-value unit u: half h = (u / 2) % 2 of block u / 4,
// l = 16 (u % 2)..+15 of its four quarters k (quant.wgsl's layout: value 128h + 32k + l), so its four signed
// scales (8h + 2k + l / 16) are read once per 64 values, not twice per 8 as the group loop does; the -32
// offset is taken from the inputs' sum: sum((q - 32) x) = sum(q x) - 32 sum(x). Units per row: cols / 64.

// Values 4 of each quarter k = 0..3 of a half: q of quarter k is nibble k / 2 of ql word a (k even) or b
// (k odd) | bits 2k, 2k + 1 of each qh byte << 4, joined in the word (each byte's 6 bits) before the one
// conversion a value (two, the high bits apart, bounded this loop at 0.97-1.18 TB/s on the H200); dotted with that quarter's inputs x0..x3.
fn q6_dots(a: u32, b: u32, h: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> vec4<f32> {
    let q0 = vec4<f32>(u8x4((a & 0x0F0F0F0Fu) | ((h << 4u) & 0x30303030u)));
    let q1 = vec4<f32>(u8x4((b & 0x0F0F0F0Fu) | ((h << 2u) & 0x30303030u)));
    let q2 = vec4<f32>(u8x4(((a >> 4u) & 0x0F0F0F0Fu) | (h & 0x30303030u)));
    let q3 = vec4<f32>(u8x4(((b >> 4u) & 0x0F0F0F0Fu) | ((h >> 2u) & 0x30303030u)));
    return vec4<f32>(dot(q0, x0), dot(q1, x1), dot(q2, x2), dot(q3, x3));
}

// A row's scales of the unit (8h + ll + 2k, k = 0..3: bytes ll and ll + 2 of the half's two scale words) times d.
fn q6_scales(blk: u32, h: u32, ll: u32) -> vec4<f32> {
    let so = blk + Q6_K_SCALES + 8u * h;
    let a = i8x4(ld_u32(so));
    let b = i8x4(ld_u32(so + 4u));
    return ld_f16(blk + Q6_K_D) * select(vec4<f32>(a.x, a.z, b.x, b.z), vec4<f32>(a.y, a.w, b.y, b.w), ll == 1u);
}

fn accumulate(rb: vec4<u32>, lid: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var u = lid; u < p.cols / 64u; u += WG) {
        let h = (u >> 1u) & 1u;
        let ll = u & 1u;
        let e = 256u * (u >> 2u) + 128u * h + 16u * ll;
        let blk = rb + vec4<u32>((u >> 2u) * Q6_K_BYTES);
        let ql = blk + vec4<u32>(Q6_K_QL + 64u * h + 16u * ll);
        let qh = blk + vec4<u32>(Q6_K_QH + 32u * h + 16u * ll);
        // per row, per quarter k: sum q x; and per quarter: sum x
        var r0 = vec4<f32>(0.0);
        var r1 = vec4<f32>(0.0);
        var r2 = vec4<f32>(0.0);
        var r3 = vec4<f32>(0.0);
        var sx = vec4<f32>(0.0);
        for (var l = 0u; l < 16u; l += 4u) {
            let x0 = in4(e + l);
            let x1 = in4(e + 32u + l);
            let x2 = in4(e + 64u + l);
            let x3 = in4(e + 96u + l);
            sx += vec4<f32>(dot(x0, vec4<f32>(1.0)), dot(x1, vec4<f32>(1.0)), dot(x2, vec4<f32>(1.0)), dot(x3, vec4<f32>(1.0)));
            r0 += q6_dots(ld_u32(ql.x + l), ld_u32(ql.x + 32u + l), ld_u32(qh.x + l), x0, x1, x2, x3);
            r1 += q6_dots(ld_u32(ql.y + l), ld_u32(ql.y + 32u + l), ld_u32(qh.y + l), x0, x1, x2, x3);
            r2 += q6_dots(ld_u32(ql.z + l), ld_u32(ql.z + 32u + l), ld_u32(qh.z + l), x0, x1, x2, x3);
            r3 += q6_dots(ld_u32(ql.w + l), ld_u32(ql.w + 32u + l), ld_u32(qh.w + l), x0, x1, x2, x3);
        }
        let c = 32.0 * sx;
        acc += vec4<f32>(dot(q6_scales(blk.x, h, ll), r0 - c), dot(q6_scales(blk.y, h, ll), r1 - c),
                         dot(q6_scales(blk.z, h, ll), r2 - c), dot(q6_scales(blk.w, h, ll), r3 - c));
    }
    return acc;
}
