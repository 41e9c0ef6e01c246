// Causal multi-head attention over the f32 KV cache, with GQA, sliding window, logit soft-cap and an optional probe.
// Bindings: 0 q_src   (storage, read)       f32 [t, q_stride]; head h of token j at j*q_stride + q_offset + h*HD
//           1 k_cache (storage, read)       f32 [n_ctx, n_kv_head*HD] (read as vec4), row = position
//           2 v_cache (storage, read)       f32 [n_ctx, n_kv_head*HD] (read as vec4)
//           3 out     (storage, read_write) f32 [t, n_head*HD] (written as vec4)
//           4 step    (uniform Step)        pos (position of the step's first token), n_tokens (= t)
//           5 params  (uniform Params)      q_stride, q_offset (floats), n_head, n_ctx (cache rows), window W (0 = off),
//                                           scale, softcap c (0 = off)
//           6 probe   (storage, read_write) f32 [t, n_head, n_ctx]: P of (token j, head h) at (j*n_head + h)*n_ctx + k,
//                                           0 for masked keys; bound only in the PROBE variant
// Math: for token j at qpos = pos + j and head h with kv = h / GROUP:
//       s_k = capc(scale * q.k_k), capc(x) = c*tanh(x/c); P = softmax over visible k (k <= qpos, qpos - k < W); out = sum_k P_k v_k
// Entries: decode  — one workgroup of WG per (head, token), grid (n_head, t); keys split across the threads in tiles of TK,
//                    online softmax across tiles; V accumulated by (vec4 of dims, key part) slots.
//          prefill — one workgroup per block of BQ rows (row = token*GROUP + head in group) of one KV head, grid
//                    (ceil(t*GROUP/BQ), n_kv_head); K and V tiles of BK keys shared by the rows in workgroup memory.
// Both are correct for any t and pos; neither keeps more than one tile of keys in workgroup memory.

struct Step { pos: u32, n_tokens: u32, n_ctx: u32, _pad: u32 };
struct Params {
    q_stride: u32, q_offset: u32, n_head: u32, n_ctx: u32,
    window: u32, scale: f32, softcap: f32, _p0: u32,
};

const HD: u32 = {{HEAD_DIM}}u;
const HD4: u32 = HD / 4u;
const GROUP: u32 = {{GROUP}}u;           // n_head / n_kv_head
const N_KV: u32 = {{N_KV_HEAD}}u;
const KVD4: u32 = N_KV * HD4;             // vec4s per cache row
const WG: u32 = {{WG}}u;                  // threads per workgroup (a power of two)
const TK: u32 = {{TK}}u;                  // decode: keys per tile
const NP: u32 = {{NP}}u;                  // decode: key parts in the V sum (WG / HD4, at least 1)
const DPT: u32 = {{DPT}}u;                // decode: V slots per thread, ceil(HD4 * NP / WG)
const SLOTS: u32 = HD4 * NP;
const BQ: u32 = {{BQ}}u;                  // prefill: rows per workgroup
const BK: u32 = {{BK}}u;                  // prefill: keys per tile
const ACC: u32 = {{ACC}}u;                // prefill: vec4 accumulators per thread, ceil(BQ * HD4 / WG)
const PROBE: bool = {{PROBE}};
const NEG: f32 = -3.0e38;                 // "no score yet"; never fed to exp unshifted

@group(0) @binding(0) var<storage, read> q_src: array<f32>;
@group(0) @binding(1) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> step: Step;
@group(0) @binding(5) var<uniform> P: Params;
{{PROBE_OFF}}@group(0) @binding(6) var<storage, read_write> probe: array<f32>;

fn probe_store(i: u32, v: f32) {
{{PROBE_OFF}}    probe[i] = v;
}

// ---- the mask, in one place: key k is visible from query position qpos iff key_begin(qpos) <= k < key_end(qpos).
// Causal: k <= qpos.
fn key_end(qpos: u32) -> u32 { return qpos + 1u; }
// Sliding window as llama.cpp (LLAMA_SWA_TYPE_STANDARD: masked iff p_query - p_key >= n_swa): visible iff qpos - k < W,
// i.e. k >= qpos + 1 - W; the window holds W keys, the query's own included.
fn key_begin(qpos: u32) -> u32 {
    if (P.window > 0u && qpos + 1u > P.window) { return qpos + 1u - P.window; }
    return 0u;
}
fn visible(qpos: u32, k: u32) -> bool { return k >= key_begin(qpos) && k < key_end(qpos); }

// GQA: query head h reads KV head h / GROUP (consecutive query heads share a KV head), and back.
fn kv_head(h: u32) -> u32 { return h / GROUP; }
fn q_head(kvh: u32, hg: u32) -> u32 { return kvh * GROUP + hg; }

// The running maximum subtracted before exp (online softmax).
fn running_max(m_old: f32, tile_max: f32) -> f32 { return max(m_old, tile_max); }

