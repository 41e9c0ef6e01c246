// Matrix-vector product for one token (decode), dequantizing the weights in place, with optional
// fused input prologues and a bias epilogue (each saves a dispatch and a trip through memory).
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks)
//           1 x (storage, read: the input at x_off; declared by the loop's view of it, matvec_x1.wgsl as
//             array<f32>, or matvec_x4.wgsl as array<vec4<f32>> where x_off is a multiple of 4)
//           2 y (storage, read_write: array<f32>, the output at y_off)
//           3 p (uniform Params)
//           NORM only: {{B_NW}} nw (norm weight, cols floats; declared with x), {{B_XN}} xn (read_write: the normed input)
//           BIAS only: {{B_BIAS}} bias (f32, indexed by output row + bias_off)
//           ROPE only: {{B_RP}} rp (uniform RopeParams), {{B_STEP}} step (uniform Step), {{B_KC}} k_cache and
//             {{B_VC}} v_cache (read_write [n_ctx, n_kv * head_dim] values: f32, or f16 two to a u32 word as
//             wgsl/kv.wgsl lays them out, each value rounded as it is stored)
//           EXPERT only: {{B_IDS}} ids (read: array<u32>, the chosen expert of each (token, slot) pair, pair-major),
//             {{B_EP}} ep (uniform ExpertParams)
// Math: y[y_off + r] = (acc ? y[y_off + r] : 0) + sum_c W[r, c] * in(c) (+ bias[bias_off + r]),  r < n_rows,
//   where in(c) is, by prologue ({{IN}}):
//     in_plain: x[x_off + c]
//     in_norm:  x[x_off + c] * rsqrt(mean(x^2) + eps) * nw[c]     (RMSNorm. The scale is common to the whole
//               row, so the loop sums W * x * nw and, from the same x values (the workgroup reads each
//               once), x^2; one reduction gives both, then the sums are scaled: no pass before the loop.
//               Workgroup 0 also stores the normed vector at xn[xn_off..] when write_xn, so traces and
//               probes still see it)
//     in_glu:   {{ACT}}(x[x_off + c]) * x[x_off + up_off + c]      (SwiGLU / GeGLU over a [gate | up] row)
// Epilogue ROPE (decode's fused [q | k | v] projection): y is the token's row, output column c = y_off + r.
//   Columns of the n_q + n_kv rotated heads leave rotated by RoPE at step.pos (pair (2i, 2i+1) of a head, or with
//   neox (i, i + n_rot / 2), i < n_rot / 2, angle pos * freqs[i]); the workgroup's 4 rows hold whole pairs (y_off
//   even; NeoX: `rope_rows` picks them, parts start on a head), so the partner's sum is at hand. With write_kv,
//   the K columns (rotated) and the V columns after them also go to cache row pos (not at or past n_ctx). Saves
//   rope.wgsl's dispatch a layer.
// Option EXPERT (a routed layer's experts, lab/ops/moe.py): W is a part of a stack of experts of n_rows rows each
//   (the part holds experts ep.first .. ep.first + ep.count - 1, whole); grid y is the (token, slot) pair q, whose
//   expert e = ids[q] (read once by the workgroup, workgroupUniformLoad, so the early return and the reductions stay
//   in uniform control flow): a part without e returns at once, so only the chosen experts' rows are read. The
//   pair's input starts at x_off + (q / ep.x_div) * ep.x_stride (x_div: the slots a token has, for the token's own
//   row; 1 for a row per pair), its output at y_off + q * ep.y_stride. No NORM, BIAS or ROPE with it.
// Uniform fields: n_rows (rows of this part; EXPERT: of one expert), cols, gpr (groups of 8 values per row = cols / 8),
//   row_bytes, x_off, y_off (floats; y_off already includes the part's first row), acc (0 or 1),
//   write_xn, eps, xn_off, bias_off (already includes the part's first row), up_off.
// Organisation: one workgroup of WG threads per 4 rows (vec4 accumulator, one lane per row); every
//   thread walks the units u = lid, lid + WG, ... of all 4 rows (`accumulate`, from the file LOOP names:
//   matvec_groups.wgsl, 8 values at a time through DQ, or a type's own loop that unpacks its scales once
//   per 32-64 values), so each input value is made once for 4 rows and neighbouring threads read
//   neighbouring words of the blocks. Sums are reduced over
//   the workgroup: with subgroups, subgroupAdd then one slot per subgroup in shared memory (subgroups
//   assumed to be consecutive ranges of local_invocation_index); without, a shared tree.
// Constants: WG (threads, power of two), LOOP (the loop's file; B_W4: the binding of its wider view of W, B_GRID of its grid,
//   where it has one), XVIEW (matvec_x1.wgsl or matvec_x4.wgsl: how x is read), DQ (dequant function, e.g. dq_q4_0), HALF (its group shape),
//   IN (in_plain | in_norm | in_glu), ACT (silu | gelu_tanh), NORM / BIAS / ROPE: "" or "// " (bindings and
//   code of that option; B_NW, B_XN, B_BIAS, B_RP, B_STEP, B_KC, B_VC their binding numbers), SG / NOSG: "" or
//   "// " so that only the chosen reduction is compiled (a device
//   without the subgroups feature rejects any subgroup builtin even in dead code); SG_ENABLE:
//   "enable subgroups;" where the WGSL compiler wants it (browser), "" for naga, which refuses it. KV32 / KV16: "" or
//   "// ", the KV cache's f32 or f16 lines (lab/ops/attention.py kv_consts; ROPE only, else the f32 ones).
//   EXPERT: k (unused by the kernel: the caller's slots), x_stride, y_stride, first, count, x_div.
// Grid: groups_1d(ceil(n_rows / 4)): workgroup index = wid.x + wid.y * num_workgroups.x; EXPERT: (ceil(n_rows / 4),
//   pairs, 1), workgroup index wid.x.
{{SG_ENABLE}}

