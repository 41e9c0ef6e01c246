// Causal multi-head attention over the KV cache (f32 or f16 values, computed in f32), with GQA, sliding window,
// logit soft-cap and an optional probe.
// Resources (binding numbers are the builder's: each entry binds the ones it uses as 0, 1, .. in its list's order,
// lab/ops/attention.py ENTRY_RESOURCES; the others get numbers no layout asks for):
//           q_src   (storage, read)       f32 [t, q_stride]; head h of token j at j*q_stride + q_offset + h*HD
//           k_cache (storage, read)       [n_ctx, n_kv_head*HD] values, row = position, read 4 at a time (load_k):
//                                         f32 (KV32) or f16 two to a u32 word (KV16, wgsl/kv.wgsl's layout, widened
//                                         by unpack2x16float: core WGSL, no shader-f16)
//           v_cache (storage, read)       [n_ctx, n_kv_head*HD] values, the same (load_v)
//           out     (storage, read_write) f32 [t, n_head*HD] (written as vec4)
//           step    (uniform Step)        pos (position of the step's first token), n_tokens (= t)
//           params  (uniform Params)      q_stride, q_offset (floats), n_head, n_ctx (cache rows), window W (0 = off),
//                                         scale, softcap c (0 = off), chunk (the plan's keys per split workgroup
//                                         at n_ctx keys: not read here), n_chunks = ceil(n_ctx / chunk), the split's
//                                         workgroups per (head block, token)
//           scratch (storage, read_write) vec4 [t, n_head, 1 + n_chunks * (1 + HD/4)]: decode's per-chunk partials
//                                         (see s_row below)
//           probe   (storage, read_write) f32 [t, n_head, n_ctx]: P of (token j, head h) at (j*n_head + h)*n_ctx + k,
//                                         0 for masked keys; declared only in the PROBE variant
// Math: for token j at qpos = pos + j and head h with kv = h / GROUP:
//       s_k = capc(scale * q.k_k), capc(x) = c*tanh(x/c); P = softmax over visible k (k <= qpos, qpos - k < W); out = sum_k P_k v_k
// Entries: decode, split-K ("flash decoding") in two or three dispatches of one compute pass:
//            decode_split   — one workgroup per (chunk of the visible keys, HPW query heads of a KV head, token),
//                             grid (n_chunks, n_head/HPW, t): the step's visible keys cut into n_chunks chunks of
//                             whole tiles (q_chunk below), online softmax across tiles; each K and V row read once
//                             for the block's heads; writes the chunk's (max m, sum l, unnormalised V sum) per head
//                             to scratch. Chunks past the visible keys exit at once.
//            decode_combine — one workgroup per (head, token), grid (n_head, t): merges the chunks' records with the
//                             log-sum-exp rescaling into out (chunks spread over the threads); leaves (M, 1/L)
//                             per head for the probe pass.
//            decode_probs   — probe variant only, grid (ceil(n_ctx/WG), n_head/HPW, t): probabilities of every key.
//          decode_whole — one dispatch, grid (1, n_head/HPW, t): the split's walk over every visible key, the output
//                         normalised in place (short contexts; no probe variant).
//          prefill — one workgroup per block of BQ rows (row = token*GROUP + head in group) of one KV head, grid
//                    (ceil(t*GROUP/BQ), n_kv_head); K and V tiles of BK keys shared by the rows in workgroup memory.
//          prefill_rows — GPUs with subgroups, no probe: the same grid with WG / 4 rows a workgroup, four lanes a row
//                    (see its section).
// Both are correct for any t and pos (decode for t up to the token count its scratch was sized for); neither keeps
// more than one tile of keys in workgroup memory.

{{SG_ENABLE}}
//!include common.wgsl

struct Params {
    q_stride: u32, q_offset: u32, n_head: u32, n_ctx: u32,
    window: u32, scale: f32, softcap: f32, chunk: u32,
    n_chunks: u32, _p0: u32, _p1: u32, _p2: u32,
};

