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
