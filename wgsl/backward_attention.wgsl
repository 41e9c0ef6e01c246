// Causal attention backward (the forward is attention.wgsl): dQ, dK and dV of the step's t queries over keys
// 0 .. pos + t - 1, with GQA, a sliding window and the logit soft-cap, in three dispatches of one pass, the
// probabilities recomputed from each row's statistics and never stored (FlashAttention-2's backward, without tiles).
// Resources (f32 throughout; every row addressed as off + row * stride + head * HD floats, Params below):
//   q, o, dout  [t rows] the step's queries, the forward's output and its gradient (head h of query row j)
//   k, v        [pos + t rows] keys and values by position (an f32 KV cache serves as it is: stride n_kv * HD)
//   dq [t rows], dk, dv [pos + t rows]: written (rows past them untouched); keys no query sees get 0
//   stats       vec4 per (query row j, head h) at j * n_head + h: (m, 1 / l, D, 0), attn_stats' output
// Bindings, each entry's own from 0 (variables of two entries share numbers on purpose, as backward_norm.wgsl's):
//   attn_stats: 0 q  1 k  2 o     3 dout  4 stats_out (rw)  5 P (uniform Params)  6 step (uniform Step)
//   attn_dq:    0 q  1 k  2 v     3 dout  4 stats           5 P                    6 step  7 dq (rw)
//   attn_dkv:   0 q  1 k  2 v     3 dout  4 stats           5 P                    6 step  7 dk (rw)  8 dv (rw)
//   attn_dkv with DV=dk: dk and dv one buffer bound once at 7 (rw), for WebGPU refuses two writable bindings of one
//   buffer whose ranges overlap (Dawn at the dispatch), and the rows of a fused [dq | dk | dv] gradient row
//   interleave; {{DV}} names the buffer dV is written to (dv, or dk itself): the same sums, the same bits
// Math (lab/host/reference/grads_attention.py attention_grad is the float64 oracle), for query row i = (j, h) at
//   qpos = pos + j, KV head g = h / group, key k visible iff key_begin(qpos) <= k < key_end(qpos) (the forward's mask):
//   raw = scale q.k,  s = c tanh(raw / c) (c = softcap > 0; else s = raw),  P = exp(s - m) / l  (m the row's max,
//   l = sum exp(s - m)),  D = dO_i . O_i  (= sum_k P dP, what the softmax's backward subtracts),
//   dS = P (dO_i . v_k - D) (1 - tanh^2(raw / c)),  dQ_i = scale sum_k dS k_k,
//   dK_k = scale sum over (j, h in g) dS q_i,  dV_k = sum over (j, h in g) P dO_i.
// Entries and grids (rows of ROWS x LANES invocations a workgroup, 1-D, folded into y past 65535 workgroups):
//   attn_stats  a row per (j, h), ceil(t n_head / ROWS) groups: walks the row's visible keys once (online max and
//               sum, the lanes' pairs merged), then D; writes stats. It recomputes what the forward knew
//               (attention.wgsl keeps no statistics), one more pass of q.k, cheaper than a t x keys probability matrix.
//   attn_dq     a row per (j, h), the same grid: the row's keys, P and dS recomputed, dQ in HD private floats a lane.
//   attn_dkv    a row per (key, KV head), ceil(n_ctx n_kv / ROWS) groups (keys past pos + t compute nothing): the
//               (query, head) terms that see the key, queries j = first .. last in order and the group's heads in
//               order within each, dK and dV in 2 HD private floats a lane.
//   Every sum runs in an order fixed by the shapes and LANES: no float atomics (WGSL has none), no race, the same
//   bits every run on one adapter.
// Why lanes (lab.ops.backward_attention `lanes`): one invocation a row walks up to t keys (or t x group terms) alone,
//   a few thousand invocations in all at t = 512, each waiting on its loads one after another, too few warps to
//   hide them; LANES lanes a row cut the walk LANES-fold and fill the GPU. A CPU adapter takes 64 rows of one lane
//   (no barrier costs it: SwiftShader pays for each per thread, and its lanes are already busy with rows).
// The three passes recompute each score q.k with the same code (qk, score), so P is the same in each.
// Loops: an invocation of attn_stats or attn_dq runs ~(3 HD/4 + 1) iterations a visible key of its lane, attn_dkv
//   ~(3 HD/4 + 1) a (query, head) term of its lane: lavapipe stops an invocation's loops silently past 32,768
//   iterations (65,535 over nested loops, tests/kernels/test_loop_budget.py), so the builder
//   (lab.ops.backward_attention) refuses shapes past 32,767 on such an adapter (e.g. at HD 64 and one lane: ~650
//   keys, ~650 / group query rows seeing one key).

