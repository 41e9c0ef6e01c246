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
// Entries and grids (1-D, {{WG}} invocations a workgroup, one invocation per row, no workgroup memory):
//   attn_stats  one per (j, h), ceil(t n_head / WG) groups: walks the row's visible keys once (online max and sum),
//               then D; writes stats. It recomputes what the forward knew (attention.wgsl keeps no statistics), one
//               more pass of q.k, cheaper than a t x keys probability matrix.
//   attn_dq     one per (j, h), the same grid: the row's keys in order, P and dS recomputed, dQ in HD private floats.
//   attn_dkv    one per (key, KV head), ceil(n_ctx n_kv / WG) groups (keys past pos + t exit): the queries that see
//               the key in order j = first .. last, the group's heads h = g group .. in order within each, dK and dV
//               in 2 HD private floats. Each sum over queries and heads runs in that fixed order in one invocation:
//               no float atomics (WGSL has none), no race, the same bits every run.
// The three passes recompute each score q.k with the same code (qk, score), so P is the same in each.
// Loops: an invocation of attn_stats or attn_dq runs ~(3 HD/4 + 1) iterations a visible key, attn_dkv ~(3 HD/4 + 1)
//   a (query, head) term: lavapipe stops an invocation's loops silently past 32,768 iterations (65,535 over nested
//   loops, tests/kernels/test_loop_budget.py), so the builder (lab.ops.backward_attention) refuses shapes past
//   32,767 on such an adapter (e.g. at HD 64: ~650 keys, ~650 / group query rows seeing one key).

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
const WG: u32 = {{WG}}u;
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

@compute @workgroup_size(WG)
fn attn_stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;                            // query row j * n_head + h
    if (r >= step.n_tokens * P.n_head) { return; }
    let j = r / P.n_head;
    let h = r % P.n_head;
    let qpos = step.pos + j;
    let qi = q_at(j, h);
    var m = NEG;
    var l = 0.0;
    for (var key = key_begin(qpos); key < key_end(qpos); key++) {
        let s = score(qk(qi, k_at(key, kv_head(h)))).x;
        if (s > m) {                          // a new max: rescale the sum so far
            l = l * exp(m - s) + 1.0;
            m = s;
        } else {
            l += exp(s - m);
        }
    }
    let oi = P.o_off + j * P.o_stride + h * HD;
    let di = do_at(j, h);
    var dd = 0.0;
    for (var c = 0u; c < HD4; c++) { dd += dot(load_do(di + 4u * c), load_o(oi + 4u * c)); }
    stats_out[r] = vec4<f32>(m, 1.0 / l, dd, 0.0);
}

@compute @workgroup_size(WG)
fn attn_dq(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= step.n_tokens * P.n_head) { return; }
    let j = r / P.n_head;
    let h = r % P.n_head;
    let qpos = step.pos + j;
    let st = stats[r];
    let qi = q_at(j, h);
    let di = do_at(j, h);
    var acc: array<vec4<f32>, HD4>;           // zero-initialised
    for (var key = key_begin(qpos); key < key_end(qpos); key++) {
        let ki = k_at(key, kv_head(h));
        let sd = score(qk(qi, ki));
        let p = prob(sd.x, st);
        let ds = p * (dov(di, v_at(key, kv_head(h))) - st.z) * sd.y;
        for (var c = 0u; c < HD4; c++) { acc[c] += ds * load_k(ki + 4u * c); }
    }
    let out = P.dq_off + j * P.dq_stride + h * HD;
    for (var c = 0u; c < HD4; c++) {
        let g = acc[c] * P.scale;
        dq[out + 4u * c] = g.x;
        dq[out + 4u * c + 1u] = g.y;
        dq[out + 4u * c + 2u] = g.z;
        dq[out + 4u * c + 3u] = g.w;
    }
}

// dK (unscaled) and dV of key `key` and KV head g, summed over the queries that see it and the group's heads in order.
fn dkv_sums(key: u32, g: u32, gk: ptr<function, array<vec4<f32>, HD4>>, gv: ptr<function, array<vec4<f32>, HD4>>) {
    let ki = k_at(key, g);
    let vi = v_at(key, g);
    for (var j = query_first(key); j < query_end(key); j++) {
        for (var hg = 0u; hg < P.group; hg++) {
            let h = q_head(g, hg);
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
}

@compute @workgroup_size(WG)
fn attn_dkv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;                            // key row key * n_kv_head + g
    if (r >= (step.pos + step.n_tokens) * P.n_kv_head) { return; }
    let key = r / P.n_kv_head;
    let g = r % P.n_kv_head;
    var gk: array<vec4<f32>, HD4>;
    var gv: array<vec4<f32>, HD4>;
    dkv_sums(key, g, &gk, &gv);
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
