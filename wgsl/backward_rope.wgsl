// RoPE backward (the forward is rope.wgsl): the gradient rows of rotated heads, rotated back in place.
// Bindings: 0 g (storage, read_write: the gradient of the rotated heads, becomes the gradient of their input)
//           1 freqs (storage, read: n_rot/2 floats, the forward's table: lab.ops.rope.frequencies)
//           2 p (uniform Params)  3 step (uniform Step)
// Math (lab/host/reference/grads_attention.py rope_grad is the float64 oracle): the forward rotates each pair by
//   theta = (step.pos + j) * freqs[i], y0 = x0 cos - x1 sin, y1 = x0 sin + x1 cos: a linear map whose transpose is the
//   rotation by -theta, so  g0 <- g0 cos + g1 sin,  g1 <- g1 cos - g0 sin.  theta is the forward's own f32 product
//   and cos_sin the forward's (rotary.wgsl), so the backward is the transpose of the rotation the forward applied,
//   to rounding. Dims n_rot..head_dim-1 were copied by the forward: their gradient passes through untouched.
//   rope_back_adjacent: pair (2i, 2i+1) (llama.cpp mode 0, "norm");  rope_back_neox: pair (i, i + n_rot/2) (mode 2)
// Params { n_head, head_dim, half (= n_rot/2), row_stride, col_offset, _p0, _p1, _p2: u32 }
//   head h of token j starts at float  j*row_stride + col_offset + h*head_dim  (a fused [dq | dk | dv] gradient row:
//   the Q and K heads rotated back by one op, the V heads untouched, as the forward's fused row).
// Grid: (ceil(n_head*half / {{WG}}), t, 1), one invocation per (token, head, pair); no loops. No cache writes: the
//   forward's K cache holds rotated keys, and their gradient is the rotated dK this kernel turns back.

//!include common.wgsl
//!include rotary.wgsl

struct Params { n_head: u32, head_dim: u32, half: u32, row_stride: u32,
                col_offset: u32, _p0: u32, _p1: u32, _p2: u32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> g: array<f32>;
@group(0) @binding(1) var<storage, read> freqs: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

// Indices (within the head) of the two elements pair i rotates: the forward's pairings.
fn pair_adjacent(i: u32) -> vec2<u32> { return vec2<u32>(2u * i, 2u * i + 1u); }
fn pair_neox(i: u32) -> vec2<u32> { return vec2<u32>(i, i + p.half); }

fn rotate_back(gid: vec3<u32>, neox: bool) {
    let row = gid.y;
    let q = gid.x;
    if (row >= step.n_tokens || q >= p.n_head * p.half) { return; }
    let base = row * p.row_stride + p.col_offset + (q / p.half) * p.head_dim;
    let i = q % p.half;
    var ab: vec2<u32>;
    if (neox) { ab = pair_neox(i); } else { ab = pair_adjacent(i); }
    let cs = cos_sin(f32(step.pos + row) * freqs[i]);     // the forward's theta, bit for bit
    let g0 = g[base + ab.x];
    let g1 = g[base + ab.y];
    g[base + ab.x] = g0 * cs.x + g1 * cs.y;
    g[base + ab.y] = g1 * cs.x - g0 * cs.y;
}

@compute @workgroup_size(WG)
fn rope_back_adjacent(@builtin(global_invocation_id) gid: vec3<u32>) { rotate_back(gid, false); }

@compute @workgroup_size(WG)
fn rope_back_neox(@builtin(global_invocation_id) gid: vec3<u32>) { rotate_back(gid, true); }
