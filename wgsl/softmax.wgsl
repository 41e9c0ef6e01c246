// Softmax over rows of n floats, max-subtracted (safe for logits of any finite size).
// Bindings: 0 y (storage, read_write)  1 p (uniform Params)  2 step (uniform Step)
//           3 x (storage, read; out-of-place only: {{SRC}} = x, in place {{SRC}} = y and {{INPLACE}} = true)
// Math: y = exp(s*x - max(s*x)) / sum(exp(s*x - max(s*x)))   (s = p.scale, e.g. 1/temperature)
// Params { n: u32, rows: u32, mode: u32, scale: f32 }
//   rows / mode: the row selection of rows.wgsl (ROWS_FIXED, ROWS_TOKENS, ROWS_LAST). Row r reads
//   row_read(r) (r itself, or n_tokens-1 for ROWS_LAST) and writes out row r (in place: the row read).
// Grid: (rows, 1, 1), one workgroup of {{WG}} per row.
// Reduction: wg_max and wg_sum of reduce.wgsl (subgroups, or shared-memory trees without them).
{{SG_ENABLE}}

struct Params { n: u32, rows: u32, mode: u32, scale: f32 };

//!include common.wgsl
//!include reduce.wgsl
//!include rows.wgsl

const WG: u32 = {{WG}}u;
const INPLACE: bool = {{INPLACE}};

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<uniform> step: Step;
@group(0) @binding(3) var<storage, read> x: array<f32>;

@compute @workgroup_size(WG)
fn softmax(@builtin(local_invocation_index) li: u32,
{{SG}}           @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
           @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let r = wid.x;
    if (r >= rows_in_step(p.mode, p.rows, step.n_tokens)) { return; }
    let in_row = row_read(p.mode, r, step.n_tokens);
    let src = in_row * p.n;
    let dst = select(r, in_row, INPLACE) * p.n;
    var lm = -3.4028234663852886e38;
    for (var i = li; i < p.n; i += WG) { lm = max(lm, p.scale * {{SRC}}[src + i]); }
    let mx = wg_max(lm, li);
    var ls = 0.0;
    for (var i = li; i < p.n; i += WG) { ls += exp(p.scale * {{SRC}}[src + i] - mx); }
    let inv = 1.0 / wg_sum(ls, li);
    for (var i = li; i < p.n; i += WG) { y[dst + i] = exp(p.scale * {{SRC}}[src + i] - mx) * inv; }
}