struct Params { n_rows: u32, cols: u32, gpr: u32, row_bytes: u32, x_off: u32, y_off: u32, acc: u32,
                write_xn: u32, eps: f32, xn_off: u32, bias_off: u32, up_off: u32 };

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
{{NORM}}@group(0) @binding({{B_XN}}) var<storage, read_write> xn: array<f32>;
{{BIAS}}@group(0) @binding({{B_BIAS}}) var<storage, read> bias: array<f32>;
// freqs[i] = f[i / 4][i % 4]: in the uniform, a storage binding fewer (WebGPU's default is 8 a stage)
struct RopeParams { n_q: u32, n_kv: u32, head_dim: u32, n_rot: u32, n_ctx: u32, write_kv: u32, neox: u32, _p1: u32,
                    f: array<vec4<f32>, 32> };
{{ROPE}}@group(0) @binding({{B_RP}}) var<uniform> rp: RopeParams;
{{ROPE}}@group(0) @binding({{B_STEP}}) var<uniform> step: Step;
{{ROPE}}{{KV32}}@group(0) @binding({{B_KC}}) var<storage, read_write> k_cache: array<f32>;
{{ROPE}}{{KV32}}@group(0) @binding({{B_VC}}) var<storage, read_write> v_cache: array<f32>;
{{ROPE}}{{KV16}}@group(0) @binding({{B_KC}}) var<storage, read_write> k_cache: array<u32>;
{{ROPE}}{{KV16}}@group(0) @binding({{B_VC}}) var<storage, read_write> v_cache: array<u32>;
struct ExpertParams { k: u32, x_stride: u32, y_stride: u32, first: u32, count: u32, x_div: u32, _p0: u32, _p1: u32 };
{{EXPERT}}@group(0) @binding({{B_IDS}}) var<storage, read> ids: array<u32>;
{{EXPERT}}@group(0) @binding({{B_EP}}) var<uniform> ep: ExpertParams;
{{EXPERT}}var<workgroup> chosen: u32;
var<private> x_base: u32;   // where this workgroup's input starts (x_off; EXPERT: its pair's row)

