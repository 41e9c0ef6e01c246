// The retrieval index's two kernels (lab/instruments/retrieval.py): a window's embedding, pooled from the final-norm
// hidden states the engine's own plan leaves in xn, and the cosine scores of query embeddings against the index.
//
// pool: one workgroup of {{WG}}.
// Bindings: 0 xn (read, f32 [t, n_embd]: the step's rows after the final RMSNorm, llama.cpp's result_norm)
//           1 table (read_write, f32 [rows, n_embd]: the index, or the queries; row p.slot is written)
//           2 step (uniform Step)   3 p (uniform Pool)
// Math: s = (p.flags & ADD ? table[slot] : 0) + sum over the step's rows j with step.pos + j >= p.first of xn[j];
//   table[slot] = s, then, with NORMALIZE, table[slot] = s / |s|. A window longer than one step is pooled over its
//   steps (the first overwrites, the others add); the last normalises. The mean's 1/n is left out: L2 normalisation
//   cancels it. Rows before p.first (the BOS the window is run behind) are not pooled.
// Pool { n_embd, first, slot, flags }: a CONVERSATION uniform, rewritten before every step.
//
// score: grid (ceil(n / WG), t); workgroup y is query row r < step.n_tokens (the step uniform's token count is the
//   number of queries, so the top-k after it can take one row per query: Rows.per_token).
// Bindings: 0 index (read, f32 [n, n_embd])   1 queries (read, f32 [q, n_embd])
//           2 scores (read_write, f32 [q, n])   3 step (uniform Step)   4 p (uniform Scores)
// Math: scores[r, i] = dot(queries[r], index[i]): the cosine, both sides unit vectors; -inf for rows i >= p.ready
//   (an index whose build was stopped holds fewer windows than rows: the top-k never picks -inf).
// Scores { n, n_embd, ready, neg_inf }: a CONVERSATION uniform (the index's size is a fact of the user's files);
//   neg_inf holds the bits 0xff800000 (Chromium's compiler refuses -inf as a constant, as probes.wgsl notes).
// Constants: WG; SG / NOSG / SG_ENABLE from lab.gpu.shaders.subgroup_consts (pool's reduction, reduce.wgsl).
// The two entries share binding numbers (auto layouts), as probes.wgsl's do.
{{SG_ENABLE}}

//!include common.wgsl
//!include reduce.wgsl

const WG: u32 = {{WG}}u;
const ADD: u32 = 1u;
const NORMALIZE: u32 = 2u;

struct Pool { n_embd: u32, first: u32, slot: u32, flags: u32 };
struct Scores { n: u32, n_embd: u32, ready: u32, neg_inf: u32 };

@group(0) @binding(0) var<storage, read> xn: array<f32>;
@group(0) @binding(1) var<storage, read_write> table: array<f32>;
@group(0) @binding(2) var<uniform> step: Step;
@group(0) @binding(3) var<uniform> p: Pool;
// scores
@group(0) @binding(0) var<storage, read> index: array<f32>;
@group(0) @binding(1) var<storage, read> queries: array<f32>;
@group(0) @binding(2) var<storage, read_write> scores: array<f32>;
@group(0) @binding(3) var<uniform> step_s: Step;
@group(0) @binding(4) var<uniform> ps: Scores;

@compute @workgroup_size(WG)
fn pool(@builtin(local_invocation_index) li: u32
{{SG}}        , @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32
        ) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let E = p.n_embd;
    let row = p.slot * E;
    // the step's rows that belong to the window: from position p.first on
    var j0 = 0u;
    if (p.first > step.pos) { j0 = p.first - step.pos; }
    var sq = 0.0;
    for (var c = li; c < E; c += WG) {
        var s = 0.0;
        if ((p.flags & ADD) != 0u) { s = table[row + c]; }
        for (var j = j0; j < step.n_tokens; j++) { s += xn[j * E + c]; }
        table[row + c] = s;
        sq += s * s;
    }
    let total = wg_sum(sq, li);
    if ((p.flags & NORMALIZE) != 0u) {
        let inv = 1.0 / sqrt(max(total, 1e-30));
        // each invocation rescales the columns it wrote itself: no other invocation touches them
        for (var c = li; c < E; c += WG) { table[row + c] = table[row + c] * inv; }
    }
}

@compute @workgroup_size(WG)
fn score(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x;
    let r = wid.y;
    if (i >= ps.n || r >= step_s.n_tokens) { return; }
    let E = ps.n_embd;
    if (i >= ps.ready) { scores[r * ps.n + i] = bitcast<f32>(ps.neg_inf); return; }
    var acc = 0.0;
    for (var c = 0u; c < E; c++) { acc += index[i * E + c] * queries[r * E + c]; }
    scores[r * ps.n + i] = acc;
}
