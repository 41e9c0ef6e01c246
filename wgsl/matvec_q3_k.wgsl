// matvec.wgsl's loop for Q3_K (pasted there: reads its W, x, p, WG). One step is a 64-value unit u as Q2_K's
// (matvec_q2_k.wgsl): half n = (u / 2) % 2 of block u / 4, l = 16 (u % 2)..+15 of its four runs j = 0..3, whose
// 2-bit fields are bits 2j of qs[32n + l] and high bits bit 4n + j of hmask[l] (quant.wgsl's layout). Blocks of 110
// bytes start 2 bytes past a word every other block, and all their fields sit at the same offset within a word (0,
// 32, 96, 108), so a unit's 16 qs bytes and 16 hmask bytes are each read as five aligned words, funnelled into four
// (ld_u32 would load eight), and its four sub-blocks' 6-bit scales and d come from four more, once per 64 values (the
// group loop read them per 8, at 0.38-0.62 TB/s on the H200). The high bit joins the 2-bit field in the integer (one
// conversion a value), and the -4 offset is taken from the runs' input sums: sum (q - 4) x = sum(q x) - 4 sum(x).
// Units per row: cols / 64.

// Four words of W from byte o (even): aligned words as they are, or each from the halves of two.
fn q3_words(o: u32) -> vec4<u32> {
    let i = o >> 2u;
    let a = vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u]);
    return select(a, (a >> vec4<u32>(16u)) | (vec4<u32>(a.yzw, W[i + 4u]) << vec4<u32>(16u)), (o & 2u) != 0u);
}

// Word l of a row's four (the step's: the loop's bound is constant, so this folds once unrolled, else three selects).
fn q3_at(v: vec4<u32>, l: u32) -> u32 {
    return select(select(v.x, v.y, l == 1u), select(v.z, v.w, l == 3u), l >= 2u);
}

// Four values of each run j = 0..3, q + 4 h in 0..7, from qs word q (bits 2j of each byte) and hmask word hm (bit 4n + j),
// dotted with run j's inputs x0..x3.
fn q3_dots(q: u32, hm: u32, n: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> vec4<f32> {
    let h = hm >> (4u * n);
    let m = 0x03030303u;
    let hb = 0x04040404u;
    return vec4<f32>(dot(vec4<f32>(u8x4((q & m) | ((h << 2u) & hb))), x0),
                     dot(vec4<f32>(u8x4(((q >> 2u) & m) | ((h << 1u) & hb))), x1),
                     dot(vec4<f32>(u8x4(((q >> 4u) & m) | (h & hb))), x2),
                     dot(vec4<f32>(u8x4(((q >> 6u) & m) | ((h >> 1u) & hb))), x3));
}

// A row's d (scale - 32) of the unit's four sub-blocks s = 8n + 2j + h, for the block at byte b: the low 4 bits are nibble
// n of scales[2j + h] (bytes h, h + 2 of scale words 0 and 1), the high 2 bits bits 4n + 2 (j / 2) of scales[8 + (2j + h) % 4]
// (bytes h, h + 2 of word 2); d is the low half of the word after them.
fn q3_scales(b: u32, n: u32, h: u32) -> vec4<f32> {
    let i = (b + Q3_K_SCALES) >> 2u;
    let a = vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u]);
    let v = select(a, (a >> vec4<u32>(16u)) | (vec4<u32>(a.yzw, 0u) << vec4<u32>(16u)), (b & 2u) != 0u);
    let sh = 8u * h + 4u * n;
    let lo = (vec4<u32>(v.x, v.x, v.y, v.y) >> vec4<u32>(sh, sh + 16u, sh, sh + 16u)) & vec4<u32>(15u);
    let hi = (vec4<u32>(v.z) >> vec4<u32>(sh, sh + 16u, sh + 2u, sh + 18u)) & vec4<u32>(3u);
    return unpack2x16float(v.w).x * (vec4<f32>(lo | (hi << vec4<u32>(4u))) - 32.0);
}

fn accumulate(rb: vec4<u32>, lid: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var u = lid; u < p.cols / 64u; u += WG) {
        let n = (u >> 1u) & 1u;
        let h = u & 1u;
        let e = 256u * (u >> 2u) + 128u * n + 16u * h;
        let b = rb + vec4<u32>((u >> 2u) * Q3_K_BYTES);
        let qo = Q3_K_QS + 32u * n + 16u * h;
        let ho = Q3_K_HMASK + 16u * h;
        let q0 = q3_words(b.x + qo);
        let q1 = q3_words(b.y + qo);
        let q2 = q3_words(b.z + qo);
        let q3 = q3_words(b.w + qo);
        let h0 = q3_words(b.x + ho);
        let h1 = q3_words(b.y + ho);
        let h2 = q3_words(b.z + ho);
        let h3 = q3_words(b.w + ho);
        // per row, per run j: sum q x; and per run: sum x
        var r0 = vec4<f32>(0.0);
        var r1 = vec4<f32>(0.0);
        var r2 = vec4<f32>(0.0);
        var r3 = vec4<f32>(0.0);
        var sx = vec4<f32>(0.0);
        for (var l = 0u; l < 4u; l++) {
            let x0 = in4(e + 4u * l);
            let x1 = in4(e + 32u + 4u * l);
            let x2 = in4(e + 64u + 4u * l);
            let x3 = in4(e + 96u + 4u * l);
            sx += vec4<f32>(dot(x0, vec4<f32>(1.0)), dot(x1, vec4<f32>(1.0)), dot(x2, vec4<f32>(1.0)), dot(x3, vec4<f32>(1.0)));
            r0 += q3_dots(q3_at(q0, l), q3_at(h0, l), n, x0, x1, x2, x3);
            r1 += q3_dots(q3_at(q1, l), q3_at(h1, l), n, x0, x1, x2, x3);
            r2 += q3_dots(q3_at(q2, l), q3_at(h2, l), n, x0, x1, x2, x3);
            r3 += q3_dots(q3_at(q3, l), q3_at(h3, l), n, x0, x1, x2, x3);
        }
        let c = 4.0 * sx;
        acc += vec4<f32>(dot(q3_scales(b.x, n, h), r0 - c), dot(q3_scales(b.y, n, h), r1 - c),
                         dot(q3_scales(b.z, n, h), r2 - c), dot(q3_scales(b.w, n, h), r3 - c));
    }
    return acc;
}