//!include common.wgsl

struct Params {
    q_off: u32, q_stride: u32, o_off: u32, o_stride: u32,
    do_off: u32, do_stride: u32, dq_off: u32, dq_stride: u32,
    k_off: u32, k_stride: u32, v_off: u32, v_stride: u32,
    dk_off: u32, dk_stride: u32, dv_off: u32, dv_stride: u32,
    n_head: u32, n_kv_head: u32, group: u32, window: u32,
    scale: f32, softcap: f32, _p0: u32, _p1: u32,
};

const HD: u32 = {{HEAD_DIM}}u;
const HD4: u32 = HD / 4u;
const ROWS: u32 = {{ROWS}}u;              // rows a workgroup (a CPU adapter: 64, one lane each)
const LANES: u32 = {{LANES}}u;            // lanes a row, a power of two (a GPU: 64 / (HD / 64), 1 row)
const NEG: f32 = -3.0e38;                 // "no score yet": exp(NEG - s) is 0, never inf

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> dout: array<f32>;
@group(0) @binding(4) var<storage, read> stats: array<vec4<f32>>;
@group(0) @binding(5) var<uniform> P: Params;
@group(0) @binding(6) var<uniform> step: Step;
@group(0) @binding(7) var<storage, read_write> dq: array<f32>;
// attn_stats' own
@group(0) @binding(2) var<storage, read> o: array<f32>;
@group(0) @binding(4) var<storage, read_write> stats_out: array<vec4<f32>>;
// attn_dkv's own
@group(0) @binding(7) var<storage, read_write> dk: array<f32>;
@group(0) @binding(8) var<storage, read_write> dv: array<f32>;
// the lanes' meeting place: HD floats a lane (attn_dq, attn_dkv), or (max, sum) a lane (attn_stats); one element
// where a row has one lane (RED = ROWS * LANES * HD4 or 1, RED_ML = ROWS * LANES or 1)
var<workgroup> red: array<vec4<f32>, {{RED}}>;
var<workgroup> red_ml: array<vec2<f32>, {{RED_ML}}>;

// Four floats from float index i (rows may sit at any float offset: a fused row's heads, a cache's).
fn load_q(i: u32) -> vec4<f32> { return vec4<f32>(q[i], q[i + 1u], q[i + 2u], q[i + 3u]); }
fn load_k(i: u32) -> vec4<f32> { return vec4<f32>(k[i], k[i + 1u], k[i + 2u], k[i + 3u]); }
fn load_v(i: u32) -> vec4<f32> { return vec4<f32>(v[i], v[i + 1u], v[i + 2u], v[i + 3u]); }
fn load_o(i: u32) -> vec4<f32> { return vec4<f32>(o[i], o[i + 1u], o[i + 2u], o[i + 3u]); }
fn load_do(i: u32) -> vec4<f32> { return vec4<f32>(dout[i], dout[i + 1u], dout[i + 2u], dout[i + 3u]); }

// ---- the mask, as the forward's: key k is visible from query position qpos iff key_begin(qpos) <= k < key_end(qpos)
// (causal, and llama.cpp's standard window of W keys, the query's own included).
fn key_end(qpos: u32) -> u32 { return qpos + 1u; }
fn key_begin(qpos: u32) -> u32 {
    if (P.window > 0u && qpos + 1u > P.window) { return qpos + 1u - P.window; }
    return 0u;
}
// ... and the same rule turned around for attn_dkv: the step's query rows j (position pos + j) that see key k are
// query_first(k) <= j < query_end(k): positions k .. k + W - 1 (W = 0: every later one) within the step.
fn query_first(key: u32) -> u32 { return max(key, step.pos) - step.pos; }
fn query_end(key: u32) -> u32 {
    var e = step.pos + step.n_tokens;
    if (P.window > 0u) { e = min(e, key + P.window); }
    return max(e, step.pos) - step.pos;
}

