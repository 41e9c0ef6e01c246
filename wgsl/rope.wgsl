// Rotary position embedding, in place, on heads inside token rows (Q, K, or both of a fused QKV row).
// Bindings: 0 x (storage, read_write)  1 freqs (storage, read: n_rot/2 floats)  2 p (uniform Params)  3 step (uniform Step)
// Math: for pair i < n_rot/2 of head h of token j:  theta = (step.pos + j) * freqs[i]  (freqs[i] = freq_scale *
//       base^(-2i/n_rot) / factor_i, computed by Python in f64),  (x0, x1) <- (x0 cos - x1 sin, x0 sin + x1 cos);
//       dims n_rot..head_dim-1 pass through untouched.
//   rope_adjacent: pair (2i, 2i+1)       (llama-family GGUF, llama.cpp rope mode 0)
//   rope_neox:     pair (i, i + n_rot/2) (Qwen, Gemma: llama.cpp mode 2)
// Params { n_head, head_dim, half (= n_rot/2), row_stride, col_offset, _p0, _p1, _p2: u32 }
//   head h of token j starts at float  j*row_stride + col_offset + h*head_dim.
// Grid: (ceil(n_head*half / {{WG}}), t, 1), one invocation per (token, head, pair).

//!include common.wgsl

struct Params { n_head: u32, head_dim: u32, half: u32, row_stride: u32,
                col_offset: u32, _p0: u32, _p1: u32, _p2: u32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> freqs: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

// Indices (within the head) of the two elements pair i rotates.
fn pair_adjacent(i: u32) -> vec2<u32> { return vec2<u32>(2u * i, 2u * i + 1u); }
fn pair_neox(i: u32) -> vec2<u32> { return vec2<u32>(i, i + p.half); }

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

fn rotate(gid: vec3<u32>, neox: bool) {
    let row = gid.y;
    let q = gid.x;
    if (row >= step.n_tokens || q >= p.n_head * p.half) { return; }
    let h = q / p.half;
    let i = q % p.half;
    var ab: vec2<u32>;
    if (neox) { ab = pair_neox(i); } else { ab = pair_adjacent(i); }
    let base = row * p.row_stride + p.col_offset + h * p.head_dim;
    let cs = cos_sin(f32(step.pos + row) * freqs[i]);
    let x0 = x[base + ab.x];
    let x1 = x[base + ab.y];
    x[base + ab.x] = x0 * cs.x - x1 * cs.y;
    x[base + ab.y] = x0 * cs.y + x1 * cs.x;
}

@compute @workgroup_size(WG)
fn rope_adjacent(@builtin(global_invocation_id) gid: vec3<u32>) { rotate(gid, false); }

@compute @workgroup_size(WG)
fn rope_neox(@builtin(global_invocation_id) gid: vec3<u32>) { rotate(gid, true); }
