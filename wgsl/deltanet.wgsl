// Qwen3.5's gated delta-net recurrence (llama.cpp src/models/qwen35.cpp build_layer_attn_linear: the L2 norms of q and
// k, the beta gate, the decay from A_log and dt_bias, ggml_gated_delta_net's delta-rule update as its CPU loop runs it,
// token by token, then build_norm_gated), for the step's t tokens in order, with the layer's state read and written
// in the same dispatch: one dispatch for a prefill chunk (a scan over its tokens) and for a decode token alike.
// Bindings: 0 proj (storage, read)      [t, proj_stride] the in-projection rows [q k v | z | beta | alpha]: z at
//             z_offset (n_v_heads x S), beta at beta_offset and alpha at alpha_offset (n_v_heads each)
//           1 conv (storage, read)      [t, 2K + n_v_heads S] silu(conv(q k v)) (lab.ops.shortconv, mode silu)
//           2 dt_bias (storage, read)   [n_v_heads] (GGUF ssm_dt.bias)
//           3 ssm_a (storage, read)     [n_v_heads] -exp(A_log), as the GGUF stores it (ssm_a)
//           4 norm_w (storage, read)    [S] the gated norm's weight, one for every head (ssm_norm.weight)
//           5 state (storage, read_write) [n_v_heads, S, S] state[(h S + r) S + c] = S_h[r][c] (r a key index, c a
//             value index; ggml keeps the transpose): read unless step.pos is 0, written after the step's last token
//           6 out (storage, read_write) [t, n_v_heads S] the gated norm of each head's output, ssm_out's input
//           7 p (uniform Params)        8 step (uniform Step)
// Math: for token j and value head h, key head hk = h % n_k_heads (ggml's broadcast), K = n_k_heads S:
//       q = l2(conv[j, hk S ..]), k = l2(conv[j, K + hk S ..]), v = conv[j, 2K + h S ..] (S floats each),
//       l2(x) = x / sqrt(sum x^2 + eps)
//       beta = sigmoid(proj[j, beta_offset + h]);  g = softplus(proj[j, alpha_offset + h] + dt_bias[h]) * ssm_a[h]
//       S_h <- exp(g) S_h;  d = beta (v - S_h^T k);  S_h <- S_h + k d^T;  o = S_h^T q / sqrt(S)
//       out[j, h S + c] = o[c] / sqrt(mean(o^2) + eps) * norm_w[c] * silu(proj[j, z_offset + h S + c])
//       (softplus as ggml's: x itself past 20; a step at position 0 starts from a zero state, whatever the buffer
//       holds). The kernel scales by the norms instead of norming q and k first: S_h^T k = (S_h^T k_raw) / |k|, the
//       update adds k_raw (d / |k|), o = (S_h^T q_raw) / |q|.
// Params { n_k_heads, n_v_heads, proj_stride, z_offset, beta_offset, alpha_offset: u32, eps: f32, _p0: u32 }
// Constants: S the head size (d_k = d_v, a multiple of 16); P the lanes a column, a power of two: lab.ops.deltanet
//       picks min(4, 256 / S) with subgroups, 1 without; SG / NOSG / SG_ENABLE from lab.gpu.shaders.subgroup_consts.
// Grid: (n_v_heads, 1, 1): one workgroup of S P threads a value head walks the step's tokens in order. Thread i works
//       on the state's column c = i / P, rows 4 (m P + i % P) + e (m < S / 4P, e < 4), S / P floats held in a private
//       array (the recurrence reads and writes nothing else of the state: it is read once and written once a step).
// Why the split: the recurrence is serial in the tokens and there is one workgroup a head (16 on a GPU of 132 SMs), so
//       the prefill is latency-bound: with P = 1, S threads each walked two loops of S multiply-adds a token (S^T k,
//       then the update and S^T q) behind three barriers. P lanes a column (S = 128: 256 threads, two lanes a column)
//       cut each loop to S / P, in vec4s (four independent sums, one workgroup read of four floats), and give the
//       SM twice the warps to hide latency with; the P partial sums of a column meet by subgroup shuffles (its lanes
//       are adjacent, and P <= 4 <= any subgroup). Without subgroups P is 1 and the same code is the unsplit form.
//       The rows are interleaved in vec4s (lane part reads qk's vec4 m P + part) so that a subgroup's lanes read
//       adjacent vec4s, not one bank. Per token there is now one barrier: thread i < S / 4 fetches vec4 i of the next
//       token's q and k (with v, z, beta, alpha for everyone) before the scan, stages it in the other half of the
//       double-buffered qk after it, and the one workgroup sum (subgroupAdd, one partial a subgroup; without
//       subgroups all WG partials) carries (this token's o^2, the next token's sum q^2, sum k^2): the gated norm's
//       mean and the next token's L2 norms, the same bits in every thread. Each of qk and red is written for token j
//       + 1 only after the barrier that ends token j's reads of it (parity: token j reads qk[j % 2], red[j % 2]; the
//       prologue stages token 0 in qk[0] and reduces through red[1]).
// The token loop is serial by nature (the state of token j feeds token j + 1); a chunked form (WY / UT transform,
// as llama.cpp's build_delta_net_chunking) trades it for matrix products, not tried here.
{{SG_ENABLE}}