// GQA: query head h reads KV head h / group (consecutive query heads share one), and back.
fn kv_head(h: u32) -> u32 { return h / P.group; }
fn q_head(g: u32, hg: u32) -> u32 { return g * P.group + hg; }

// Where rows start (floats): query row j's head h in q, o, dout, dq; key row `key`'s KV head g in k, v, dk, dv.
fn q_at(j: u32, h: u32) -> u32 { return P.q_off + j * P.q_stride + h * HD; }
fn do_at(j: u32, h: u32) -> u32 { return P.do_off + j * P.do_stride + h * HD; }
fn k_at(key: u32, g: u32) -> u32 { return P.k_off + key * P.k_stride + g * HD; }
fn v_at(key: u32, g: u32) -> u32 { return P.v_off + key * P.v_stride + g * HD; }

// q.k and dO.v, one order of vec4 partial dots for every pass (the recomputed scores agree bit for bit).
fn qk(qi: u32, ki: u32) -> f32 {
    var d = 0.0;
    for (var c = 0u; c < HD4; c++) { d += dot(load_q(qi + 4u * c), load_k(ki + 4u * c)); }
    return d;
}
fn dov(di: u32, vi: u32) -> f32 {
    var d = 0.0;
    for (var c = 0u; c < HD4; c++) { d += dot(load_do(di + 4u * c), load_v(vi + 4u * c)); }
    return d;
}

// The score of a dot product and its derivative ds / draw: the cap's 1 - tanh^2(raw / c) as sech^2 = 4e / (1 + e)^2,
// e = exp(-2 |raw / c|), with no cancellation where tanh nears 1; past the forward's clamp (15) the forward is flat
// and the derivative 0. Without a cap, (raw, 1).
fn score(d: f32) -> vec2<f32> {
    let raw = d * P.scale;
    if (P.softcap > 0.0) {
        let w = raw / P.softcap;
        let e = exp(-2.0 * abs(w));
        let slope = select(0.0, 4.0 * e / ((1.0 + e) * (1.0 + e)), abs(w) < 15.0);
        return vec2<f32>(P.softcap * tanh(clamp(w, -15.0, 15.0)), slope);
    }
    return vec2<f32>(raw, 1.0);
}

// The probability of a score from its row's statistics st = (m, 1 / l, D, 0).
fn prob(s: f32, st: vec4<f32>) -> f32 { return exp(s - st.x) * st.y; }

// ---- the lanes: a row's walk (its keys, or a key's query terms) is cut across LANES lanes, lane s taking the items
// s, s + LANES, ... in order; the lanes' partial results then meet as a tree in workgroup memory (strides LANES / 2,
// .., 1), lane 0 holding the row's. Fixed by LANES alone: the same bits every run on one adapter.
// Each workgroup is ROWS rows x LANES lanes, row r = (its index) * ROWS + li / LANES; rows past the step compute
// nothing but reach every barrier (uniform control flow).