// Score from a dot product: scale, then the soft-cap (tanh's argument clamped: tanh(15) is 1 in f32, and some
// tanh implementations return NaN for huge arguments).
fn logit(d: f32) -> f32 {
    var s = d * P.scale;
    if (P.softcap > 0.0) { s = P.softcap * tanh(clamp(s / P.softcap, -15.0, 15.0)); }
    return s;
}

fn load_q(j: u32, h: u32, d4: u32) -> vec4<f32> {
    let b = j * P.q_stride + P.q_offset + h * HD + 4u * d4;
    return vec4<f32>(q_src[b], q_src[b + 1u], q_src[b + 2u], q_src[b + 3u]);
}

// ================================ decode ================================
var<workgroup> d_q: array<vec4<f32>, HD4>;
var<workgroup> d_s: array<f32, TK>;
var<workgroup> d_red: array<f32, WG>;
var<workgroup> d_acc: array<vec4<f32>, SLOTS>;

fn d_dot(kb: u32) -> f32 {
    var acc = 0.0;
    for (var e = 0u; e < HD4; e++) { acc += dot(d_q[e], k_cache[kb + e]); }
    return acc;
}

fn d_max(lid: u32, v: f32) -> f32 {
    d_red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { d_red[lid] = max(d_red[lid], d_red[lid + s]); }
        workgroupBarrier();
    }
    let r = d_red[0];
    workgroupBarrier();
    return r;
}

fn d_sum(lid: u32, v: f32) -> f32 {
    d_red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { d_red[lid] = d_red[lid] + d_red[lid + s]; }
        workgroupBarrier();
    }
    let r = d_red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn decode(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let j = wid.y;
    if (j >= step.n_tokens || h >= P.n_head) { return; }
    let qpos = step.pos + j;
    let kb0 = kv_head(h) * HD4;
    for (var i = lid; i < HD4; i += WG) { d_q[i] = load_q(j, h, i); }
    workgroupBarrier();

    let lo = key_begin(qpos);
    let hi = min(key_end(qpos), P.n_ctx);
    var acc: array<vec4<f32>, DPT>;
    var m = NEG;
    var l = 0.0;
    for (var t0 = lo; t0 < hi; t0 += TK) {
        let n = min(TK, hi - t0);
        // scores of this tile, one key per thread at a time
        var tmax = NEG;
        for (var i = lid; i < n; i += WG) {
            let s = logit(d_dot((t0 + i) * KVD4 + kb0));
            d_s[i] = s;
            tmax = max(tmax, s);
        }
        let m_new = running_max(m, d_max(lid, tmax));
        var tsum = 0.0;
        for (var i = lid; i < n; i += WG) {
            let p = exp(d_s[i] - m_new);
            d_s[i] = p;
            tsum += p;
        }
        let total = d_sum(lid, tsum);          // its barriers also publish d_s
        let alpha = exp(m - m_new);
        l = l * alpha + total;
        m = m_new;
        // V: slot = part * HD4 + d4 sums keys part, part + NP, ... of the tile for dims 4*d4 .. 4*d4+3
        for (var a = 0u; a < DPT; a++) {
            let slot = lid + a * WG;
            if (slot < SLOTS) {
                let d4 = slot % HD4;
                var v = acc[a] * alpha;
                for (var i = slot / HD4; i < n; i += NP) { v += d_s[i] * v_cache[(t0 + i) * KVD4 + kb0 + d4]; }
                acc[a] = v;
            }
        }
        workgroupBarrier();                    // d_s is rewritten by the next tile
    }

    for (var a = 0u; a < DPT; a++) {
        let slot = lid + a * WG;
        if (slot < SLOTS) { d_acc[slot] = acc[a]; }
    }
    workgroupBarrier();
    let inv = 1.0 / l;
    let ob = j * P.n_head * HD4 + h * HD4;
    for (var d4 = lid; d4 < HD4; d4 += WG) {
        var v = vec4<f32>(0.0);
        for (var p = 0u; p < NP; p++) { v += d_acc[p * HD4 + d4]; }
        out[ob + d4] = v * inv;
    }
    if (PROBE) {
        let row = (j * P.n_head + h) * P.n_ctx;
        for (var k = lid; k < P.n_ctx; k += WG) {
            var p = 0.0;
            if (visible(qpos, k)) { p = exp(logit(d_dot(k * KVD4 + kb0)) - m) * inv; }
            probe_store(row + k, p);
        }
    }
}

// ================================ prefill ================================
var<workgroup> p_q: array<vec4<f32>, BQ * HD4>;
var<workgroup> p_kv: array<vec4<f32>, BK * HD4>;   // the K tile, then the V tile
var<workgroup> p_s: array<f32, BQ * BK>;           // scores, then probabilities
var<workgroup> p_m: array<f32, BQ>;                // running max per row
var<workgroup> p_l: array<f32, BQ>;                // running sum per row
var<workgroup> p_a: array<f32, BQ>;                // this tile's rescale factor per row