const HD: u32 = {{HEAD_DIM}}u;
const HD4: u32 = HD / 4u;
const GROUP: u32 = {{GROUP}}u;           // n_head / n_kv_head
const N_KV: u32 = {{N_KV_HEAD}}u;
const KVD4: u32 = N_KV * HD4;             // vec4s per cache row
const WG: u32 = {{WG}}u;                  // threads per workgroup (a power of two)
const TK: u32 = {{TK}}u;                  // decode: keys per tile
const HPW: u32 = {{HPW}}u;                // decode: query heads per workgroup (a divisor of GROUP)
const NP: u32 = {{NP}}u;                  // decode: key parts in the V sum (WG / HD4, at least 1)
const DPT: u32 = {{DPT}}u;                // decode: V slots per thread, ceil(HD4 * NP / WG)
const SLOTS: u32 = HD4 * NP;
const BQ: u32 = {{BQ}}u;                  // prefill: rows per workgroup
const BK: u32 = {{BK}}u;                  // prefill: keys per tile
const ACC: u32 = {{ACC}}u;                // prefill: vec4 accumulators per thread, ceil(BQ * HD4 / WG)
const PROBE: bool = {{PROBE}};
const RK: u32 = {{RK}}u;                  // prefill_rows: keys per tile
const NEG: f32 = -3.0e38;                 // "no score yet"; never fed to exp unshifted

@group(0) @binding({{B_Q_SRC}}) var<storage, read> q_src: array<f32>;
{{KV32}}@group(0) @binding({{B_K_CACHE}}) var<storage, read> k_cache: array<vec4<f32>>;
{{KV32}}@group(0) @binding({{B_V_CACHE}}) var<storage, read> v_cache: array<vec4<f32>>;
{{KV16}}@group(0) @binding({{B_K_CACHE}}) var<storage, read> k_cache: array<vec2<u32>>;
{{KV16}}@group(0) @binding({{B_V_CACHE}}) var<storage, read> v_cache: array<vec2<u32>>;
@group(0) @binding({{B_OUT}}) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding({{B_STEP}}) var<uniform> step: Step;
@group(0) @binding({{B_PARAMS}}) var<uniform> P: Params;
@group(0) @binding({{B_SCRATCH}}) var<storage, read_write> scratch: array<vec4<f32>>;
{{PROBE_OFF}}@group(0) @binding({{B_PROBE}}) var<storage, read_write> probe: array<f32>;

// Values 4i .. 4i + 3 of a cache (i in vec4s of values, as KVD4 counts them).
{{KV32}}fn load_k(i: u32) -> vec4<f32> { return k_cache[i]; }
{{KV32}}fn load_v(i: u32) -> vec4<f32> { return v_cache[i]; }
{{KV16}}fn load_k(i: u32) -> vec4<f32> {
{{KV16}}    let w = k_cache[i];
{{KV16}}    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
{{KV16}}}
{{KV16}}fn load_v(i: u32) -> vec4<f32> {
{{KV16}}    let w = v_cache[i];
{{KV16}}    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
{{KV16}}}

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

// ================================ decode (split-K) ================================
// Shared by the three decode entries: the Q of the block's HPW heads, and their scores for one key.
var<workgroup> d_q: array<vec4<f32>, HPW * HD4>;   // head hh of the block at hh*HD4
var<workgroup> d_s: array<f32, HPW * TK>;          // scores, then probabilities, of one tile: head hh at hh*TK
var<workgroup> d_red: array<f32, HPW * WG>;        // one reduction lane per head
var<workgroup> d_acc: array<vec4<f32>, HPW * SLOTS>;

// Head block y of a decode grid: query heads h0 .. h0 + HPW - 1 with h0 = y * HPW, all of KV head kv_head(h0)
// (HPW divides GROUP).
fn d_load_q(lid: u32, j: u32, h0: u32) {
    for (var i = lid; i < HPW * HD4; i += WG) { d_q[i] = load_q(j, h0 + i / HD4, i % HD4); }
}

// Scores of the block's heads for the key whose K row starts at vec4 kb: one pass over the row serves all heads.
fn d_scores(kb: u32) -> array<f32, HPW> {
    var d: array<f32, HPW>;
    for (var e = 0u; e < HD4; e++) {
        let k = load_k(kb + e);
        for (var hh = 0u; hh < HPW; hh++) { d[hh] += dot(d_q[hh * HD4 + e], k); }
    }
    for (var hh = 0u; hh < HPW; hh++) { d[hh] = logit(d[hh]); }
    return d;
}