// The row and lane of an invocation (workgroups folded into y past 65535: index = wid.x + wid.y * nwg.x).
fn row_of(wid: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 { return (wid.x + wid.y * nwg.x) * ROWS + li / LANES; }

// The sum over a row's lanes of their HD-float vectors, left in *acc of every lane of the row (lane 0 stores it).
fn reduce_lanes(li: u32, acc: ptr<function, array<vec4<f32>, HD4>>) {
    let lane = li % LANES;
    let mine = li * HD4;
    for (var c = 0u; c < HD4; c++) { red[mine + c] = (*acc)[c]; }
    workgroupBarrier();
    for (var h = LANES / 2u; h > 0u; h = h / 2u) {
        if (lane < h) {
            for (var c = 0u; c < HD4; c++) { red[mine + c] += red[mine + h * HD4 + c]; }
        }
        workgroupBarrier();
    }
    let first = (li - lane) * HD4;
    for (var c = 0u; c < HD4; c++) { (*acc)[c] = red[first + c]; }
    workgroupBarrier();                       // every lane has read before `red` is written again
}

@compute @workgroup_size(ROWS * LANES)
fn attn_stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let r = row_of(wid, nwg, li);             // query row j * n_head + h
    let lane = li % LANES;
    let inside = r < step.n_tokens * P.n_head;
    let j = r / P.n_head;
    let h = r % P.n_head;
    let qpos = step.pos + j;
    var m = NEG;
    var l = 0.0;
    if (inside) {
        let qi = q_at(j, h);
        for (var key = key_begin(qpos) + lane; key < key_end(qpos); key += LANES) {
            let s = score(qk(qi, k_at(key, kv_head(h)))).x;
            if (s > m) {                      // a new max: rescale the sum so far
                l = l * exp(m - s) + 1.0;
                m = s;
            } else {
                l += exp(s - m);
            }
        }
    }
    if (LANES > 1u) {                         // the lanes' (max, sum) pairs merged, each sum rescaled to the larger max
        red_ml[li] = vec2<f32>(m, l);
        workgroupBarrier();
        for (var hh = LANES / 2u; hh > 0u; hh = hh / 2u) {
            if (lane < hh) {
                let a = red_ml[li];
                let b = red_ml[li + hh];
                let mm = max(a.x, b.x);
                red_ml[li] = vec2<f32>(mm, a.y * exp(a.x - mm) + b.y * exp(b.x - mm));
            }
            workgroupBarrier();
        }
        let t = red_ml[li - lane];
        m = t.x;
        l = t.y;
    }
    if (!inside || lane != 0u) { return; }
    let oi = P.o_off + j * P.o_stride + h * HD;
    let di = do_at(j, h);
    var dd = 0.0;
    for (var c = 0u; c < HD4; c++) { dd += dot(load_do(di + 4u * c), load_o(oi + 4u * c)); }
    stats_out[r] = vec4<f32>(m, 1.0 / l, dd, 0.0);
}

@compute @workgroup_size(ROWS * LANES)
fn attn_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let r = row_of(wid, nwg, li);
    let lane = li % LANES;
    let inside = r < step.n_tokens * P.n_head;
    let j = r / P.n_head;
    let h = r % P.n_head;
    var acc: array<vec4<f32>, HD4>;           // zero-initialised
    if (inside) {
        let qpos = step.pos + j;
        let st = stats[r];
        let qi = q_at(j, h);
        let di = do_at(j, h);
        for (var key = key_begin(qpos) + lane; key < key_end(qpos); key += LANES) {
            let ki = k_at(key, kv_head(h));
            let sd = score(qk(qi, ki));
            let p = prob(sd.x, st);
            let ds = p * (dov(di, v_at(key, kv_head(h))) - st.z) * sd.y;
            for (var c = 0u; c < HD4; c++) { acc[c] += ds * load_k(ki + 4u * c); }
        }
    }
    if (LANES > 1u) { reduce_lanes(li, &acc); }
    if (!inside || lane != 0u) { return; }
    let out = P.dq_off + j * P.dq_stride + h * HD;
    for (var c = 0u; c < HD4; c++) {
        let g = acc[c] * P.scale;
        dq[out + 4u * c] = g.x;
        dq[out + 4u * c + 1u] = g.y;
        dq[out + 4u * c + 2u] = g.z;
        dq[out + 4u * c + 3u] = g.w;
    }
}

// dK (unscaled) and dV of key `key` and KV head g: this lane's share of the terms (query j, head h of the group) that
// see the key, term n = (j - first) * group + (h - g * group) in order n = lane, lane + LANES, ...
fn dkv_sums(key: u32, g: u32, lane: u32, gk: ptr<function, array<vec4<f32>, HD4>>,
            gv: ptr<function, array<vec4<f32>, HD4>>) {
    let ki = k_at(key, g);
    let vi = v_at(key, g);
    let first = query_first(key);
    let terms = (max(query_end(key), first) - first) * P.group;
    for (var n = lane; n < terms; n += LANES) {
        let j = first + n / P.group;
        let h = q_head(g, n % P.group);
        let st = stats[j * P.n_head + h];
        let qi = q_at(j, h);
        let di = do_at(j, h);
        let sd = score(qk(qi, ki));
        let p = prob(sd.x, st);
        let ds = p * (dov(di, vi) - st.z) * sd.y;
        for (var c = 0u; c < HD4; c++) {
            (*gv)[c] += p * load_do(di + 4u * c);
            (*gk)[c] += ds * load_q(qi + 4u * c);
        }
    }
}

