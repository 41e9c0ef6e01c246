// matvec.wgsl's loop for any type (pasted there: reads its W, x, p, WG, HALF): one group of 8 values a step,
// dequantized by {{DQ}} (quant.wgsl). Returns this invocation's share of the 4 rows' sums.
fn accumulate(rb: vec4<u32>, lid: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var g = lid; g < p.gpr; g += WG) {
        let e = group_base(g, HALF);
        let xl = in4(e);
        let xh = in4(e + HALF);
        let v0 = {{DQ}}(rb.x, g);
        let v1 = {{DQ}}(rb.y, g);
        let v2 = {{DQ}}(rb.z, g);
        let v3 = {{DQ}}(rb.w, g);
        acc += vec4<f32>(dot(v0.lo, xl) + dot(v0.hi, xh), dot(v1.lo, xl) + dot(v1.hi, xh),
                         dot(v2.lo, xl) + dot(v2.hi, xh), dot(v3.lo, xl) + dot(v3.hi, xh));
    }
    return acc;
}
