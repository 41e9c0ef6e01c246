// Elementwise ops over f32 vectors (and a u32 wipe). Four binding layouts; each entry uses exactly one,
// so its auto layout is bindings 0..k-1 (variables of different entries share binding numbers on purpose:
// WGSL only forbids two variables at one (group, binding) within the SAME entry point).
//
// Callers: bias_to, last_row_to, softcap_to, gate_to and copy_to are the engine's (lab.ops.elementwise), scale_add is lab.instruments.selftest's;
// add_rows, mul_rows, add_to, mul_to, scale_to and fill_zero are built only by tests/kernels/elementwise_ops.py.
//
// Layout A, fixed n (lab.instruments.selftest relies on scale_add with exactly these bindings):
//   0 a (storage, read)   1 b (storage, read)   2 out (storage, read_write)   3 p (uniform Params)
//   scale_add:  out[i] = a[i] + p.scale * b[i]  i < p.n
// Layout B, per step (p.n = features per token, i < p.n * step.n_tokens):
//   0 a (read)   1 b (read)   2 out (read_write)   3 p (uniform Params)   4 step (uniform Step)
//   add_rows:   out[i] = a[i] + b[i]
//   mul_rows:   out[i] = a[i] * b[i]
// Layout C, in place, per step (i < p.n * step.n_tokens):
//   0 x (read_write)   1 p (uniform Params)   2 step (uniform Step)   3 r (read; not used by scale_to or softcap_to)
//   add_to:     x[i] = x[i] + r[i]      (residual add)
//   mul_to:     x[i] = x[i] * r[i]
//   scale_to:   x[i] = x[i] * p.scale
//   bias_to:    x[j*p._p0 + p._p1 + c] += r[c]       c < p.n, j < n_tokens (bias into a slice of a fused row)
//   last_row_to: x[c] = r[(n_tokens-1)*p.n + c]      c < p.n (the last token's row, for the output head)
//   softcap_to: x[i] = p.scale * tanh(x[i] / p.scale)   i < p.n * (p._p0 == 0 ? n_tokens : p._p0)
//               (gemma2's final logit soft-capping; tanh's argument clamped as in attention.wgsl's)
//   copy_to:    x[p._p0 + i] = r[p._p1 + i]      i < p.n * n_tokens (training saves each layer's input rows and
//               puts them back to recompute the layer: lab.engine.backward)
//   gate_to:    x[j*p.n + c] *= sigmoid(r[j*p._p0 + p._p1 + c])   c < p.n, j < n_tokens
//               (qwen35's attention output gate, read from its slice of the fused projection row)
// Layout D, wipe:  0 words (array<u32>, read_write)   1 p (uniform Params)
//   fill_zero:  words[i] = 0u            i < p.n
// Uniform Params { n: u32, scale: f32, _p0: u32, _p1: u32 } (16 bytes).
// Grid: 1-D over elements, folded into y past 65535 groups: element = gid.x + gid.y * (num_workgroups.x * WG).
// Workgroup size {{WG}} is owned by Python (lab.ops.elementwise), which sizes the grid to match.

//!include common.wgsl

struct Params { n: u32, scale: f32, _p0: u32, _p1: u32 };

const WG: u32 = {{WG}}u;

// Layout A and B
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;
// Layout C
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<uniform> pc: Params;
@group(0) @binding(2) var<uniform> step_c: Step;
@group(0) @binding(3) var<storage, read> r: array<f32>;
// Layout D
@group(0) @binding(0) var<storage, read_write> words: array<u32>;

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * (nwg.x * WG);
}

@compute @workgroup_size(WG)
fn scale_add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < p.n) { out[i] = a[i] + p.scale * b[i]; }
}

@compute @workgroup_size(WG)
fn add_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p.n * step.n_tokens) { out[i] = a[i] + b[i]; }
}

@compute @workgroup_size(WG)
fn mul_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < p.n * step.n_tokens) { out[i] = a[i] * b[i]; }
}

@compute @workgroup_size(WG)
fn add_to(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < pc.n * step_c.n_tokens) { x[i] = x[i] + r[i]; }
}

@compute @workgroup_size(WG)
fn mul_to(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < pc.n * step_c.n_tokens) { x[i] = x[i] * r[i]; }
}

@compute @workgroup_size(WG)
fn scale_to(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < pc.n * step_c.n_tokens) { x[i] = x[i] * pc.scale; }
}

@compute @workgroup_size(WG)
fn bias_to(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < pc.n * step_c.n_tokens) {
        let j = i / pc.n;
        let c = i % pc.n;
        let at = j * pc._p0 + pc._p1 + c;
        x[at] = x[at] + r[c];
    }
}

@compute @workgroup_size(WG)
fn last_row_to(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c = flat(gid, nwg);
    if (c < pc.n && step_c.n_tokens > 0u) { x[c] = r[(step_c.n_tokens - 1u) * pc.n + c]; }
}

@compute @workgroup_size(WG)
fn softcap_to(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    let rows = select(pc._p0, step_c.n_tokens, pc._p0 == 0u);
    if (i < pc.n * rows) { x[i] = pc.scale * tanh(clamp(x[i] / pc.scale, -15.0, 15.0)); }
}

@compute @workgroup_size(WG)
fn copy_to(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < pc.n * step_c.n_tokens) { x[pc._p0 + i] = r[pc._p1 + i]; }
}

@compute @workgroup_size(WG)
fn gate_to(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < pc.n * step_c.n_tokens) {
        let j = i / pc.n;
        let c = i % pc.n;
        // ggml's op_sigmoid: 1 / (1 + exp(-g)); exp overflowing to +inf gives 0, as in float32 on the CPU
        x[i] = x[i] * (1.0 / (1.0 + exp(-r[j * pc._p0 + pc._p1 + c])));
    }
}

@compute @workgroup_size(WG)
fn fill_zero(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i < pc.n) { words[i] = 0u; }
}