@compute @workgroup_size(WG)
fn prefill(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let kvh = wid.y;
    let rows = step.n_tokens * GROUP;
    let r0 = wid.x * BQ;
    if (r0 >= rows || kvh >= N_KV) { return; }
    let r_last = min(r0 + BQ, rows) - 1u;
    let lo = key_begin(step.pos + r0 / GROUP);               // the block's earliest query sees furthest back
    let hi = min(key_end(step.pos + r_last / GROUP), P.n_ctx); // and its latest query furthest forward
    let kb0 = kvh * HD4;

    for (var i = lid; i < BQ * HD4; i += WG) {
        let r = r0 + i / HD4;
        var v = vec4<f32>(0.0);
        if (r < rows) { v = load_q(r / GROUP, q_head(kvh, r % GROUP), i % HD4); }
        p_q[i] = v;
    }
    for (var rr = lid; rr < BQ; rr += WG) { p_m[rr] = NEG; p_l[rr] = 0.0; }
    var acc: array<vec4<f32>, ACC>;
    workgroupBarrier();

    for (var t0 = lo; t0 < hi; t0 += BK) {
        let n = min(BK, hi - t0);
        for (var i = lid; i < BK * HD4; i += WG) {
            var v = vec4<f32>(0.0);
            if (i / HD4 < n) { v = k_cache[(t0 + i / HD4) * KVD4 + kb0 + i % HD4]; }
            p_kv[i] = v;
        }
        workgroupBarrier();
        for (var i = lid; i < BQ * BK; i += WG) {
            let rr = i / BK;
            let kk = i % BK;
            let r = r0 + rr;
            var s = NEG;
            if (r < rows && kk < n && visible(step.pos + r / GROUP, t0 + kk)) {
                var d = 0.0;
                for (var e = 0u; e < HD4; e++) { d += dot(p_q[rr * HD4 + e], p_kv[kk * HD4 + e]); }
                s = logit(d);
            }
            p_s[i] = s;
        }
        workgroupBarrier();
        // the K tile is spent: load V in its place, and update each row's softmax state
        for (var i = lid; i < BK * HD4; i += WG) {
            var v = vec4<f32>(0.0);
            if (i / HD4 < n) { v = v_cache[(t0 + i / HD4) * KVD4 + kb0 + i % HD4]; }
            p_kv[i] = v;
        }
        for (var rr = lid; rr < BQ; rr += WG) {
            let r = r0 + rr;
            let qpos = step.pos + r / GROUP;
            var tmax = NEG;
            for (var kk = 0u; kk < BK; kk++) { tmax = max(tmax, p_s[rr * BK + kk]); }
            let m_old = p_m[rr];
            let m_new = running_max(m_old, tmax);
            var sum = 0.0;
            for (var kk = 0u; kk < BK; kk++) {
                var p = 0.0;
                if (r < rows && kk < n && visible(qpos, t0 + kk)) { p = exp(p_s[rr * BK + kk] - m_new); }
                p_s[rr * BK + kk] = p;
                sum += p;
            }
            let alpha = exp(m_old - m_new);    // 0 on the row's first visible tile, 1 while it sees none
            p_a[rr] = alpha;
            p_l[rr] = p_l[rr] * alpha + sum;
            p_m[rr] = m_new;
        }
        workgroupBarrier();
        for (var a = 0u; a < ACC; a++) {
            let o = lid + a * WG;
            if (o < BQ * HD4) {
                let rr = o / HD4;
                let d4 = o % HD4;
                var v = acc[a] * p_a[rr];
                for (var kk = 0u; kk < n; kk++) { v += p_s[rr * BK + kk] * p_kv[kk * HD4 + d4]; }
                acc[a] = v;
            }
        }
        workgroupBarrier();                    // p_kv and p_s are rewritten by the next tile
    }

    for (var a = 0u; a < ACC; a++) {
        let o = lid + a * WG;
        let r = r0 + o / HD4;
        if (o < BQ * HD4 && r < rows) {
            let h = q_head(kvh, r % GROUP);
            out[(r / GROUP) * P.n_head * HD4 + h * HD4 + o % HD4] = acc[a] / p_l[o / HD4];
        }
    }
    if (PROBE) {
        for (var rr = 0u; rr < BQ; rr++) {
            let r = r0 + rr;
            if (r < rows) {
                let j = r / GROUP;
                let h = q_head(kvh, r % GROUP);
                let qpos = step.pos + j;
                let m = p_m[rr];
                let inv = 1.0 / p_l[rr];
                let row = (j * P.n_head + h) * P.n_ctx;
                for (var k = lid; k < P.n_ctx; k += WG) {
                    var p = 0.0;
                    if (visible(qpos, k)) {
                        var d = 0.0;
                        for (var e = 0u; e < HD4; e++) { d += dot(p_q[rr * HD4 + e], k_cache[k * KVD4 + kb0 + e]); }
                        p = exp(logit(d) - m) * inv;
                    }
                    probe_store(row + k, p);
                }
            }
        }
    }
}
