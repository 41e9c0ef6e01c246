// Greedy argmax and top-k over rows of n logits (n up to a few hundred thousand), two dispatches each, one pass.
// Bindings: part pass  0 part (storage, read_write: Pair)  1 p (uniform Params)  2 step (uniform Step)
//                      3 logits (storage, read)
//           final pass 0 part (as above)  1 p  2 step  3 out (argmax_final: array<u32>, topk_final: array<Pair>)
//   (logits and the outputs share binding 3: each entry uses one of them.)
// Math: order pairs by value descending, ties by lower index first (llama.cpp greedy keeps the first max):
//   argmax: out[r] = index of the best element of row r;
//   top-k:  out[r*k + q], q < k, = the q-th best (index, value), sorted.
//   NaN and +-inf elements are never chosen (a broken forward pass must not become a token id); missing places
//   are (0xffffffff, -3.4028235e38), so a row with no finite element gives argmax 0xffffffff.
//   argmax_part / topk_part: workgroup (c, r) takes chunk c ({{EPT}} * {{WG}} elements) of row r and writes its
//   best 1 / k pairs to part[(r*n_chunks + c)*m + q] (m = 1 / k); argmax_final / topk_final (one workgroup per row)
//   merge row r's n_chunks*m pairs. top-k picks k times the best pair still below the previous pick.
// Params { n, n_chunks, k, rows, mode, _p0, _p1, _p2: u32 }; rows / mode: the row selection of rows.wgsl
//   (ROWS_FIXED p.rows rows, ROWS_TOKENS min(step.n_tokens, p.rows), ROWS_LAST the last token's row, read from
//   row n_tokens-1 and written as row 0).
// Reduction: wg_best, the best pair: subgroupMax/Min then one partial per subgroup ({{SG}} lines), or a
//   shared-memory tree ({{NOSG}}), on reduce.wgsl's `red` (values) and red_i (indices).
{{SG_ENABLE}}

struct Pair { index: u32, value: f32 };
struct Params { n: u32, n_chunks: u32, k: u32, rows: u32, mode: u32, _p0: u32, _p1: u32, _p2: u32 };

//!include common.wgsl
//!include reduce.wgsl
//!include rows.wgsl

const WG: u32 = {{WG}}u;
const EPT: u32 = {{EPT}}u;
const CHUNK: u32 = WG * EPT;
const LOWEST: f32 = -3.4028234663852886e38;
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<storage, read_write> part: array<Pair>;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<uniform> step: Step;
@group(0) @binding(3) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> out_index: array<u32>;
@group(0) @binding(3) var<storage, read_write> out_pairs: array<Pair>;

var<workgroup> red_i: array<u32, WG>;     // indices beside reduce.wgsl's `red`, which holds the values

fn better(a: Pair, b: Pair) -> bool {
    return a.value > b.value || (a.value == b.value && a.index < b.index);
}

// The best pair of the workgroup, returned to every invocation. Called in uniform control flow.
fn wg_best(c: Pair, li: u32) -> Pair {
{{SG}}    let m = subgroupMax(c.value);
{{SG}}    let mi = subgroupMin(select(NONE, c.index, c.value == m));
{{SG}}    if (sg_lane == 0u) { red[li / sg_size] = m; red_i[li / sg_size] = mi; }
{{SG}}    workgroupBarrier();
{{SG}}    var b = Pair(red_i[0], red[0]);
{{SG}}    for (var j = 1u; j < (WG + sg_size - 1u) / sg_size; j++) {
{{SG}}        let q = Pair(red_i[j], red[j]);
{{SG}}        if (better(q, b)) { b = q; }
{{SG}}    }
{{NOSG}}    red[li] = c.value;
{{NOSG}}    red_i[li] = c.index;
{{NOSG}}    workgroupBarrier();
{{NOSG}}    for (var s = WG / 2u; s > 0u; s >>= 1u) {
{{NOSG}}        if (li < s) {
{{NOSG}}            let q = Pair(red_i[li + s], red[li + s]);
{{NOSG}}            if (better(q, Pair(red_i[li], red[li]))) { red[li] = q.value; red_i[li] = q.index; }
{{NOSG}}        }
{{NOSG}}        workgroupBarrier();
{{NOSG}}    }
{{NOSG}}    let b = Pair(red_i[0], red[0]);
    workgroupBarrier();
    return b;
}

