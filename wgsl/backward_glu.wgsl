// Gated linear units backward (the forward is glu.wgsl): gradients of h = act(gate) * up over the fused rows
// [gate (n) | up (n)] the forward read (the gate and up projections' one matvec writes them), written in that layout.
// Bindings: 0 gu (storage, read: [t, 2n], the forward's input)  1 dh (storage, read: [t, n])
//           2 dgu (storage, read_write: [t, 2n])  3 p (uniform Params)  4 step (uniform Step)
// Math (lab/host/reference/grads.py glu_grad is the float64 oracle):
//   d up   = dh * act(gate)                     act(gate) from act.wgsl: the forward's very f32 value
//   d gate = dh * up * act'(gate)
//   swiglu: silu'(g)      = s(g) * (1 + g * s(-g)),  s = sigmoid; s(-g) = 1 - s(g) computed with its own exp, so
//                           it keeps its relative precision where s(g) rounds to 1 (g > 17)
//   geglu:  gelu_tanh'(g) = 0.5 (1 + tanh z) + 0.5 g sech^2(z) dz/dg,  z = sqrt(2/pi) (g + 0.044715 g^3),
//                           dz/dg = sqrt(2/pi) (1 + 3 * 0.044715 g^2); act.wgsl clamps z to +-10, so where it does,
//                           the clamped forward's derivative has no second term (and sech^2(10) ~ 8e-9 anyway)
// Params { n, _p0, _p1, _p2: u32 }. Feature c of token j: gate at j*2n + c, up at j*2n + n + c, dh at j*n + c.
// Grid: (ceil(n / {{WG}}), t, 1); rows >= step.n_tokens untouched.

//!include common.wgsl

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read> gu: array<f32>;
@group(0) @binding(1) var<storage, read> dh: array<f32>;
@group(0) @binding(2) var<storage, read_write> dgu: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

//!include act.wgsl

fn gelu_tanh_grad(g: f32) -> f32 {
    let z0 = 0.7978845608028654 * (g + 0.044715 * g * g * g);
    let z = clamp(z0, -10.0, 10.0);
    let th = tanh(z);
    // sech^2 z = 4 e / (1 + e)^2, e = exp(-2|z|) in (2e-9, 1]: no cancellation, where 1 - th^2 would lose it all
    let e = exp(-2.0 * abs(z));
    let sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e));
    let dz = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g);
    // outside the clamp g^3 or g^2 may overflow (0 * inf): select the clamped forward's own derivative there
    return 0.5 * (1.0 + th) + select(0.0, 0.5 * g * sech2 * dz, abs(z0) < 10.0);
}

fn at(gid: vec3<u32>) -> vec2<u32> {   // (gate index, dh index); x = 0xffffffff when outside
    let c = gid.x;
    let row = gid.y;
    if (c >= p.n || row >= step.n_tokens) { return vec2<u32>(0xffffffffu); }
    return vec2<u32>(row * 2u * p.n + c, row * p.n + c);
}

@compute @workgroup_size(WG)
fn swiglu_back(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = at(gid);
    if (i.x == 0xffffffffu) { return; }
    let g = gu[i.x];
    let u = gu[i.x + p.n];
    let d = dh[i.y];
    dgu[i.x] = d * u * silu_grad(g);
    dgu[i.x + p.n] = d * silu(g);
}

@compute @workgroup_size(WG)
fn geglu_back(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = at(gid);
    if (i.x == 0xffffffffu) { return; }
    let g = gu[i.x];
    let u = gu[i.x + p.n];
    let d = dh[i.y];
    dgu[i.x] = d * u * gelu_tanh_grad(g);
    dgu[i.x + p.n] = d * gelu_tanh(g);
}