// Max (or sum) over the workgroup of each head's lane; every invocation must call it (barriers).
fn d_reduce(lid: u32, v: array<f32, HPW>, is_max: bool) -> array<f32, HPW> {
    for (var hh = 0u; hh < HPW; hh++) { d_red[hh * WG + lid] = v[hh]; }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var hh = 0u; hh < HPW; hh++) {
                let a = d_red[hh * WG + lid];
                let b = d_red[hh * WG + lid + s];
                d_red[hh * WG + lid] = select(a + b, max(a, b), is_max);
            }
        }
        workgroupBarrier();
    }
    var r: array<f32, HPW>;
    for (var hh = 0u; hh < HPW; hh++) { r[hh] = d_red[hh * WG]; }
    workgroupBarrier();
    return r;
}

// Scratch, per (token j, head h): a row of 1 + n_chunks * (1 + HD4) vec4s: the stats vec4 (M, 1/L) the combine
// leaves for the probe pass, then per chunk c the record (m_c, l_c) and the HD4 vec4s of sum_k e^(s_k - m_c) v_k.
fn s_row(j: u32, h: u32) -> u32 { return (j * P.n_head + h) * (1u + P.n_chunks * (HD4 + 1u)); }
fn s_rec(j: u32, h: u32, c: u32) -> u32 { return s_row(j, h) + 1u + c * (HD4 + 1u); }

// The keys visible from qpos, [key_begin, key_hi), cut into chunks of q_chunk keys counted from key_begin: the
// fewest tiles of TK that make at most n_chunks chunks, so that every step spreads its keys over the grid's
// workgroups whatever the cache's size (a chunk fixed by n_ctx left 2,048 keys of a 32,768-key cache to 4 of 64
// workgroups: Qwen2.5's decode 272 tok/s there against 598 with a 2,176-key cache, H200). Chunks 0 .. n_used - 1
// each hold at least one visible key.
fn key_hi(qpos: u32) -> u32 { return min(key_end(qpos), P.n_ctx); }
fn q_chunk(qpos: u32) -> u32 {
    let tiles = (key_hi(qpos) - key_begin(qpos) + TK - 1u) / TK;
    return TK * max(1u, (tiles + P.n_chunks - 1u) / P.n_chunks);
}
fn n_used(qpos: u32) -> u32 {
    let ch = q_chunk(qpos);
    return (key_hi(qpos) - key_begin(qpos) + ch - 1u) / ch;
}

// Keys [lo, hi) of token j for the HPW heads from h0, in tiles of TK, online softmax across tiles, V accumulated
// by (vec4 of dims, key part) slots for all HPW heads at once. Leaves each head's unnormalised V sum in d_acc
// (head hh's slot s at hh * SLOTS + s; the NP parts of dims d4 at p * HD4 + d4) and returns its (max m, sum l).
// Every invocation of the workgroup must call it (barriers): lo, hi, j, h0 workgroup-uniform, lo < hi.
fn d_attend(lid: u32, j: u32, h0: u32, lo: u32, hi: u32) -> array<vec2<f32>, HPW> {
    let kb0 = kv_head(h0) * HD4;
    d_load_q(lid, j, h0);
    workgroupBarrier();

    var m: array<f32, HPW>;
    var l: array<f32, HPW>;
    for (var hh = 0u; hh < HPW; hh++) { m[hh] = NEG; }
    var acc: array<vec4<f32>, DPT * HPW>;      // slot a of head hh at a*HPW + hh
    for (var t0 = lo; t0 < hi; t0 += TK) {
        let n = min(TK, hi - t0);
        var tmax: array<f32, HPW>;
        for (var hh = 0u; hh < HPW; hh++) { tmax[hh] = NEG; }
        for (var i = lid; i < n; i += WG) {
            let s = d_scores((t0 + i) * KVD4 + kb0);
            for (var hh = 0u; hh < HPW; hh++) {
                d_s[hh * TK + i] = s[hh];
                tmax[hh] = max(tmax[hh], s[hh]);
            }
        }
        let bmax = d_reduce(lid, tmax, true);
        var m_new: array<f32, HPW>;
        for (var hh = 0u; hh < HPW; hh++) { m_new[hh] = running_max(m[hh], bmax[hh]); }
        var tsum: array<f32, HPW>;                 // zeroed by hand: some compilers zero a loop's var only once
        for (var hh = 0u; hh < HPW; hh++) { tsum[hh] = 0.0; }
        for (var i = lid; i < n; i += WG) {
            for (var hh = 0u; hh < HPW; hh++) {
                let p = exp(d_s[hh * TK + i] - m_new[hh]);
                d_s[hh * TK + i] = p;
                tsum[hh] += p;
            }
        }
        let total = d_reduce(lid, tsum, false);    // its barriers also publish d_s
        var alpha: array<f32, HPW>;
        for (var hh = 0u; hh < HPW; hh++) {
            alpha[hh] = exp(m[hh] - m_new[hh]);
            l[hh] = l[hh] * alpha[hh] + total[hh];
            m[hh] = m_new[hh];
        }
        // V: slot = part * HD4 + d4 sums keys part, part + NP, ... of the tile for dims 4*d4 .. 4*d4+3; each V
        // vec4 read serves the HPW heads
        for (var a = 0u; a < DPT; a++) {
            let slot = lid + a * WG;
            if (slot < SLOTS) {
                let d4 = slot % HD4;
                for (var hh = 0u; hh < HPW; hh++) { acc[a * HPW + hh] *= alpha[hh]; }
                for (var i = slot / HD4; i < n; i += NP) {
                    let v = load_v((t0 + i) * KVD4 + kb0 + d4);
                    for (var hh = 0u; hh < HPW; hh++) { acc[a * HPW + hh] += d_s[hh * TK + i] * v; }
                }
            }
        }
        workgroupBarrier();                        // d_s is rewritten by the next tile
    }

    for (var a = 0u; a < DPT; a++) {
        let slot = lid + a * WG;
        if (slot < SLOTS) {
            for (var hh = 0u; hh < HPW; hh++) { d_acc[hh * SLOTS + slot] = acc[a * HPW + hh]; }
        }
    }
    workgroupBarrier();
    var ml: array<vec2<f32>, HPW>;
    for (var hh = 0u; hh < HPW; hh++) { ml[hh] = vec2<f32>(m[hh], l[hh]); }
    return ml;
}

