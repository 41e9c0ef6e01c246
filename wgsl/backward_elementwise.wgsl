// Elementwise backward: the soft-cap's (the forward is elementwise.wgsl softcap_to, y = c * tanh(x / c), in place),
// and the attention output gate's (gate_back, at the end).
// The gradient is scaled in place; the saved forward value is read. The forward overwrites x with y, so the caller
// keeps whichever it has: a copy of x (softcap_back_x) or the capped values themselves (softcap_back_y).
// Bindings (both entries): 0 dy (storage, read_write: the gradient, becomes dx)  1 p (uniform Params)
//                          2 step (uniform Step)  3 s (storage, read: the saved x, or y)
// Math (lab/host/reference/grads.py softcap_grad is the float64 oracle): dx = dy * (1 - tanh(x / c)^2)
//   softcap_back_x: 1 - tanh(u)^2 = sech^2(u) = 4 e / (1 + e)^2, e = exp(-2|u|), u = x / c: no cancellation where
//                   tanh nears 1; past the forward's clamp (|u| >= 15, where tanh is 1 in f32) the derivative is 0
//   softcap_back_y: tanh(u) = y / c, 1 - tanh^2 = (1 - y/c)(1 + y/c): y carries the forward's rounding, so near
//                   saturation the factor is only good to ~1e-7 absolute (of dy); the x form has no such floor
// Params { n: u32, cap: f32, rows: u32, _p: u32 }: i < n * (rows == 0 ? n_tokens : rows), as softcap_to.
// Grid: 1-D over elements, folded into y past 65535 groups: element = gid.x + gid.y * (num_workgroups.x * {{WG}}).

//!include common.wgsl

struct Params { n: u32, cap: f32, rows: u32, _p: u32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> dy: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<uniform> step: Step;
@group(0) @binding(3) var<storage, read> s: array<f32>;

fn element(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {   // the element, or 0xffffffff past the op's rows
    let i = gid.x + gid.y * (nwg.x * WG);
    let rows = select(p.rows, step.n_tokens, p.rows == 0u);
    return select(0xffffffffu, i, i < p.n * rows);
}

@compute @workgroup_size(WG)
fn softcap_back_x(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(gid, nwg);
    if (i == 0xffffffffu) { return; }
    let u = abs(s[i] / p.cap);
    let e = exp(-2.0 * u);
    dy[i] = select(0.0, dy[i] * (4.0 * e / ((1.0 + e) * (1.0 + e))), u < 15.0);
}

@compute @workgroup_size(WG)
fn softcap_back_y(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(gid, nwg);
    if (i == 0xffffffffu) { return; }
    let th = s[i] / p.cap;
    dy[i] = dy[i] * ((1.0 - th) * (1.0 + th));
}

// qwen35's attention output gate (the forward is elementwise.wgsl gate_to: y = x * sigmoid(g), x the attention's
// output, g its slice of the fused projection row):
//   gate_back: 0 dy (storage, read_write: the gradient at y, becomes the gradient at x)  1 pg (uniform GateParams)
//              2 step (uniform Step)  3 s (storage, read: x, the attention's output before the gate)
//              4 gate (storage, read: rows of pg.stride, g at pg.offset)  5 dgate (storage, read_write: rows of
//              pg.stride, dg written at pg.offset)
//   dx = dy s(g);  dg = dy x s(g) s(-g), s = sigmoid (lab/host/reference/grads.py sigmoid_gate_grad), s(-g) with its
//   own exp, as silu_grad does, so it keeps its relative precision where s(g) rounds to 1.
// GateParams { n, stride, offset, _p: u32 }: i < n * n_tokens, row j = i / n, column c = i % n.
struct GateParams { n: u32, stride: u32, offset: u32, _p: u32 };

@group(0) @binding(1) var<uniform> pg: GateParams;
@group(0) @binding(4) var<storage, read> gate: array<f32>;
@group(0) @binding(5) var<storage, read_write> dgate: array<f32>;

@compute @workgroup_size(WG)
fn gate_back(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * (nwg.x * WG);
    if (i >= pg.n * step.n_tokens) { return; }
    let j = i / pg.n;
    let at = j * pg.stride + pg.offset + i % pg.n;
    let g = gate[at];
    let sp = 1.0 / (1.0 + exp(-g));
    let sm = 1.0 / (1.0 + exp(g));
    let d = dy[i];
    dgate[at] = d * s[i] * sp * sm;
    dy[i] = d * sp;
}
