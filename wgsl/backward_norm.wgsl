// RMSNorm backward (the forward is norm.wgsl): gradients of y = x * r * w, r = inverseSqrt(mean(x^2) + eps), over
// each group of `group` floats of each token's compact row of n = n_groups * group floats (group = n: whole rows).
// Two entries, each with its own layout at bindings 0..k-1 (variables of the two share binding numbers on purpose:
// WGSL only forbids two variables at one binding within the SAME entry point):
//   rms_norm_dx: 0 dx (read_write)  1 x (read)  2 dy (read)  3 w (read: group floats)  4 p (uniform Params)
//                5 step (uniform Step)  6 rs (read_write: r of each (token, group), t * n_groups floats)
//   rms_norm_dw: 0 dw (read_write: group floats)  1 x (read)  2 dy (read)  3 rs_in (read: rms_norm_dx's rs)
//                4 p (uniform Params)  5 step (uniform Step)
// Math (lab/host/reference/grads.py rms_norm_grad is the float64 oracle):
//   dx = r * dy * w - x * r^3 * mean(dy * w * x)     (the second term is r's own dependence on x)
//   dw[i] += sum over tokens j < t and groups g of dy * x * r     (accumulated: training sums a weight's gradient
//            over micro-batches; the caller clears dw at the start of a step)
// Params { group, n_groups: u32, eps: f32, acc: u32, stride, offset: u32, _p0, _p1 }: acc = 1 adds dx into the buffer
//   (a residual stream's gradient joins the branch's: training's block backward), 0 writes it; token j's row starts at
//   j * stride + offset in x, dy and dx alike (stride n_groups * group and offset 0: compact rows; the Q or K heads of
//   a fused [q | k | v] row: its width and their first column, for the per-head Q/K norms)
//   element i of group g of token j sits at j * stride + offset + g * group + i (floats) in x, dy and dx; its r at
//   j * n_groups + g in rs.
// Grid: rms_norm_dx (t, n_groups, 1), one workgroup of {{WG}} per (token, group), the two sums through wg_sum of
//   reduce.wgsl; rms_norm_dw (ceil(group / {{WG}}), 1, 1), one invocation per column, run after rms_norm_dx (the
//   next dispatch of the pass sees rs). Rows >= step.n_tokens are neither read nor written.
// Determinism of dw: WGSL has no float atomics, and tokens adding into shared columns in parallel would race, so each
//   invocation owns one column and adds the (token, group) terms in order j = 0, 1, ..., g = 0, 1, ...: the same bits
//   every run. Cost: `group` invocations, each reading 2 t n_groups floats plus t n_groups r values in sequence; on a
//   big GPU a few hundred to a few thousand invocations leave it mostly idle once t reaches the thousands (the
//   upgrade: partial sums over fixed chunks of tokens, then a fixed-order sum of the chunks). On lavapipe one
//   invocation's loop stops silently past 32,768 iterations (tests/kernels/test_loop_budget.py): t * n_groups stays
//   under that there.
{{SG_ENABLE}}

struct Params { group: u32, n_groups: u32, eps: f32, acc: u32, stride: u32, offset: u32, _p0: u32, _p1: u32 };

//!include common.wgsl
//!include reduce.wgsl

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> dx: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;
@group(0) @binding(6) var<storage, read_write> rs: array<f32>;
// rms_norm_dw's own
@group(0) @binding(0) var<storage, read_write> dw: array<f32>;
@group(0) @binding(3) var<storage, read> rs_in: array<f32>;

@compute @workgroup_size(WG)
fn rms_norm_dx(@builtin(local_invocation_index) li: u32,
{{SG}}               @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
               @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let row = wid.x;
    if (row >= step.n_tokens) { return; }
    let base = row * p.stride + p.offset + wid.y * p.group;
    var ss = 0.0;
    var dot = 0.0;
    for (var i = li; i < p.group; i += WG) {
        let v = x[base + i];
        ss += v * v;
        dot += dy[base + i] * w[i] * v;
    }
    let ms = wg_sum(ss, li) / f32(p.group);
    let md = wg_sum(dot, li) / f32(p.group);
    let r = inverseSqrt(ms + p.eps);
    let c = md * r * r * r;
    for (var i = li; i < p.group; i += WG) {
        let g = r * dy[base + i] * w[i] - c * x[base + i];
        dx[base + i] = select(g, dx[base + i] + g, p.acc != 0u);
    }
    if (li == 0u) { rs[row * p.n_groups + wid.y] = r; }
}

@compute @workgroup_size(WG)
fn rms_norm_dw(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    if (col >= p.group) { return; }
    var s = 0.0;
    for (var j = 0u; j < step.n_tokens; j++) {
        for (var g = 0u; g < p.n_groups; g++) {
            let k = j * p.n_groups + g;
            let at = j * p.stride + p.offset + g * p.group + col;
            s += dy[at] * x[at] * rs_in[k];
        }
    }
    dw[col] += s;
}
