// Softmax over rows of n floats, max-subtracted (safe for logits of any finite size).
// Bindings: 0 y (storage, read_write)  1 p (uniform Params)  2 step (uniform Step)
//           3 x (storage, read; out-of-place only: {{SRC}} = x, in place {{SRC}} = y and {{INPLACE}} = true)
// Math: y = exp(s*x - max(s*x)) / sum(exp(s*x - max(s*x)))   (s = p.scale, e.g. 1/temperature)
// Params { n: u32, rows: u32, mode: u32, scale: f32 }
//   mode 0: rows p.rows (fixed); 1: min(step.n_tokens, p.rows) rows; 2: one row, the step's last token
//   (row n_tokens-1). Row r reads row r (mode 2: n_tokens-1) and writes out row r (in place: the row read).
// Grid: (rows, 1, 1), one workgroup of {{WG}} per row.
// Reduction: subgroupMax/Add then one partial per subgroup ({{SG}} lines), or shared-memory trees ({{NOSG}} lines).
{{SG_ENABLE}}

struct Params { n: u32, rows: u32, mode: u32, scale: f32 };
struct Step { pos: u32, n_tokens: u32, n_ctx: u32, _pad: u32 };

const WG: u32 = {{WG}}u;
const INPLACE: bool = {{INPLACE}};

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<uniform> step: Step;
@group(0) @binding(3) var<storage, read> x: array<f32>;

var<workgroup> red: array<f32, WG>;
var<private> sg_lane: u32;
var<private> sg_size: u32;

fn wg_max(v: f32, li: u32) -> f32 {
{{SG}}    let s = subgroupMax(v);
{{SG}}    if (sg_lane == 0u) { red[li / sg_size] = s; }
{{SG}}    workgroupBarrier();
{{SG}}    var m = red[0];
{{SG}}    for (var j = 1u; j < (WG + sg_size - 1u) / sg_size; j++) { m = max(m, red[j]); }
{{NOSG}}    red[li] = v;
{{NOSG}}    workgroupBarrier();
{{NOSG}}    for (var s = WG / 2u; s > 0u; s >>= 1u) {
{{NOSG}}        if (li < s) { red[li] = max(red[li], red[li + s]); }
{{NOSG}}        workgroupBarrier();
{{NOSG}}    }
{{NOSG}}    let m = red[0];
    workgroupBarrier();
    return m;
}

fn wg_sum(v: f32, li: u32) -> f32 {
{{SG}}    let s = subgroupAdd(v);
{{SG}}    if (sg_lane == 0u) { red[li / sg_size] = s; }
{{SG}}    workgroupBarrier();
{{SG}}    var total = 0.0;
{{SG}}    for (var j = 0u; j < (WG + sg_size - 1u) / sg_size; j++) { total += red[j]; }
{{NOSG}}    red[li] = v;
{{NOSG}}    workgroupBarrier();
{{NOSG}}    for (var s = WG / 2u; s > 0u; s >>= 1u) {
{{NOSG}}        if (li < s) { red[li] += red[li + s]; }
{{NOSG}}        workgroupBarrier();
{{NOSG}}    }
{{NOSG}}    let total = red[0];
    workgroupBarrier();
    return total;
}

fn n_rows() -> u32 {
    if (p.mode == 1u) { return min(step.n_tokens, p.rows); }
    if (p.mode == 2u) { return min(step.n_tokens, 1u); }
    return p.rows;
}

@compute @workgroup_size(WG)
fn softmax(@builtin(local_invocation_index) li: u32,
{{SG}}           @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
           @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let r = wid.x;
    if (r >= n_rows()) { return; }
    var in_row = r;
    if (p.mode == 2u) { in_row = step.n_tokens - 1u; }
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
