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
//       holds)
// Params { n_k_heads, n_v_heads, proj_stride, z_offset, beta_offset, alpha_offset: u32, eps: f32, _p0: u32 }
// Constants: S the head size (d_k = d_v), also the workgroup size.
// Grid: (n_v_heads, 1, 1): one workgroup a value head, its S threads walk the step's tokens in order; thread c owns
//       the state's column c (S floats in a private array: the recurrence reads and writes nothing else of the state,
//       so the state is read once and written once a step). Per token three barriers: after q^2 and k^2 are in
//       workgroup memory (each thread sums the S squares itself, in one order, so all agree on the norms), after
//       the normed q and k are (every column reads all of them), after o^2 is (the gated norm's mean); the next
//       token's writes come after all of a token's reads (its first barrier), so no fourth.
// The token loop is serial by nature (the state of token j feeds token j + 1); a chunked form (WY / UT transform,
// as llama.cpp's build_delta_net_chunking) trades it for matrix products, not tried here.

//!include common.wgsl
//!include act.wgsl

struct Params { n_k_heads: u32, n_v_heads: u32, proj_stride: u32, z_offset: u32,
                beta_offset: u32, alpha_offset: u32, eps: f32, _p0: u32 };

const S: u32 = {{S}}u;

@group(0) @binding(0) var<storage, read> proj: array<f32>;
@group(0) @binding(1) var<storage, read> conv: array<f32>;
@group(0) @binding(2) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(3) var<storage, read> ssm_a: array<f32>;
@group(0) @binding(4) var<storage, read> norm_w: array<f32>;
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;
@group(0) @binding(8) var<uniform> step: Step;

var<workgroup> sq: array<vec2<f32>, S>;   // q^2, k^2 of the token's key head
var<workgroup> qs: array<f32, S>;         // the L2-normed q
var<workgroup> ks: array<f32, S>;         // the L2-normed k
var<workgroup> os: array<f32, S>;         // o^2, for the gated norm

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn softplus(x: f32) -> f32 {
    if (x > 20.0) { return x; }
    return log(1.0 + exp(x));
}

@compute @workgroup_size(S)
fn main(@builtin(local_invocation_index) c: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let hk = h % p.n_k_heads;
    let K = p.n_k_heads * S;
    let conv_stride = 2u * K + p.n_v_heads * S;
    let out_stride = p.n_v_heads * S;
    let scale = 1.0 / sqrt(f32(S));
    let col = h * S * S + c;              // S_h[r][c] at col + r S
    var s: array<f32, S>;                 // zero: a new conversation's state
    if (step.pos > 0u) {
        for (var r = 0u; r < S; r++) { s[r] = state[col + r * S]; }
    }
    for (var j = 0u; j < step.n_tokens; j++) {
        let row = j * conv_stride;
        let pr = j * p.proj_stride;
        let qv = conv[row + hk * S + c];
        let kv = conv[row + K + hk * S + c];
        let vv = conv[row + 2u * K + h * S + c];
        sq[c] = vec2<f32>(qv * qv, kv * kv);
        workgroupBarrier();
        var ss = vec2<f32>(0.0);
        for (var r = 0u; r < S; r++) { ss += sq[r]; }
        qs[c] = qv * (1.0 / sqrt(ss.x + p.eps));
        ks[c] = kv * (1.0 / sqrt(ss.y + p.eps));
        let beta = sigmoid(proj[pr + p.beta_offset + h]);
        let decay = exp(softplus(proj[pr + p.alpha_offset + h] + dt_bias[h]) * ssm_a[h]);
        workgroupBarrier();
        // decay, and the state's prediction of v from k: (S_h^T k)[c]
        var sk = 0.0;
        for (var r = 0u; r < S; r++) {
            s[r] *= decay;
            sk += s[r] * ks[r];
        }
        let d = beta * (vv - sk);
        // the delta rule's rank-one update, and the read-out by q
        var o = 0.0;
        for (var r = 0u; r < S; r++) {
            s[r] += ks[r] * d;
            o += s[r] * qs[r];
        }
        o *= scale;
        let z = proj[pr + p.z_offset + h * S + c];
        os[c] = o * o;
        workgroupBarrier();
        var oo = 0.0;
        for (var r = 0u; r < S; r++) { oo += os[r]; }
        out[j * out_stride + h * S + c] = o * (1.0 / sqrt(oo / f32(S) + p.eps)) * norm_w[c] * silu(z);
    }
    for (var r = 0u; r < S; r++) { state[col + r * S] = s[r]; }
}
