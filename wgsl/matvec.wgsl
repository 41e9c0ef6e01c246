// Matrix-vector product for one token (decode), dequantizing the weights in place, with optional
// fused input prologues and a bias epilogue (each saves a dispatch and a trip through memory).
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks)
//           1 x (storage, read: array<f32>, the input at x_off)
//           2 y (storage, read_write: array<f32>, the output at y_off)
//           3 p (uniform Params)
//           NORM only: {{B_NW}} nw (norm weight, cols floats), {{B_XN}} xn (read_write: the normed input)
//           BIAS only: {{B_BIAS}} bias (f32, indexed by output row + bias_off)
// Math: y[y_off + r] = (acc ? y[y_off + r] : 0) + sum_c W[r, c] * in(c) (+ bias[bias_off + r]),  r < n_rows,
//   where in(c) is, by prologue ({{IN}}):
//     in_plain: x[x_off + c]
//     in_norm:  x[x_off + c] * rsqrt(mean(x^2) + eps) * nw[c]     (RMSNorm. The scale is common to the whole
//               row, so the loop sums W * x * nw and, from the same x values (the workgroup reads each
//               once), x^2; one reduction gives both, then the sums are scaled: no pass before the loop.
//               Workgroup 0 also stores the normed vector at xn[xn_off..] when write_xn, so traces and
//               probes still see it)
//     in_glu:   {{ACT}}(x[x_off + c]) * x[x_off + up_off + c]      (SwiGLU / GeGLU over a [gate | up] row)
// Uniform fields: n_rows (rows of this part), cols, gpr (groups of 8 values per row = cols / 8),
//   row_bytes, x_off, y_off (floats; y_off already includes the part's first row), acc (0 or 1),
//   write_xn, eps, xn_off, bias_off (already includes the part's first row), up_off.
// Organisation: one workgroup of WG threads per 4 rows (vec4 accumulator, one lane per row); every
//   thread walks the groups g = lid, lid + WG, ... of all 4 rows, so each input value is made once for
//   4 rows and neighbouring threads read neighbouring u32 words of the blocks. Sums are reduced over
//   the workgroup: with subgroups, subgroupAdd then one slot per subgroup in shared memory (subgroups
//   assumed to be consecutive ranges of local_invocation_index); without, a shared tree.
// Constants: WG (threads, power of two), DQ (dequant function, e.g. dq_q4_0), HALF (its group shape),
//   IN (in_plain | in_norm | in_glu), ACT (silu | gelu_tanh), NORM / BIAS: "" or "// " (bindings and
//   code of that option), SG / NOSG: "" or "// " so that only the chosen reduction is compiled (a device
//   without the subgroups feature rejects any subgroup builtin even in dead code); SG_ENABLE:
//   "enable subgroups;" where the WGSL compiler wants it (browser), "" for naga, which refuses it.
// Grid: groups_1d(ceil(n_rows / 4)): workgroup index = wid.x + wid.y * num_workgroups.x.
{{SG_ENABLE}}

struct Params { n_rows: u32, cols: u32, gpr: u32, row_bytes: u32, x_off: u32, y_off: u32, acc: u32,
                write_xn: u32, eps: f32, xn_off: u32, bias_off: u32, up_off: u32 };

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
{{NORM}}@group(0) @binding({{B_NW}}) var<storage, read> nw: array<f32>;
{{NORM}}@group(0) @binding({{B_XN}}) var<storage, read_write> xn: array<f32>;
{{BIAS}}@group(0) @binding({{B_BIAS}}) var<storage, read> bias: array<f32>;

//!include quant.wgsl
//!include act.wgsl

const WG: u32 = {{WG}}u;
const HALF: u32 = {{HALF}}u;

// Reduction slots: WG for the shared tree; with subgroups one per subgroup, at most WG / 4 (WebGPU's smallest
// subgroup is 4). Smaller matters on CPU adapters in Chromium: Dawn zero-fills workgroup memory for every
// workgroup, and the output head alone is thousands of workgroups.
const RED: u32 = {{RED}}u;
var<workgroup> red: array<vec4<f32>, RED>;
var<workgroup> red_ss: array<f32, RED>;
var<private> sg_lane: u32;
var<private> sg_size: u32;
var<private> ss: f32;        // in_norm: this invocation's share of sum(x^2)