@compute @workgroup_size(ROWS * LANES)
fn attn_dkv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let r = row_of(wid, nwg, li);             // key row key * n_kv_head + g
    let lane = li % LANES;
    let inside = r < (step.pos + step.n_tokens) * P.n_kv_head;
    let key = r / P.n_kv_head;
    let g = r % P.n_kv_head;
    var gk: array<vec4<f32>, HD4>;
    var gv: array<vec4<f32>, HD4>;
    if (inside) { dkv_sums(key, g, lane, &gk, &gv); }
    if (LANES > 1u) {
        reduce_lanes(li, &gk);
        reduce_lanes(li, &gv);
    }
    if (!inside || lane != 0u) { return; }
    let ko = P.dk_off + key * P.dk_stride + g * HD;
    let vo = P.dv_off + key * P.dv_stride + g * HD;
    for (var c = 0u; c < HD4; c++) {
        let a = gk[c] * P.scale;
        let b = gv[c];
        dk[ko + 4u * c] = a.x;
        dk[ko + 4u * c + 1u] = a.y;
        dk[ko + 4u * c + 2u] = a.z;
        dk[ko + 4u * c + 3u] = a.w;
        {{DV}}[vo + 4u * c] = b.x;
        {{DV}}[vo + 4u * c + 1u] = b.y;
        {{DV}}[vo + 4u * c + 2u] = b.z;
        {{DV}}[vo + 4u * c + 3u] = b.w;
    }
}

// ---- tiles: a GPU's path (lab.ops.backward_attention `tiles`), FlashAttention-2's backward in two dispatches.
// Why: the lanes above load every key row from memory once per query row (and every query row once per key), a few
// flops a load; a tile of BQ query rows (one head) x BK keys loads each row once for the whole tile, and each
// invocation keeps a 4 x NB block of the tile's products in registers. 256 invocations a workgroup, (tr, tc) =
// (li / 16, li % 16) holding rows r = tr + 16 a (a < 4) and keys c = tc + 16 b (b < NB) of a tile.
//   attn_dq_tiles   a workgroup per (BQ query rows, head): the rows' keys a tile at a time, twice: first each row's
//                   max and sum (online per invocation over its keys, then the 16 invocations of a row merged as a
//                   tree), D = dO . O, written to stats for attn_dkv_tiles; then dS, and dQ = scale dS K (the tile's dS
//                   in workgroup memory, K read SUB rows at a time). It replaces attn_stats and attn_dq.
//   attn_dkv_tiles  a workgroup per (BK keys, KV head): the group's heads in order, each the query rows that see the
//                   keys a tile at a time (rows in order), P and dS from the stats; dV += P^T dO and dK += dS^T Q (P,
//                   then dS, in workgroup memory; dO and Q read SUB rows at a time); an invocation sums key li / 8's
//                   columns cg + 8 c (cg = li % 8). Keys no query sees get 0, as attn_dkv's.
// Every sum runs in a fixed order (q.k and dO.v over d in order, dQ over keys in order, dK and dV over (head, row) in
// order): the same bits every run. Needs HD a multiple of 16, at most 256 (the builder checks); 16,128 bytes of
// workgroup memory.
const BQ: u32 = 64u;                      // query rows a tile
const BK: u32 = 32u;                      // keys a tile
const NB: u32 = BK / 16u;                 // keys an invocation holds in a tile
const DC: u32 = 8u;                       // floats of HD a chunk of the tile's products
const PAD: u32 = DC + 1u;                 // a chunk row's stride in workgroup memory (odd: a warp's rows, other banks)
const SUB: u32 = {{SUB}}u;                // rows of K (attn_dq_tiles), dO or Q (attn_dkv_tiles) a sub-chunk
const NCQ: u32 = HD / 16u;                // dQ columns an invocation: tc + 16 c
const NCK: u32 = HD / 8u;                 // dK and dV columns an invocation: cg + 8 c
const DO_AT: u32 = BQ * PAD;              // where the chunks of dO, K and V start in `sc`, after Q's
const K_AT: u32 = 2u * BQ * PAD;
const V_AT: u32 = K_AT + BK * PAD;