// Head hh's V sum over the key parts, dims 4*d4 .. 4*d4+3 (after d_attend).
fn d_vsum(hh: u32, d4: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var p = 0u; p < NP; p++) { v += d_acc[hh * SLOTS + p * HD4 + d4]; }
    return v;
}

// Pass 1: one workgroup per (chunk c, head block, token): the visible keys' chunk c (q_chunk).
@compute @workgroup_size(WG)
fn decode_split(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let c = wid.x;
    let j = wid.z;
    if (j >= step.n_tokens) { return; }
    let qpos = step.pos + j;
    let ch = q_chunk(qpos);
    let lo = key_begin(qpos) + c * ch;
    let hi = min(key_hi(qpos), lo + ch);
    if (lo >= hi) { return; }                  // a chunk past the visible keys: workgroup-uniform
    let h0 = wid.y * HPW;
    let ml = d_attend(lid, j, h0, lo, hi);
    for (var i = lid; i < HPW * HD4; i += WG) {
        scratch[s_rec(j, h0 + i / HD4, c) + 1u + i % HD4] = d_vsum(i / HD4, i % HD4);
    }
    if (lid < HPW) { scratch[s_rec(j, h0 + lid, c)] = vec4<f32>(ml[lid], 0.0, 0.0); }
}

// Decode in one dispatch, for short contexts: one workgroup per (head block, token) walks every visible key and
// writes the normalised output; no scratch, no combine. The engine runs it while a step's keys are few (its
// serial walk over tiles loses to the split past a few tiles on a GPU) and always on a CPU adapter, where the
// split already has one chunk (lab/engine/engine.py whole_keys).
@compute @workgroup_size(WG)
fn decode_whole(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let j = wid.z;
    if (j >= step.n_tokens) { return; }
    let qpos = step.pos + j;
    let h0 = wid.y * HPW;
    let ml = d_attend(lid, j, h0, key_begin(qpos), key_hi(qpos));
    for (var i = lid; i < HPW * HD4; i += WG) {
        let hh = i / HD4;
        out[j * P.n_head * HD4 + (h0 + hh) * HD4 + i % HD4] = d_vsum(hh, i % HD4) / ml[hh].y;
    }
}