// Sums of v (and of ss) over the workgroup, returned to every invocation. Called in uniform control flow.
fn wg_sum(v: vec4<f32>, lid: u32) -> vec4<f32> {
{{SG}}    let s = subgroupAdd(v);
{{SG}}{{NORM}}    let s2 = subgroupAdd(ss);
{{SG}}    if (sg_lane == 0u) { red[lid / sg_size] = s; }
{{SG}}{{NORM}}    if (sg_lane == 0u) { red_ss[lid / sg_size] = s2; }
{{SG}}    workgroupBarrier();
{{SG}}    var total = vec4<f32>(0.0);
{{SG}}    var t2 = 0.0;
{{SG}}    for (var i = 0u; i < max(WG / sg_size, 1u); i++) { total += red[i]; t2 += red_ss[i]; }
{{NOSG}}    red[lid] = v;
{{NOSG}}    red_ss[lid] = ss;
{{NOSG}}    workgroupBarrier();
{{NOSG}}    for (var k = WG / 2u; k > 0u; k >>= 1u) {
{{NOSG}}        if (lid < k) { red[lid] += red[lid + k]; red_ss[lid] += red_ss[lid + k]; }
{{NOSG}}        workgroupBarrier();
{{NOSG}}    }
{{NOSG}}    let total = red[0];
{{NOSG}}    let t2 = red_ss[0];
    ss = t2;
    return total;
}

fn in_plain(c: u32) -> f32 { return x[p.x_off + c]; }
{{NORM}}fn in_norm(c: u32) -> f32 { let v = x[p.x_off + c]; ss += v * v; return v * nw[c]; }
fn in_glu(c: u32) -> f32 { return {{ACT}}(x[p.x_off + c]) * x[p.x_off + p.up_off + c]; }

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>
{{SG}}        , @builtin(subgroup_size) sgs: u32, @builtin(subgroup_invocation_id) sgl: u32
        ) {
{{SG}}    sg_lane = sgl; sg_size = sgs;
    let wg_index = wid.x + wid.y * nwg.x;
    let row0 = wg_index * 4u;
    if (row0 >= p.n_rows) { return; }

    // Rows past the end repeat the last row (valid memory, no branch); their sums are not written.
    let last = p.n_rows - 1u;
    let rb = vec4<u32>(min(row0, last), min(row0 + 1u, last), min(row0 + 2u, last), min(row0 + 3u, last)) * p.row_bytes;

    var acc = vec4<f32>(0.0);
    for (var g = lid; g < p.gpr; g += WG) {
        let e = group_base(g, HALF);
        let xl = vec4<f32>({{IN}}(e), {{IN}}(e + 1u), {{IN}}(e + 2u), {{IN}}(e + 3u));
        let xh = vec4<f32>({{IN}}(e + HALF), {{IN}}(e + HALF + 1u), {{IN}}(e + HALF + 2u), {{IN}}(e + HALF + 3u));
        let v0 = {{DQ}}(rb.x, g);
        let v1 = {{DQ}}(rb.y, g);
        let v2 = {{DQ}}(rb.z, g);
        let v3 = {{DQ}}(rb.w, g);
        acc += vec4<f32>(dot(v0.lo, xl) + dot(v0.hi, xh), dot(v1.lo, xl) + dot(v1.hi, xh),
                         dot(v2.lo, xl) + dot(v2.hi, xh), dot(v3.lo, xl) + dot(v3.hi, xh));
    }
    var sums = wg_sum(acc, lid);
{{NORM}}    let inv_rms = inverseSqrt(ss / f32(p.cols) + p.eps);
{{NORM}}    sums *= inv_rms;
{{NORM}}    if (wg_index == 0u && p.write_xn != 0u) {
{{NORM}}        for (var c = lid; c < p.cols; c += WG) { xn[p.xn_off + c] = x[p.x_off + c] * inv_rms * nw[c]; }
{{NORM}}    }

    if (lid < 4u && row0 + lid < p.n_rows) {
        var total = sums[lid];
{{BIAS}}        total += bias[p.bias_off + row0 + lid];
        let o = p.y_off + row0 + lid;
        if (p.acc != 0u) { total += y[o]; }
        y[o] = total;
    }
}