//!include common.wgsl
//!include act.wgsl

struct Params { n_k_heads: u32, n_v_heads: u32, proj_stride: u32, z_offset: u32,
                beta_offset: u32, alpha_offset: u32, eps: f32, _p0: u32 };

const S: u32 = {{S}}u;
const P: u32 = {{P}}u;          // lanes a column
const WG: u32 = S * P;
const Q4: u32 = S / 4u;         // vec4s of a head's q, and of its k
const QK4: u32 = S / 2u;        // vec4s of q | k
const M: u32 = S / (4u * P);    // vec4s of a column's rows that one lane owns

@group(0) @binding(0) var<storage, read> proj: array<f32>;
@group(0) @binding(1) var<storage, read> conv: array<f32>;
@group(0) @binding(2) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(3) var<storage, read> ssm_a: array<f32>;
@group(0) @binding(4) var<storage, read> norm_w: array<f32>;
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;
@group(0) @binding(8) var<uniform> step: Step;

var<workgroup> qk: array<array<vec4<f32>, QK4>, 2>;   // a token's raw q | k, by token parity
var<workgroup> red: array<array<vec3<f32>, WG>, 2>;   // the reduction's partials, by token parity
var<private> sg_lane: u32;
var<private> sg_size: u32;

// What thread i reads of token j: v[c] and z[c] of its column, beta and alpha of its head, and for a loader (i < S/4)
// the i-th vec4 of the token's q and of its k with their squares' sums (zero for the others).
struct Tok { q: vec4<f32>, k: vec4<f32>, sq: vec2<f32>, v: f32, z: f32, beta: f32, alpha: f32 };

fn fetch(j: u32, i: u32, c: u32, h: u32, hk: u32) -> Tok {
    let K = p.n_k_heads * S;
    let row = j * (2u * K + p.n_v_heads * S);
    let pr = j * p.proj_stride;
    var t: Tok;
    if (i < Q4) {
        let a = row + hk * S + 4u * i;
        let b = a + K;
        t.q = vec4<f32>(conv[a], conv[a + 1u], conv[a + 2u], conv[a + 3u]);
        t.k = vec4<f32>(conv[b], conv[b + 1u], conv[b + 2u], conv[b + 3u]);
        t.sq = vec2<f32>(dot(t.q, t.q), dot(t.k, t.k));
    }
    t.v = conv[row + 2u * K + h * S + c];
    t.z = proj[pr + p.z_offset + h * S + c];
    t.beta = proj[pr + p.beta_offset + h];
    t.alpha = proj[pr + p.alpha_offset + h];
    return t;
}

// A loader's q and k into qk[b].
fn stage(t: Tok, i: u32, b: u32) {
    if (i < Q4) {
        qk[b][i] = t.q;
        qk[b][Q4 + i] = t.k;
    }
}