// Pass 2: one workgroup per (head, token) merges the chunks' records: M = max m_c, L = sum l_c e^(m_c - M),
// out = sum acc_c e^(m_c - M) / L. The chunks are spread over the threads (a serial walk over 64 chunks
// made this pass 18 us a layer at 2,048 keys on an H200): M and L by workgroup reductions, the V sums by
// CL chunk lanes of HD4 threads each, added up in workgroup memory.
const CL: u32 = max(WG / HD4, 1u);
var<workgroup> c_red: array<f32, WG>;
var<workgroup> c_acc: array<vec4<f32>, WG>;

fn c_reduce(v: f32, lid: u32, is_max: bool) -> f32 {
    c_red[lid] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            if (is_max) { c_red[lid] = running_max(c_red[lid], c_red[lid + k]); }
            else { c_red[lid] += c_red[lid + k]; }
        }
        workgroupBarrier();
    }
    let r = c_red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn decode_combine(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let j = wid.y;
    if (j >= step.n_tokens || h >= P.n_head) { return; }
    let qpos = step.pos + j;
    let c0 = 0u;
    let c1 = n_used(qpos);
    var m = NEG;
    for (var c = c0 + lid; c < c1; c += WG) { m = running_max(m, scratch[s_rec(j, h, c)].x); }
    let mx = c_reduce(m, lid, true);
    var l = 0.0;
    for (var c = c0 + lid; c < c1; c += WG) {
        let r = scratch[s_rec(j, h, c)];
        l += r.y * exp(r.x - mx);
    }
    let inv = 1.0 / c_reduce(l, lid, false);
    let ob = j * P.n_head * HD4 + h * HD4;
    let lane = lid / HD4;          // 0 for every thread when WG <= HD4
    for (var d4 = lid % HD4; d4 < HD4; d4 += WG) {
        var v = vec4<f32>(0.0);
        for (var c = c0 + lane; c < c1; c += CL) {
            let rc = s_rec(j, h, c);
            v += scratch[rc + 1u + d4] * exp(scratch[rc].x - mx);
        }
        if (CL == 1u) { out[ob + d4] = v * inv; } else { c_acc[lid] = v; }
    }
    if (CL > 1u) {
        workgroupBarrier();
        if (lid < HD4) {
            var v = c_acc[lid];
            for (var k = 1u; k < CL; k++) { v += c_acc[k * HD4 + lid]; }
            out[ob + lid] = v * inv;
        }
    }
    if (lid == 0u) { scratch[s_row(j, h)] = vec4<f32>(mx, inv, 0.0, 0.0); }
}

// Pass 3, compiled only with a probe: one workgroup per (WG keys, head block, token) writes the probabilities
// exp(s_k - M) / L of every cache row (0 where masked), from the stats the combine left.
@compute @workgroup_size(WG)
fn decode_probs(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let j = wid.z;
    if (j >= step.n_tokens) { return; }
    let h0 = wid.y * HPW;
    d_load_q(lid, j, h0);
    workgroupBarrier();
    let k = wid.x * WG + lid;
    if (k >= P.n_ctx) { return; }
    let qpos = step.pos + j;
    let seen = visible(qpos, k);
    var s: array<f32, HPW>;
    if (seen) { s = d_scores(k * KVD4 + kv_head(h0) * HD4); }
    for (var hh = 0u; hh < HPW; hh++) {
        let h = h0 + hh;
        let st = scratch[s_row(j, h)];
        var p = 0.0;
        if (seen) { p = exp(s[hh] - st.x) * st.y; }
        probe_store((j * P.n_head + h) * P.n_ctx + k, p);
    }
}

// ================================ prefill ================================
// Per tile of BK keys, two barriers: the K and V tiles land together; each thread scores (row, key) pairs; then
// each thread, for each of its output slots (row rr, dims d4), takes its row's tile max and probabilities itself
// from the scores (the HD4 threads of a row do the same BK exps: cheaper than a softmax phase run by BQ threads
// while the rest wait, and than its two barriers) and folds the tile into its accumulator. A slot's running max
// and sum are the thread's own; the probe variant leaves them in p_m / p_l for its pass.
// Element i (key i / HD4, vec4 i % HD4 of KV head kb0 / HD4) of a prefill tile of n keys from t0; zeros past n.
struct KvPair { k: vec4<f32>, v: vec4<f32> };
fn tile_kv(t0: u32, n: u32, kb0: u32, i: u32) -> KvPair {
    if (i / HD4 >= n) { return KvPair(vec4<f32>(0.0), vec4<f32>(0.0)); }
    let at = (t0 + i / HD4) * KVD4 + kb0 + i % HD4;
    return KvPair(load_k(at), load_v(at));
}