//!include common.wgsl
//!include rotary.wgsl
//!include quant.wgsl
//!include act.wgsl
//!include {{XVIEW}}
//!include {{LOOP}}

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

{{ROPE}}// Value c of a cache row (f32), or the pair c, c + 1 (c even; f16, one word) from the lane of c.
{{ROPE}}{{KV32}}fn put_kv(k: bool, i: u32, c_even: bool, o: vec2<f32>) {
{{ROPE}}{{KV32}}    if (k) { k_cache[i] = o.x; } else { v_cache[i] = o.x; }
{{ROPE}}{{KV32}}}
{{ROPE}}{{KV16}}fn put_kv(k: bool, i: u32, c_even: bool, o: vec2<f32>) {
{{ROPE}}{{KV16}}    if (!c_even) { return; }
{{ROPE}}{{KV16}}    if (k) { k_cache[i / 2u] = pack2x16float(o); } else { v_cache[i / 2u] = pack2x16float(o); }
{{ROPE}}{{KV16}}}
{{ROPE}}
{{ROPE}}// The workgroup's 4 rows (of this part). Adjacent pairs: row0 .. row0 + 3, two whole pairs. NeoX
{{ROPE}}// pairs (d, d + n_rot / 2) lie half the rotation apart, so the workgroup at dims 4k .. 4k + 3 of a
{{ROPE}}// rotated head takes dims 2k, 2k + 1, 2k + n_rot / 2, 2k + 1 + n_rot / 2 instead (a permutation of the
{{ROPE}}// head's rotated rows: lanes 0 and 2, 1 and 3 are pairs, lanes 0 and 1, 2 and 3 adjacent values); the
{{ROPE}}// other rows stay in place. Parts start on a head.
{{ROPE}}fn rope_rows(row0: u32) -> vec4<u32> {
{{ROPE}}    let plain = vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u);
{{ROPE}}    let c0 = p.y_off + row0;
{{ROPE}}    let d0 = c0 % rp.head_dim;
{{ROPE}}    if (rp.neox == 0u || c0 >= (rp.n_q + rp.n_kv) * rp.head_dim || d0 >= rp.n_rot) { return plain; }
{{ROPE}}    let r = row0 - d0 + d0 / 2u;
{{ROPE}}    return vec4<u32>(r, r + 1u, r + rp.n_rot / 2u, r + 1u + rp.n_rot / 2u);
{{ROPE}}}
{{ROPE}}
{{ROPE}}// Lane l's output (its row rows[l]): its sum and bias, rotated by RoPE at step.pos where its column is
{{ROPE}}// a rotated dim of a Q or K head, with its pair partner's sum (lane l ^ 1 adjacent, l ^ 2 NeoX: in the
{{ROPE}}// workgroup either way).
{{ROPE}}fn rot_lane(rows: vec4<u32>, l: u32, sums: vec4<f32>) -> f32 {
{{ROPE}}    let neox = rp.neox != 0u;
{{ROPE}}    let m = select(l ^ 1u, l ^ 2u, neox);
{{ROPE}}    var v = sums[l];
{{ROPE}}    var w = sums[m];
{{ROPE}}{{BIAS}}    v += bias[p.bias_off + rows[l]];
{{ROPE}}{{BIAS}}    w += bias[p.bias_off + rows[m]];
{{ROPE}}    let c = p.y_off + rows[l];
{{ROPE}}    let d = c % rp.head_dim;
{{ROPE}}    if (c >= (rp.n_q + rp.n_kv) * rp.head_dim || d >= rp.n_rot) { return v; }
{{ROPE}}    let half = rp.n_rot / 2u;
{{ROPE}}    let i = select(d / 2u, d % half, neox);          // the pair's frequency
{{ROPE}}    let cs = cos_sin(f32(step.pos) * rp.f[i / 4u][i % 4u]);
{{ROPE}}    if (select(d % 2u == 0u, d < half, neox)) { return v * cs.x - w * cs.y; }
{{ROPE}}    return w * cs.y + v * cs.x;
{{ROPE}}}
{{ROPE}}
{{ROPE}}// Lane `lane`'s output, and with write_kv its K or V value in cache row pos: an even lane also works out the
{{ROPE}}// next lane's output (the adjacent value in both layouts), so that it holds an f16 word whole.
{{ROPE}}fn rope_out(rows: vec4<u32>, lane: u32, sums: vec4<f32>) -> f32 {
{{ROPE}}    let o = rot_lane(rows, lane, sums);
{{ROPE}}    let c = p.y_off + rows[lane];
{{ROPE}}    let q_end = rp.n_q * rp.head_dim;
{{ROPE}}    let kvd = rp.n_kv * rp.head_dim;
{{ROPE}}    if (rp.write_kv != 0u && step.pos < rp.n_ctx && c >= q_end && c < q_end + 2u * kvd) {
{{ROPE}}        let even = c % 2u == 0u;
{{ROPE}}        var o2 = o;
{{ROPE}}{{KV16}}        if (even) { o2 = rot_lane(rows, lane ^ 1u, sums); }
{{ROPE}}        if (c < q_end + kvd) { put_kv(true, step.pos * kvd + c - q_end, even, vec2<f32>(o, o2)); }
{{ROPE}}        else { put_kv(false, step.pos * kvd + c - q_end - kvd, even, vec2<f32>(o, o2)); }
{{ROPE}}    }
{{ROPE}}    return o;
{{ROPE}}}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>
{{SG}}        , @builtin(subgroup_size) sgs: u32, @builtin(subgroup_invocation_id) sgl: u32
        ) {
{{SG}}    sg_lane = sgl; sg_size = sgs;
    var wg_index = wid.x + wid.y * nwg.x;
{{EXPERT}}    wg_index = wid.x;
    let row0 = wg_index * 4u;
    if (row0 >= p.n_rows) { return; }
    var rows = vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u);
{{ROPE}}    rows = rope_rows(row0);
    x_base = p.x_off;
    var y_base = p.y_off;
    var w_base = 0u;        // EXPERT: the byte offset of the chosen expert's rows in this part
{{EXPERT}}    let pair = wid.y;
{{EXPERT}}    if (lid == 0u) { chosen = ids[pair]; }
{{EXPERT}}    let e = workgroupUniformLoad(&chosen);
{{EXPERT}}    if (e < ep.first || e >= ep.first + ep.count) { return; }
{{EXPERT}}    w_base = (e - ep.first) * p.n_rows * p.row_bytes;
{{EXPERT}}    x_base += (pair / ep.x_div) * ep.x_stride;
{{EXPERT}}    y_base += pair * ep.y_stride;

    // Rows past the end repeat the last row (valid memory, no branch); their sums are not written.
    let last = p.n_rows - 1u;
    let rb = min(rows, vec4<u32>(last)) * p.row_bytes + vec4<u32>(w_base);

    let acc = accumulate(rb, lid);
    var sums = wg_sum(acc, lid);
{{NORM}}    let inv_rms = inverseSqrt(ss / f32(p.cols) + p.eps);
{{NORM}}    sums *= inv_rms;
{{NORM}}    if (wg_index == 0u && p.write_xn != 0u) {
{{NORM}}        store_xn(lid, inv_rms);
{{NORM}}    }

    if (lid < 4u && rows[lid] < p.n_rows) {
        var total = sums[lid];
{{BIAS}}        total += bias[p.bias_off + rows[lid]];
{{ROPE}}        total = rope_out(rows, lid, sums);
        let o = y_base + rows[lid];
        if (p.acc != 0u) { total += y[o]; }
        y[o] = total;
    }
}