@group(0) @binding(8) var<storage, read> o_t: array<f32>;      // attn_dq_tiles' O (binding 2 is V there)
var<workgroup> sc: array<f32, {{SC}}>;    // the chunks [Q | dO | K | V] (PAD floats a row), or SUB rows of HD floats
var<workgroup> sp: array<f32, BQ * BK>;  // the tile's dS or P, row-major; attn_dq_tiles' (max, sum) pairs to merge
var<workgroup> rs: array<vec4<f32>, BQ>; // the tile's rows' statistics (m, 1 / l, D, 0)

fn visible(j: u32, key: u32) -> bool {
    let qpos = step.pos + j;
    return j < step.n_tokens && key >= key_begin(qpos) && key < key_end(qpos);
}

// (P, dS) of query row j and key `key` from their q.k and dO.v and the row's statistics st; (0, 0) where the key is
// not visible from the row (or the row is past the step).
fn tile_p_ds(j: u32, key: u32, qk_: f32, dov_: f32, st: vec4<f32>) -> vec2<f32> {
    if (!visible(j, key)) { return vec2<f32>(0.0); }
    let sd = score(qk_);
    let p = prob(sd.x, st);
    return vec2<f32>(p, p * (dov_ - st.z) * sd.y);
}

// The tile's products over HD of query rows j0 + r (head h) and keys k0 + c (KV head g): s = q.k and, with `both`,
// dp = dO.v, an invocation's 4 x NB. Rows past the step and keys from kend on are never loaded (zeros).
fn tile_products(li: u32, j0: u32, h: u32, k0: u32, g: u32, kend: u32, both: bool,
                 s: ptr<function, array<array<f32, NB>, 4>>, dp: ptr<function, array<array<f32, NB>, 4>>) {
    let tr = li / 16u;
    let tc = li % 16u;
    for (var d0 = 0u; d0 < HD; d0 += DC) {
        workgroupBarrier();                   // the chunk before (or `sc`'s other use) has been read
        for (var e = li; e < BQ * DC; e += 256u) {
            let r = e / DC;
            let dd = e % DC;
            let j = j0 + r;
            var a = 0.0;
            var b = 0.0;
            if (j < step.n_tokens) {
                a = q[q_at(j, h) + d0 + dd];
                if (both) { b = dout[do_at(j, h) + d0 + dd]; }
            }
            sc[r * PAD + dd] = a;
            sc[DO_AT + r * PAD + dd] = b;
        }
        for (var e = li; e < BK * DC; e += 256u) {
            let c = e / DC;
            let dd = e % DC;
            let key = k0 + c;
            var a = 0.0;
            var b = 0.0;
            if (key < kend) {
                a = k[k_at(key, g) + d0 + dd];
                if (both) { b = v[v_at(key, g) + d0 + dd]; }
            }
            sc[K_AT + c * PAD + dd] = a;
            sc[V_AT + c * PAD + dd] = b;
        }
        workgroupBarrier();
        for (var dd = 0u; dd < DC; dd++) {
            for (var a = 0u; a < 4u; a++) {
                let qa = sc[(tr + 16u * a) * PAD + dd];
                let oa = sc[DO_AT + (tr + 16u * a) * PAD + dd];
                for (var b = 0u; b < NB; b++) {
                    (*s)[a][b] += qa * sc[K_AT + (tc + 16u * b) * PAD + dd];
                    if (both) { (*dp)[a][b] += oa * sc[V_AT + (tc + 16u * b) * PAD + dd]; }
                }
            }
        }
    }
}