// The sum of x over the workgroup, the same bits in every thread (all add the partials in one order); through red[b],
// with the step's one barrier. Called in uniform control flow.
fn wg_sum(x: vec3<f32>, i: u32, b: u32) -> vec3<f32> {
{{SG}}    let s = subgroupAdd(x);
{{SG}}    if (sg_lane == 0u) { red[b][i / sg_size] = s; }
{{NOSG}}    red[b][i] = x;
    workgroupBarrier();
    var total = vec3<f32>(0.0);
{{SG}}    for (var g = 0u; g < (WG + sg_size - 1u) / sg_size; g++) { total += red[b][g]; }
{{NOSG}}    for (var g = 0u; g < WG; g++) { total += red[b][g]; }
    return total;
}

// The sum of x over the P lanes of a column (adjacent lanes of one subgroup), the same bits in each of them: a
// butterfly, whose a + b and b + a round alike. P is 1 without subgroups.
fn lanes_sum(x: f32) -> f32 {
    var s = x;
{{SG}}    for (var m = 1u; m < P; m <<= 1u) { s += subgroupShuffleXor(s, m); }
    return s;
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn softplus(x: f32) -> f32 {
    if (x > 20.0) { return x; }
    return log(1.0 + exp(x));
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) i: u32,
{{SG}}        @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
        @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let h = wid.x;
    let hk = h % p.n_k_heads;
    let c = i / P;                        // the column
    let part = i % P;                     // its rows 4 (m P + part) + e, m < M, e < 4
    let out_stride = p.n_v_heads * S;
    let scale = 1.0 / sqrt(f32(S));
    let dt = dt_bias[h];
    let a_h = ssm_a[h];
    let w = norm_w[c];
    let col = h * S * S + c;              // S_h[r][c] at col + r S
    var s: array<vec4<f32>, M>;           // zero: a new conversation's state
    if (step.pos > 0u) {
        for (var m = 0u; m < M; m++) {
            for (var e = 0u; e < 4u; e++) { let r = 4u * (m * P + part) + e; s[m][e] = state[col + r * S]; }
        }
    }
    // the pipeline's prologue: token 0's q and k staged in qk[0], their squares' sums reduced through red[1]
    var cur = fetch(0u, i, c, h, hk);
    stage(cur, i, 0u);
    var sums = wg_sum(vec3<f32>(0.0, cur.sq), i, 1u);
    for (var j = 0u; j < step.n_tokens; j++) {
        let b = j % 2u;
        // token j + 1's reads, issued before the scan and used after it (the last token re-reads its own)
        let next = fetch(min(j + 1u, step.n_tokens - 1u), i, c, h, hk);
        let inv_q = 1.0 / sqrt(sums.y + p.eps);
        let inv_k = 1.0 / sqrt(sums.z + p.eps);
        let beta = sigmoid(cur.beta);
        let decay = exp(softplus(cur.alpha + dt) * a_h);
        // decay, and the state's prediction of v from the normed k: (S_h^T k)[c], this lane's rows, then the column's
        var acc = vec4<f32>(0.0);
        for (var m = 0u; m < M; m++) {
            s[m] *= decay;
            acc += s[m] * qk[b][Q4 + m * P + part];
        }
        let sk = lanes_sum(acc.x + acc.y + acc.z + acc.w) * inv_k;
        // the delta rule's rank-one update k d^T (k normed: d / |k| times the raw k), and the read-out by q
        let d = beta * (cur.v - sk) * inv_k;
        acc = vec4<f32>(0.0);
        for (var m = 0u; m < M; m++) {
            s[m] += qk[b][Q4 + m * P + part] * d;
            acc += s[m] * qk[b][m * P + part];
        }
        let o = lanes_sum(acc.x + acc.y + acc.z + acc.w) * inv_q * scale;
        // the one barrier: token j's o^2 (one lane a column) and token j + 1's q, k and their squares
        stage(next, i, 1u - b);
        sums = wg_sum(vec3<f32>(select(0.0, o * o, part == 0u), next.sq), i, b);
        if (part == 0u) {
            out[j * out_stride + h * S + c] = o * (1.0 / sqrt(sums.x / f32(S) + p.eps)) * w * silu(cur.z);
        }
        cur = next;
    }
    for (var m = 0u; m < M; m++) {
        for (var e = 0u; e < 4u; e++) { let r = 4u * (m * P + part) + e; state[col + r * S] = s[m][e]; }
    }
}