var<workgroup> p_q: array<vec4<f32>, BQ * HD4>;
var<workgroup> p_k: array<vec4<f32>, BK * HD4>;
var<workgroup> p_v: array<vec4<f32>, BK * HD4>;
var<workgroup> p_s: array<f32, BQ * BK>;           // the tile's scores (NEG where masked)
var<workgroup> p_m: array<f32, BQ>;                // probe variant: each row's final max and sum
var<workgroup> p_l: array<f32, BQ>;

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
    var acc: array<vec4<f32>, ACC>;
    var m: array<f32, ACC>;
    var l: array<f32, ACC>;
    for (var a = 0u; a < ACC; a++) { m[a] = NEG; l[a] = 0.0; }
    workgroupBarrier();

    for (var t0 = lo; t0 < hi; t0 += BK) {
        let n = min(BK, hi - t0);
        for (var i = lid; i < BK * HD4; i += WG) {
            let e = tile_kv(t0, n, kb0, i);
            p_k[i] = e.k;
            p_v[i] = e.v;
        }
        workgroupBarrier();
        for (var i = lid; i < BQ * BK; i += WG) {
            let rr = i / BK;
            let kk = i % BK;
            let r = r0 + rr;
            var s = NEG;
            if (r < rows && kk < n && visible(step.pos + r / GROUP, t0 + kk)) {
                var d = 0.0;
                for (var e = 0u; e < HD4; e++) { d += dot(p_q[rr * HD4 + e], p_k[kk * HD4 + e]); }
                s = logit(d);
            }
            p_s[i] = s;
        }
        workgroupBarrier();
        for (var a = 0u; a < ACC; a++) {
            let o = lid + a * WG;
            if (o < BQ * HD4) {
                let rr = o / HD4;
                let d4 = o % HD4;
                var tmax = NEG;
                for (var kk = 0u; kk < n; kk++) { tmax = max(tmax, p_s[rr * BK + kk]); }
                let m_new = running_max(m[a], tmax);
                let alpha = exp(m[a] - m_new);     // 0 on the row's first visible tile, 1 while it sees none
                var v = acc[a] * alpha;
                var sum = 0.0;
                // Masked scores are NEG: exp gives 0 once the row has seen a key, and what a tile before that
                // summed (exp(0) = 1 each) is wiped by the first visible tile's alpha = 0.
                for (var kk = 0u; kk < n; kk++) {
                    let pk = exp(p_s[rr * BK + kk] - m_new);
                    sum += pk;
                    v += pk * p_v[kk * HD4 + d4];
                }
                acc[a] = v;
                l[a] = l[a] * alpha + sum;
                m[a] = m_new;
            }
        }
        workgroupBarrier();                    // p_k, p_v and p_s are rewritten by the next tile
    }

    for (var a = 0u; a < ACC; a++) {
        let o = lid + a * WG;
        let r = r0 + o / HD4;
        if (o < BQ * HD4 && r < rows) {
            let h = q_head(kvh, r % GROUP);
            out[(r / GROUP) * P.n_head * HD4 + h * HD4 + o % HD4] = acc[a] / l[a];
        }
        if (PROBE && o < BQ * HD4 && o % HD4 == 0u) { p_m[o / HD4] = m[a]; p_l[o / HD4] = l[a]; }
    }
    if (PROBE) { workgroupBarrier(); }
    if (PROBE) {
        for (var rr = 0u; rr < BQ; rr++) {
            let r = r0 + rr;
            if (r < rows) {
                let j = r / GROUP;
                let h = q_head(kvh, r % GROUP);
                let qpos = step.pos + j;
                let mr = p_m[rr];
                let inv = 1.0 / p_l[rr];
                let row = (j * P.n_head + h) * P.n_ctx;
                for (var k = lid; k < P.n_ctx; k += WG) {
                    var p = 0.0;
                    if (visible(qpos, k)) {
                        var d = 0.0;
                        for (var e = 0u; e < HD4; e++) {
                            d += dot(p_q[rr * HD4 + e], load_k(k * KVD4 + kb0 + e));
                        }
                        p = exp(logit(d) - mr) * inv;
                    }
                    probe_store(row + k, p);
                }
            }
        }
    }
}