@compute @workgroup_size(256)
fn attn_dq_tiles(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let j0 = wid.x * BQ;                      // the grid has no tile past the step
    let h = wid.y;
    let g = kv_head(h);
    let tr = li / 16u;
    let tc = li % 16u;
    let lo = key_begin(step.pos + j0);
    let hi = key_end(step.pos + min(j0 + BQ, step.n_tokens) - 1u);
    // 1. each row's max and sum: online over this invocation's keys, then the row's 16 invocations as a tree
    var m = array<f32, 4>(NEG, NEG, NEG, NEG);
    var l: array<f32, 4>;
    for (var k0 = lo; k0 < hi; k0 += BK) {
        // initialised: naga (gfx-rs/wgpu#9489) zeroes a bare `var` declared in a loop once a call, not each pass
        var s = array<array<f32, NB>, 4>();
        var dp = array<array<f32, NB>, 4>();
        tile_products(li, j0, h, k0, g, hi, false, &s, &dp);
        for (var a = 0u; a < 4u; a++) {
            for (var b = 0u; b < NB; b++) {
                if (visible(j0 + tr + 16u * a, k0 + tc + 16u * b)) {
                    let x = score(s[a][b]).x;
                    if (x > m[a]) {
                        l[a] = l[a] * exp(m[a] - x) + 1.0;
                        m[a] = x;
                    } else {
                        l[a] += exp(x - m[a]);
                    }
                }
            }
        }
    }
    workgroupBarrier();
    for (var a = 0u; a < 4u; a++) {
        let i = ((tr + 16u * a) * 16u + tc) * 2u;
        sp[i] = m[a];
        sp[i + 1u] = l[a];
    }
    workgroupBarrier();
    for (var w = 8u; w > 0u; w = w / 2u) {
        if (tc < w) {
            for (var a = 0u; a < 4u; a++) {
                let i = ((tr + 16u * a) * 16u + tc) * 2u;
                let mm = max(sp[i], sp[i + 2u * w]);
                sp[i + 1u] = sp[i + 1u] * exp(sp[i] - mm) + sp[i + 2u * w + 1u] * exp(sp[i + 2u * w] - mm);
                sp[i] = mm;
            }
        }
        workgroupBarrier();
    }
    if (li < BQ) {
        let j = j0 + li;
        var st = vec4<f32>(0.0);
        if (j < step.n_tokens) {
            let oi = P.o_off + j * P.o_stride + h * HD;
            let di = do_at(j, h);
            var dd = 0.0;
            for (var d = 0u; d < HD; d++) { dd += dout[di + d] * o_t[oi + d]; }
            st = vec4<f32>(sp[li * 32u], 1.0 / sp[li * 32u + 1u], dd, 0.0);
            stats_out[j * P.n_head + h] = st;
        }
        rs[li] = st;
    }
    // 2. dS, and dQ = scale dS K
    var acc: array<array<f32, NCQ>, 4>;
    for (var k0 = lo; k0 < hi; k0 += BK) {
        var s = array<array<f32, NB>, 4>();      // initialised, as above
        var dp = array<array<f32, NB>, 4>();
        tile_products(li, j0, h, k0, g, hi, true, &s, &dp);     // its barriers also publish rs
        for (var a = 0u; a < 4u; a++) {
            for (var b = 0u; b < NB; b++) {
                let r = tr + 16u * a;
                sp[r * BK + tc + 16u * b] = tile_p_ds(j0 + r, k0 + tc + 16u * b, s[a][b], dp[a][b], rs[r]).y;
            }
        }
        for (var k1 = 0u; k1 < BK; k1 += SUB) {
            workgroupBarrier();               // sp written; the sub-chunk before read
            for (var e = li; e < SUB * HD; e += 256u) {
                let key = k0 + k1 + e / HD;
                var x = 0.0;
                if (key < hi) { x = k[k_at(key, g) + e % HD]; }
                sc[e] = x;
            }
            workgroupBarrier();
            for (var kk = 0u; kk < SUB; kk++) {
                for (var a = 0u; a < 4u; a++) {
                    let w = sp[(tr + 16u * a) * BK + k1 + kk];
                    for (var c = 0u; c < NCQ; c++) { acc[a][c] += w * sc[kk * HD + tc + 16u * c]; }
                }
            }
        }
    }
    for (var a = 0u; a < 4u; a++) {
        let j = j0 + tr + 16u * a;
        if (j < step.n_tokens) {
            let out = P.dq_off + j * P.dq_stride + h * HD;
            for (var c = 0u; c < NCQ; c++) { dq[out + tc + 16u * c] = acc[a][c] * P.scale; }
        }
    }
}

