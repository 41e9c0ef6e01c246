// matvec.wgsl's loop for Q2_K (pasted there: reads its W, x, p, WG). Blocks of 84 bytes are 4-byte aligned but not 8
// (no wider view of W lines up), so every field is one word of W. One step is a 64-value unit u: half n = (u / 2) % 2
// of block u / 4, l = 16 (u % 2)..+15 of its four runs j = 0..3 (quant.wgsl's layout: byte qs[32n + l] holds value
// 128n + 32j + l in bits 2j, 2j + 1). Its 16 qs bytes are four consecutive words, neighbouring threads' runs are
// neighbouring 16 bytes; the four sub-blocks' scale bytes (s = 8n + 2j + u % 2) sit in two words, read once per 64
// values (the group loop read them per 8, at 0.38-0.62 TB/s on the H200), and the mins need only each run's input sum,
// the same for the 4 rows: sum_e (d sc q_e - dmin m) x_e = d sc sum(q x) - dmin m sum(x). Units per row: cols / 64.

// Four values of each run j = 0..3 from qs word q (bits 2j, 2j + 1 of each byte), dotted with run j's inputs x0..x3.
fn q2_dots(q: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> vec4<f32> {
    let b = vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u);
    let m = vec4<u32>(3u);
    return vec4<f32>(dot(vec4<f32>(b & m), x0), dot(vec4<f32>((b >> vec4<u32>(2u)) & m), x1),
                     dot(vec4<f32>((b >> vec4<u32>(4u)) & m), x2), dot(vec4<f32>((b >> vec4<u32>(6u)) & m), x3));
}

// A row's unit total from its runs' sums r (of q x) and the runs' input sums sx: the block at word w, half n, h = u % 2.
// Run j's scale byte is byte h (j even) or h + 2 (j odd) of scale word 2n + j / 2: low nibble sc, high nibble m.
fn q2_row(w: u32, n: u32, h: u32, r: vec4<f32>, sx: vec4<f32>) -> f32 {
    let sw = w + Q2_K_SCALES / 4u + 2u * n;
    let a = W[sw];
    let b = W[sw + 1u];
    let s = (vec4<u32>(a, a, b, b) >> vec4<u32>(8u * h, 8u * h + 16u, 8u * h, 8u * h + 16u)) & vec4<u32>(0xFFu);
    let dm = unpack2x16float(W[w + Q2_K_DM / 4u]);
    return dm.x * dot(vec4<f32>(s & vec4<u32>(15u)), r) - dm.y * dot(vec4<f32>(s >> vec4<u32>(4u)), sx);
}

fn accumulate(rb: vec4<u32>, lid: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var u = lid; u < p.cols / 64u; u += WG) {
        let n = (u >> 1u) & 1u;
        let h = u & 1u;
        let e = 256u * (u >> 2u) + 128u * n + 16u * h;
        let w = (rb + vec4<u32>((u >> 2u) * Q2_K_BYTES)) >> vec4<u32>(2u);
        let q = w + vec4<u32>(Q2_K_QS / 4u + 8u * n + 4u * h);
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
            r0 += q2_dots(W[q.x + l], x0, x1, x2, x3);
            r1 += q2_dots(W[q.y + l], x0, x1, x2, x3);
            r2 += q2_dots(W[q.z + l], x0, x1, x2, x3);
            r3 += q2_dots(W[q.w + l], x0, x1, x2, x3);
        }
        acc += vec4<f32>(q2_row(w.x, n, h, r0, sx), q2_row(w.y, n, h, r1, sx), q2_row(w.z, n, h, r2, sx),
                         q2_row(w.w, n, h, r3, sx));
    }
    return acc;
}