// ================================ prefill_rows ================================
// Four lanes own a row: lane i holds its query's vec4s i, i + 4, .. (so the four read 64 contiguous bytes of a K or V
// row, no bank twice), scores its part of each key, and two subgroup shuffles give all four the whole dot product
// (rows start at multiples of 4 invocations, inside one subgroup: WebGPU's subgroups are at least 4 wide). Then each
// lane keeps the row's softmax itself: the tile's RK scores in registers, one max, one rescale of its accumulators a
// tile, and no barrier but the two around the tile's K and V. prefill, above, spends three barriers a tile of 16
// keys and scores one (row, key) pair a thread from workgroup memory: 163 us a layer for SmolLM2's 512-token step on
// the H200.
const RL: u32 = max(HD4 / 4u, 1u);       // vec4s of the row a lane holds (head_dim % 16 == 0 when it runs; the
                                          // max keeps the module valid for the head sizes that never run it)
var<workgroup> r_k: array<vec4<f32>, RK * HD4>;
var<workgroup> r_v: array<vec4<f32>, RK * HD4>;

fn row_sum(v: f32) -> f32 {
{{SG}}    let a = v + subgroupShuffleXor(v, 1u);
{{SG}}    return a + subgroupShuffleXor(a, 2u);
{{NOSG}}    return v;     // never chosen without subgroups (lab/ops/attention.py)
}

@compute @workgroup_size(WG)
fn prefill_rows(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let kvh = wid.y;
    let rows = step.n_tokens * GROUP;
    let r0 = wid.x * (WG / 4u);
    if (r0 >= rows || kvh >= N_KV) { return; }
    let r_last = min(r0 + WG / 4u, rows) - 1u;
    let lo = key_begin(step.pos + r0 / GROUP);
    let hi = min(key_end(step.pos + r_last / GROUP), P.n_ctx);
    let kb0 = kvh * HD4;
    let lane = lid % 4u;
    let r = r0 + lid / 4u;
    let real = r < rows;                      // rows past the step compute on zeros and store nothing
    let rc = min(r, rows - 1u);
    let qpos = step.pos + rc / GROUP;
    let h = q_head(kvh, rc % GROUP);

    var q: array<vec4<f32>, RL>;
    var acc: array<vec4<f32>, RL>;
    for (var e = 0u; e < RL; e++) {
        q[e] = select(vec4<f32>(0.0), load_q(rc / GROUP, h, 4u * e + lane), real);
        acc[e] = vec4<f32>(0.0);
    }
    var m = NEG;
    var l = 0.0;

    for (var t0 = lo; t0 < hi; t0 += RK) {
        let n = min(RK, hi - t0);
        for (var i = lid; i < RK * HD4; i += WG) {
            let e = tile_kv(t0, n, kb0, i);
            r_k[i] = e.k;
            r_v[i] = e.v;
        }
        workgroupBarrier();
        var s: array<f32, RK>;
        var tmax = NEG;
        for (var kk = 0u; kk < n; kk++) {
            var d = 0.0;
            for (var e = 0u; e < RL; e++) { d += dot(q[e], r_k[kk * HD4 + 4u * e + lane]); }
            d = row_sum(d);
            s[kk] = select(NEG, logit(d), visible(qpos, t0 + kk));
            tmax = max(tmax, s[kk]);
        }
        let m_new = running_max(m, tmax);
        let alpha = exp(m - m_new);           // 0 on the row's first visible tile, 1 while it sees none
        l *= alpha;
        for (var e = 0u; e < RL; e++) { acc[e] *= alpha; }
        // Masked scores are NEG: exp gives 0 once the row has seen a key, and what a tile before that summed is
        // wiped by the first visible tile's alpha = 0 (as in prefill).
        for (var kk = 0u; kk < n; kk++) {
            let pk = exp(s[kk] - m_new);
            l += pk;
            for (var e = 0u; e < RL; e++) { acc[e] += pk * r_v[kk * HD4 + 4u * e + lane]; }
        }
        m = m_new;
        workgroupBarrier();                   // r_k and r_v are rewritten by the next tile
    }

    if (real) {
        let o = (rc / GROUP) * P.n_head * HD4 + h * HD4;
        for (var e = 0u; e < RL; e++) { out[o + 4u * e + lane] = acc[e] / l; }
    }
}