// acc (an invocation's NCK columns of key li / 8) += sum over the tile's BQ rows of sp[row][key] x row, the rows
// those of dO (from_do) or of Q at j0 .., head h, SUB at a time (rows past the step never loaded: zeros).
fn rows_product(li: u32, j0: u32, h: u32, from_do: bool, acc: ptr<function, array<f32, NCK>>) {
    let kk = li / 8u;
    let cg = li % 8u;
    for (var r1 = 0u; r1 < BQ; r1 += SUB) {
        workgroupBarrier();                   // sp written; the sub-chunk before read
        for (var e = li; e < SUB * HD; e += 256u) {
            let j = j0 + r1 + e / HD;
            var x = 0.0;
            if (j < step.n_tokens) {
                if (from_do) { x = dout[do_at(j, h) + e % HD]; } else { x = q[q_at(j, h) + e % HD]; }
            }
            sc[e] = x;
        }
        workgroupBarrier();
        for (var rr = 0u; rr < SUB; rr++) {
            let w = sp[(r1 + rr) * BK + kk];
            for (var c = 0u; c < NCK; c++) { (*acc)[c] += w * sc[rr * HD + cg + 8u * c]; }
        }
    }
}

@compute @workgroup_size(256)
fn attn_dkv_tiles(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let k0 = wid.x * BK;
    let g = wid.y;
    let kend = step.pos + step.n_tokens;      // keys 0 .. kend - 1 get gradients; the grid covers n_ctx
    if (k0 >= kend) { return; }               // the whole workgroup
    let tr = li / 16u;
    let tc = li % 16u;
    let jlo = query_first(k0);
    let jhi = query_end(min(k0 + BK, kend) - 1u);
    var gk: array<f32, NCK>;
    var gv: array<f32, NCK>;
    for (var hg = 0u; hg < P.group; hg++) {
        let h = q_head(g, hg);
        for (var j0 = jlo; j0 < jhi; j0 += BQ) {
            workgroupBarrier();               // the tile before has read rs
            if (li < BQ) {
                let j = j0 + li;
                var st = vec4<f32>(0.0);
                if (j < step.n_tokens) { st = stats[j * P.n_head + h]; }
                rs[li] = st;
            }
            var s = array<array<f32, NB>, 4>();  // initialised (naga: attn_dq_tiles says why)
            var dp = array<array<f32, NB>, 4>();
            tile_products(li, j0, h, k0, g, kend, true, &s, &dp);     // its barriers also publish rs
            var ds = array<array<f32, NB>, 4>();
            for (var a = 0u; a < 4u; a++) {
                for (var b = 0u; b < NB; b++) {
                    let r = tr + 16u * a;
                    let pd = tile_p_ds(j0 + r, k0 + tc + 16u * b, s[a][b], dp[a][b], rs[r]);
                    sp[r * BK + tc + 16u * b] = pd.x;
                    ds[a][b] = pd.y;
                }
            }
            rows_product(li, j0, h, true, &gv);       // dV += P^T dO
            workgroupBarrier();                        // P read
            for (var a = 0u; a < 4u; a++) {
                for (var b = 0u; b < NB; b++) { sp[(tr + 16u * a) * BK + tc + 16u * b] = ds[a][b]; }
            }
            rows_product(li, j0, h, false, &gk);      // dK += dS^T Q
        }
    }
    let key = k0 + li / 8u;
    if (key < kend) {
        let cg = li % 8u;
        let ko = P.dk_off + key * P.dk_stride + g * HD;
        let vo = P.dv_off + key * P.dv_stride + g * HD;
        for (var c = 0u; c < NCK; c++) {
            dk[ko + cg + 8u * c] = gk[c] * P.scale;
            {{DV}}[vo + cg + 8u * c] = gv[c];
        }
    }
}
