// cos and sin of a RoPE angle (included by rope.wgsl and by matvec.wgsl's rotary epilogue; no entry points, no
// bindings, no constants).

// cos and sin of theta, accurate to ~1e-7 on any driver: WGSL only promises 2^-11 for sin/cos (SwiftShader
// is off by up to 2e-4 on [-pi, pi]), so they are computed here. theta is reduced to r in [-pi/4, pi/4]
// around a multiple k of pi/2 (Cody-Waite: pi/2 = C1 + C2 with C1 = 201/128, so k * C1 is exact for
// k < 2^16, i.e. theta up to ~100k), then short Taylor series (truncation < 3e-8 at |r| = pi/4) and the
// quadrant k mod 4 picks signs and order.
fn cos_sin(theta: f32) -> vec2<f32> {
    let k = round(theta * 0.6366197723675814);
    let r = (theta - k * 1.5703125) - k * 4.838267948966e-4;
    let r2 = r * r;
    let s = r + r * r2 * (-0.16666666666666666 + r2 * (0.008333333333333333 + r2 * (-0.0001984126984126984
            + r2 * 2.755731922398589e-6)));
    let c = 1.0 + r2 * (-0.5 + r2 * (0.041666666666666664 + r2 * (-0.001388888888888889
            + r2 * 2.48015873015873e-5)));
    switch (i32(k) & 3) {
        case 0: { return vec2<f32>(c, s); }
        case 1: { return vec2<f32>(-s, c); }
        case 2: { return vec2<f32>(-c, -s); }
        default: { return vec2<f32>(s, -c); }
    }
}