fn n_rows() -> u32 {
    return rows_in_step(p.mode, p.rows, step.n_tokens);
}

fn row_base(r: u32) -> u32 {
    return row_read(p.mode, r, step.n_tokens) * p.n;
}

// Element idx of the row as a pair, or the empty pair when outside the row or not finite. Finiteness is read off
// the exponent bits: a compiler may assume float compares never see NaN and fold `v != v` away.
fn element(base: u32, idx: u32) -> Pair {
    if (idx >= p.n) { return Pair(NONE, LOWEST); }
    let v = logits[base + idx];
    if ((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u) { return Pair(NONE, LOWEST); }
    return Pair(idx, v);
}

@compute @workgroup_size(WG)
fn argmax_part(@builtin(local_invocation_index) li: u32,
{{SG}}               @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
               @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let c = wid.x;
    let r = wid.y;
    if (r >= n_rows()) { return; }
    let base = row_base(r);
    var best = Pair(NONE, LOWEST);
    for (var j = 0u; j < EPT; j++) {
        let e = element(base, c * CHUNK + j * WG + li);
        if (better(e, best)) { best = e; }
    }
    let b = wg_best(best, li);
    if (li == 0u) { part[r * p.n_chunks + c] = b; }
}

@compute @workgroup_size(WG)
fn argmax_final(@builtin(local_invocation_index) li: u32,
{{SG}}                @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
                @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let r = wid.x;
    if (r >= n_rows()) { return; }
    var best = Pair(NONE, LOWEST);
    for (var j = li; j < p.n_chunks; j += WG) {
        let e = part[r * p.n_chunks + j];
        if (better(e, best)) { best = e; }
    }
    let b = wg_best(best, li);
    if (li == 0u) { out_index[r] = b.index; }
}

@compute @workgroup_size(WG)
fn topk_part(@builtin(local_invocation_index) li: u32,
{{SG}}             @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
             @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let c = wid.x;
    let r = wid.y;
    if (r >= n_rows()) { return; }
    let base = row_base(r);
    var mine: array<Pair, EPT>;
    for (var j = 0u; j < EPT; j++) { mine[j] = element(base, c * CHUNK + j * WG + li); }
    let out0 = (r * p.n_chunks + c) * p.k;
    var prev = Pair(NONE, LOWEST);
    for (var q = 0u; q < p.k; q++) {
        var best = Pair(NONE, LOWEST);
        for (var j = 0u; j < EPT; j++) {
            let e = mine[j];
            if (better(e, best) && (q == 0u || better(prev, e))) { best = e; }
        }
        prev = wg_best(best, li);
        if (li == 0u) { part[out0 + q] = prev; }
    }
}

@compute @workgroup_size(WG)
fn topk_final(@builtin(local_invocation_index) li: u32,
{{SG}}              @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
              @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let r = wid.x;
    if (r >= n_rows()) { return; }
    let m = p.n_chunks * p.k;
    let in0 = r * m;
    var prev = Pair(NONE, LOWEST);
    for (var q = 0u; q < p.k; q++) {
        var best = Pair(NONE, LOWEST);
        for (var j = li; j < m; j += WG) {
            let e = part[in0 + j];
            if (better(e, best) && (q == 0u || better(prev, e))) { best = e; }
        }
        prev = wg_best(best, li);
        if (li == 0u) { out_pairs[r * p.k + q] = prev; }
    }
}
