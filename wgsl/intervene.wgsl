// An intervention on one activation of the forward pass (lab/instruments/interventions.py), run right after the op
// that completes it: a block of columns [c0, c1) of the step's rows at positions [r0, r1) is zeroed, set from a vector,
// added a vector to, or scaled.
// Bindings: 0 x (read_write, f32 [t, stride]: the activation, e.g. kqv_out's [t, n_head * head_dim])
//           1 vec (read, f32: the values, vec[p.vec + (c - c0)] for column c)   2 step (uniform Step)
//           3 p (uniform Params)
// Math, for row j (position q = step.pos + j, r0 <= q < r1) and column c0 <= c < c1, i = j * stride + c:
//   op 0 zero: x[i] = 0     op 1 set: x[i] = vec[..]     op 2 add: x[i] += vec[..]     op 3 scale: x[i] *= p.scale
//   op 4 load: x[i] = vals[p.vec + q * (c1 - c0) + (c - c0)], a row per position from a table (a sweep that resumes
//   a run after layer L loads the corrupted run's residual there: lab/instruments/experiments.py)
// Params { stride, c0, c1, r0, r1, op, vec, scale (f32 bits) }: a CONVERSATION uniform (it holds positions), one per
//   intervention slot, rewritten before each run.
// Grid: 1-D over t * stride elements (folded into y past 65535 groups); threads outside the block return.

//!include common.wgsl

struct Params { stride: u32, c0: u32, c1: u32, r0: u32, r1: u32, op: u32, vec: u32, scale: f32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> vals: array<f32>;
@group(0) @binding(2) var<uniform> step: Step;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn intervene(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    let j = i / p.stride;
    let c = i % p.stride;
    let q = step.pos + j;
    if (j >= step.n_tokens || c < p.c0 || c >= p.c1 || q < p.r0 || q >= p.r1) { return; }
    let v = vals[p.vec + c - p.c0];
    switch p.op {
        case 0u: { x[i] = 0.0; }
        case 1u: { x[i] = v; }
        case 2u: { x[i] = x[i] + v; }
        case 4u: { x[i] = vals[p.vec + q * (p.c1 - p.c0) + c - p.c0]; }
        default: { x[i] = x[i] * p.scale; }
    }
}
