// Qwen3.5's gated delta-net backward (the forward is deltanet.wgsl, llama.cpp src/models/qwen35.cpp
// build_layer_attn_linear): gradients of the L2 norms of q and k, the beta gate, the decay, the delta-rule recurrence
// and the gated RMS norm over a training window of t tokens, given dy at the gated norm's output; the conv in front of
// it is backward_shortconv.wgsl's silu entries, the projections around it backward_matmul's.
// The window starts at position 0 from a zero state (training's windows always do), so no state is read or written
// here and no gradient reaches one.
//
// Math (lab/host/reference/grads_deltanet.py deltanet_grad is the float64 oracle), value head h, key head
// hk = h % n_k_heads, token j, S_{-1} = 0:
//   q = q_raw / |q_raw|, k = k_raw / |k_raw| (|x| = sqrt(sum x^2 + eps)); beta = sigmoid(b); g = softplus(a + dt) A
//   S' = exp(g) S_{j-1};  e = v - S'^T k;  d = beta e;  S_j = S' + k d^T;  o = S_j^T q / sqrt(S)
//   y = o / rms(o) * norm_w * silu(z)
// Backward, the last token first, dS the gradient at S_j (0 after the window's last token):
//   gated norm: n = o r, r = 1/sqrt(mean(o^2) + eps); dz = dy n w silu'(z); dn = dy w silu(z);
//               do = r (dn - n mean(dn n));  dnorm_w += sum dy n silu(z)
//   dS += q do^T / sqrt(S);  dq += S_j do / sqrt(S)
//   dd = dS^T k;  dk += dS d;  dbeta = dd . e;  dv = beta dd;  dpred = -beta dd
//   dS' = dS + k dpred^T;  dk += S' dpred;  dg = <dS', S'>;  dS_{j-1} = exp(g) dS'
//   db = dbeta beta (1 - beta);  da = dg A softplus'(a + dt) (1 past 20, as softplus is the identity there);
//   ddt += da;  dA += dg softplus(a + dt);  dq_raw = (dq - q (q . dq)) / |q_raw| summed over the value heads that
//   share the key head, in head order (dk_raw the same)
//
// The states in reverse (the choice, and its memory: lab/ops/backward_deltanet.py): the window is cut into chunks of
// C tokens. delta_fwd walks the chunks forward, one dispatch a chunk, and keeps the state at each chunk's end
// (ckpt: ceil(t / C) - 1 states of n_v_heads S x S) and the read-out o; delta_back walks them backward, one dispatch
// a chunk: from the chunk's checkpoint it computes the chunk's C states again into `chunk`, then runs the chunk's
// tokens last to first, carrying dS in registers and, between dispatches, in `ds`. So nothing of T S^2 size is held.
//
// Entries, each with its own bindings (one binding number may name different variables in different entries; WGSL
// forbids that only within one entry):
//   delta_prep       0 proj (read [t, proj_stride])  1 conv (read [t, 2K + V])  2 dt_bias (read)  3 ssm_a (read)
//                    4 qkv (rw [t, 2K + V]: q and k L2-normed, v)  5 inv (rw [t, 2 n_k_heads]: 1/|x| of each q, k)
//                    6 gates (rw [t, n_v_heads, 8]: beta, exp(g), softplus, A softplus' ; dg, db, da written by
//                    delta_back)  7 p  8 step.  Grid (ceil((2 n_k_heads + n_v_heads) / WG), t): one invocation a
//                    key vector (q or k of a key head) or a value head (v copied, its gates) of a token.
//   delta_fwd        0 qkv (read)  1 gates (read)  2 ckpt (rw [chunks - 1, n_v_heads, S, S])  3 o (rw [t, V])
//                    4 p  5 step.  Grid (n_v_heads, 1, 1) for chunk p.chunk (none past the window): S threads, thread
//                    c the state's column c (rows r: S_h[r][c], r a key index) in registers.
//   delta_norm_back  0 proj (read)  1 o (read)  2 norm_w (read [S])  3 dy (read [t, V])  4 dout (rw [t, V]: do)
//                    5 dproj (rw [t, proj_stride]: dz written at z_offset)  6 rs (rw [t, n_v_heads]: 1/rms)
//                    7 p  8 step.  Grid (ceil(n_v_heads / WG), t): one invocation a (token, head) walking S.
//   delta_norm_dw    0 proj  1 o  2 rs (read)  3 dy  4 dw (rw [S], added into)  5 p  6 step.  Grid (ceil(S / WG)):
//                    one invocation a column walking every (token, head) in order.
//   delta_back       0 qkv (read)  1 gates (rw)  2 ckpt (read)  3 dout (read: do)  4 chunk (rw [n_v_heads, C, S, S])
//                    5 ds (rw [n_v_heads, S, S])  6 dqkv (rw [t, n_v_heads, 3S]: each value head's dq, dk, dv)
//                    7 p  8 step.  Grid (n_v_heads, 1, 1) for chunk p.chunk, S threads: thread i owns column i of
//                    the states (the products over rows: S'^T k, dS^T k, the decay's sum) and, after a barrier,
//                    row i (those over columns: S_j do, dS d, S' dpred), the vectors d, dpred, do shared through
//                    workgroup memory and dS's columns through `ds`. Two barriers a token.
//   delta_qk_back    0 dqkv (read)  1 qkv (read)  2 inv (read)  3 gates (read)  4 dconv (rw [t, 2K + V], written)
//                    5 dproj (rw: db, da written at beta_offset, alpha_offset)  6 p  7 step.  Grid as delta_prep's.
//   delta_param_back 0 gates (read)  1 ddt (rw [n_v_heads], added into)  2 da (rw [n_v_heads], added into)  3 p
//                    4 step.  Grid (ceil(n_v_heads / WG)): one invocation a head walking the tokens in order.
// Every sum runs in a fixed order (no float atomics): the same bits every run.
// Params { n_k_heads, n_v_heads, proj_stride, z_offset, beta_offset, alpha_offset, chunk, _p0: u32, eps: f32, ... }
// Constants: S the head size (a multiple of 16, the forward's), C the chunk's tokens, WG the per-row kernels'
// threads. On lavapipe an invocation's loops stop past 32,768 iterations: the builder bounds each entry's walk.
// Not measured on a GPU yet: the states live in storage (`chunk`, `ds`) and an S-thread workgroup walks a head's
// tokens one by one, as the forward scan does; a chunked (WY) form would make the chunk's work matrix products.

//!include common.wgsl
//!include act.wgsl

struct Params { n_k_heads: u32, n_v_heads: u32, proj_stride: u32, z_offset: u32,
                beta_offset: u32, alpha_offset: u32, chunk: u32, _p0: u32,
                eps: f32, _p1: u32, _p2: u32, _p3: u32 };

const S: u32 = {{S}}u;
const C: u32 = {{C}}u;
const WG: u32 = {{WG}}u;
const G: u32 = 8u;              // floats of a (token, value head) in `gates`
const SS: u32 = S * S;

// delta_prep
@group(0) @binding(0) var<storage, read> proj: array<f32>;
@group(0) @binding(1) var<storage, read> conv: array<f32>;
@group(0) @binding(2) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(3) var<storage, read> ssm_a: array<f32>;
@group(0) @binding(4) var<storage, read_write> qkv_w: array<f32>;
@group(0) @binding(5) var<storage, read_write> inv_w: array<f32>;
@group(0) @binding(6) var<storage, read_write> gates_w: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;
@group(0) @binding(8) var<uniform> step: Step;
// delta_fwd
@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read> gates: array<f32>;
@group(0) @binding(2) var<storage, read_write> ckpt_w: array<f32>;
@group(0) @binding(3) var<storage, read_write> o_w: array<f32>;
@group(0) @binding(4) var<uniform> p6: Params;
@group(0) @binding(5) var<uniform> step6: Step;
// delta_norm_back (proj at 0, p and step at 7, 8 as delta_prep's)
@group(0) @binding(1) var<storage, read> o: array<f32>;
@group(0) @binding(2) var<storage, read> norm_w: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> dout_w: array<f32>;
@group(0) @binding(5) var<storage, read_write> dproj: array<f32>;
@group(0) @binding(6) var<storage, read_write> rs_w: array<f32>;
// delta_norm_dw (proj 0, o 1, dy 3 as delta_norm_back's)
@group(0) @binding(2) var<storage, read> rs: array<f32>;
@group(0) @binding(4) var<storage, read_write> dw: array<f32>;
@group(0) @binding(5) var<uniform> p5: Params;
@group(0) @binding(6) var<uniform> step5: Step;
// delta_back (qkv 0, p 7, step 8 as above)
@group(0) @binding(1) var<storage, read_write> gates_rw: array<f32>;
@group(0) @binding(2) var<storage, read> ckpt: array<f32>;
@group(0) @binding(3) var<storage, read> dout: array<f32>;
@group(0) @binding(4) var<storage, read_write> chunk: array<f32>;
@group(0) @binding(5) var<storage, read_write> ds_buf: array<f32>;
@group(0) @binding(6) var<storage, read_write> dqkv_w: array<f32>;
// delta_qk_back (qkv 1, gates 3, dproj 5)
@group(0) @binding(0) var<storage, read> dqkv: array<f32>;
@group(0) @binding(1) var<storage, read> qkv1: array<f32>;
@group(0) @binding(2) var<storage, read> inv: array<f32>;
@group(0) @binding(3) var<storage, read> gates3: array<f32>;
@group(0) @binding(4) var<storage, read_write> dconv: array<f32>;
@group(0) @binding(6) var<uniform> p6b: Params;
@group(0) @binding(7) var<uniform> step7: Step;
// delta_param_back (gates 0)
@group(0) @binding(0) var<storage, read> gates0: array<f32>;
@group(0) @binding(1) var<storage, read_write> ddt: array<f32>;
@group(0) @binding(2) var<storage, read_write> da: array<f32>;
@group(0) @binding(3) var<uniform> p3: Params;
@group(0) @binding(4) var<uniform> step4: Step;

var<workgroup> vd: array<f32, S>;           // delta_back: token j's d, dpred, do, shared for the row products
var<workgroup> vp: array<f32, S>;
var<workgroup> vo: array<f32, S>;
var<workgroup> red: array<vec2<f32>, S>;    // each column's (dd . e, <dS', S'>) terms, summed in column order

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn softplus(x: f32) -> f32 {     // as deltanet.wgsl's forward: x itself past 20
    if (x > 20.0) { return x; }
    return log(1.0 + exp(x));
}

@compute @workgroup_size(WG)
fn delta_prep(@builtin(global_invocation_id) gid: vec3<u32>) {
    let u = gid.x;
    let j = gid.y;
    let nk = p.n_k_heads;
    let nv = p.n_v_heads;
    if (j >= step.n_tokens || u >= 2u * nk + nv) { return; }
    let K = nk * S;
    let cw = 2u * K + nv * S;
    if (u < 2u * nk) {      // q (u < nk) or k of key head u % nk: L2-normed
        let b = j * cw + u * S;
        var ss = 0.0;
        for (var i = 0u; i < S; i++) { ss += conv[b + i] * conv[b + i]; }
        let r = 1.0 / sqrt(ss + p.eps);
        for (var i = 0u; i < S; i++) { qkv_w[b + i] = conv[b + i] * r; }
        inv_w[j * 2u * nk + u] = r;
        return;
    }
    let h = u - 2u * nk;
    let b = j * cw + 2u * K + h * S;
    for (var i = 0u; i < S; i++) { qkv_w[b + i] = conv[b + i]; }
    let pr = j * p.proj_stride;
    let x = proj[pr + p.alpha_offset + h] + dt_bias[h];
    let sp = softplus(x);
    let g = (j * nv + h) * G;
    gates_w[g] = sigmoid(proj[pr + p.beta_offset + h]);
    gates_w[g + 1u] = exp(sp * ssm_a[h]);
    gates_w[g + 2u] = sp;
    gates_w[g + 3u] = ssm_a[h] * select(sigmoid(x), 1.0, x > 20.0);
}

@compute @workgroup_size(S)
fn delta_fwd(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let nk = p6.n_k_heads;
    let nv = p6.n_v_heads;
    let K = nk * S;
    let cw = 2u * K + nv * S;
    let t = step6.n_tokens;
    let j0 = p6.chunk * C;
    let j1 = min(j0 + C, t);
    let scale = 1.0 / sqrt(f32(S));
    var s = array<f32, S>();        // column i of S_h: zero before the window
    if (p6.chunk > 0u) {
        let ck = ((p6.chunk - 1u) * nv + h) * SS + i;
        for (var r = 0u; r < S; r++) { s[r] = ckpt_w[ck + r * S]; }
    }
    for (var j = j0; j < j1; j++) {
        let g = (j * nv + h) * G;
        let beta = gates[g];
        let decay = gates[g + 1u];
        let qb = j * cw + (h % nk) * S;
        let kb = qb + K;
        var pred = 0.0;
        for (var r = 0u; r < S; r++) { s[r] *= decay; pred += s[r] * qkv[kb + r]; }
        let d = beta * (qkv[j * cw + 2u * K + h * S + i] - pred);
        var acc = 0.0;
        for (var r = 0u; r < S; r++) { s[r] += qkv[kb + r] * d; acc += s[r] * qkv[qb + r]; }
        o_w[j * nv * S + h * S + i] = acc * scale;
    }
    if (j1 < t) {       // the state at the chunk's end, where the next chunk starts
        let ck = (p6.chunk * nv + h) * SS + i;
        for (var r = 0u; r < S; r++) { ckpt_w[ck + r * S] = s[r]; }
    }
}

@compute @workgroup_size(WG)
fn delta_norm_back(@builtin(global_invocation_id) gid: vec3<u32>) {
    let h = gid.x;
    let j = gid.y;
    let nv = p.n_v_heads;
    if (h >= nv || j >= step.n_tokens) { return; }
    let ob = j * nv * S + h * S;
    let zb = j * p.proj_stride + p.z_offset + h * S;
    var ss = 0.0;
    for (var c = 0u; c < S; c++) { ss += o[ob + c] * o[ob + c]; }
    let r = 1.0 / sqrt(ss / f32(S) + p.eps);
    var dot = 0.0;
    for (var c = 0u; c < S; c++) {
        let n = o[ob + c] * r;
        let z = proj[zb + c];
        dot += dy[ob + c] * norm_w[c] * silu(z) * n;
        dproj[zb + c] = dy[ob + c] * n * norm_w[c] * silu_grad(z);
    }
    let m = dot / f32(S);
    for (var c = 0u; c < S; c++) {
        let n = o[ob + c] * r;
        dout_w[ob + c] = (dy[ob + c] * norm_w[c] * silu(proj[zb + c]) - n * m) * r;
    }
    rs_w[j * nv + h] = r;
}

@compute @workgroup_size(WG)
fn delta_norm_dw(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= S) { return; }
    let nv = p5.n_v_heads;
    var acc = 0.0;
    for (var j = 0u; j < step5.n_tokens; j++) {
        for (var h = 0u; h < nv; h++) {
            let ob = j * nv * S + h * S + c;
            acc += dy[ob] * (o[ob] * rs[j * nv + h]) * silu(proj[j * p5.proj_stride + p5.z_offset + h * S + c]);
        }
    }
    dw[c] += acc;
}

@compute @workgroup_size(S)
fn delta_back(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let nk = p.n_k_heads;
    let nv = p.n_v_heads;
    let K = nk * S;
    let cw = 2u * K + nv * S;
    let t = step.n_tokens;
    let j0 = p.chunk * C;
    let j1 = min(j0 + C, t);
    let scale = 1.0 / sqrt(f32(S));
    let cs0 = h * C * SS;           // chunk[cs0 + (j - j0) SS + r S + c]: S_h[r][c] before token j
    let ds0 = h * SS;               // ds_buf[ds0 + r S + c]: dS_h[r][c]
    // 1. the chunk's states again, as delta_fwd made them, from the chunk's checkpoint
    var s = array<f32, S>();
    if (p.chunk > 0u) {
        let ck = ((p.chunk - 1u) * nv + h) * SS + i;
        for (var r = 0u; r < S; r++) { s[r] = ckpt[ck + r * S]; }
    }
    for (var j = j0; j < j1; j++) {
        let g = (j * nv + h) * G;
        let beta = gates_rw[g];
        let decay = gates_rw[g + 1u];
        let kb = j * cw + K + (h % nk) * S;
        let cj = cs0 + (j - j0) * SS + i;
        var pred = 0.0;
        for (var r = 0u; r < S; r++) { chunk[cj + r * S] = s[r]; s[r] *= decay; pred += s[r] * qkv[kb + r]; }
        let d = beta * (qkv[j * cw + 2u * K + h * S + i] - pred);
        for (var r = 0u; r < S; r++) { s[r] += qkv[kb + r] * d; }
    }
    // 2. dS after the chunk's last token: zero past the window's last token, else what the later chunk left
    var ds = array<f32, S>();
    if (j1 < t) {
        for (var r = 0u; r < S; r++) { ds[r] = ds_buf[ds0 + r * S + i]; }
    }
    storageBarrier();
    workgroupBarrier();
    // 3. the chunk's tokens, last first
    for (var jj = j1 - j0; jj > 0u; jj--) {
        let j = j0 + jj - 1u;
        let g = (j * nv + h) * G;
        let beta = gates_rw[g];
        let decay = gates_rw[g + 1u];
        let qb = j * cw + (h % nk) * S;
        let kb = qb + K;
        let cj = cs0 + (j - j0) * SS;
        let dob = dout[j * nv * S + h * S + i];
        // column i: S'^T k, e, d
        var pred = 0.0;
        for (var r = 0u; r < S; r++) { pred += decay * chunk[cj + r * S + i] * qkv[kb + r]; }
        let e = qkv[j * cw + 2u * K + h * S + i] - pred;
        let d = beta * e;
        // dS += q do^T / sqrt(S); dd = dS^T k; dS (the gradient at S_j) shared for the row products
        var dd = 0.0;
        for (var r = 0u; r < S; r++) {
            ds[r] += scale * qkv[qb + r] * dob;
            dd += ds[r] * qkv[kb + r];
            ds_buf[ds0 + r * S + i] = ds[r];
        }
        let dpred = -beta * dd;
        // dS' = dS + k dpred^T; this column's share of <dS', S'>; dS_{j-1} = exp(g) dS'
        var dg = 0.0;
        for (var r = 0u; r < S; r++) {
            ds[r] += qkv[kb + r] * dpred;
            dg += decay * chunk[cj + r * S + i] * ds[r];
            ds[r] *= decay;
        }
        dqkv_w[(j * nv + h) * 3u * S + 2u * S + i] = beta * dd;
        vd[i] = d;
        vp[i] = dpred;
        vo[i] = dob;
        red[i] = vec2<f32>(dd * e, dg);
        storageBarrier();
        workgroupBarrier();
        // row i: dq = S_j do / sqrt(S) (S_j = S' + k d^T); dk = dS d + S' dpred
        let ki = qkv[kb + i];
        let row = cj + i * S;
        var aq = 0.0;
        var ak = 0.0;
        for (var c = 0u; c < S; c++) {
            let sp = decay * chunk[row + c];
            aq += (sp + ki * vd[c]) * vo[c];
            ak += ds_buf[ds0 + i * S + c] * vd[c] + sp * vp[c];
        }
        let at = (j * nv + h) * 3u * S;
        dqkv_w[at + i] = scale * aq;
        dqkv_w[at + S + i] = ak;
        if (i == 0u) {      // the gates' gradients: dbeta and dg summed over the columns in order
            var sums = vec2<f32>(0.0);
            for (var c = 0u; c < S; c++) { sums += red[c]; }
            gates_rw[g + 4u] = sums.y;
            gates_rw[g + 5u] = sums.x * beta * (1.0 - beta);
            gates_rw[g + 6u] = sums.y * gates_rw[g + 3u];
        }
        storageBarrier();
        workgroupBarrier();
    }
    // 4. dS before the chunk's first token, for the chunk before it
    for (var r = 0u; r < S; r++) { ds_buf[ds0 + r * S + i] = ds[r]; }
}

@compute @workgroup_size(WG)
fn delta_qk_back(@builtin(global_invocation_id) gid: vec3<u32>) {
    let u = gid.x;
    let j = gid.y;
    let nk = p6b.n_k_heads;
    let nv = p6b.n_v_heads;
    if (j >= step7.n_tokens || u >= 2u * nk + nv) { return; }
    let K = nk * S;
    let cw = 2u * K + nv * S;
    if (u < 2u * nk) {      // q or k of key head u % nk: the value heads' shares summed, then the L2 norm's backward
        let part = u / nk;
        let b = j * cw + u * S;
        var dot = 0.0;
        for (var i = 0u; i < S; i++) {
            var gs = 0.0;
            for (var h = u % nk; h < nv; h += nk) { gs += dqkv[(j * nv + h) * 3u * S + part * S + i]; }
            dot += gs * qkv1[b + i];
        }
        let r = inv[j * 2u * nk + u];
        for (var i = 0u; i < S; i++) {
            var gs = 0.0;
            for (var h = u % nk; h < nv; h += nk) { gs += dqkv[(j * nv + h) * 3u * S + part * S + i]; }
            dconv[b + i] = (gs - qkv1[b + i] * dot) * r;
        }
        return;
    }
    let h = u - 2u * nk;
    let b = j * cw + 2u * K + h * S;
    for (var i = 0u; i < S; i++) { dconv[b + i] = dqkv[(j * nv + h) * 3u * S + 2u * S + i]; }
    let g = (j * nv + h) * G;
    let pr = j * p6b.proj_stride;
    dproj[pr + p6b.beta_offset + h] = gates3[g + 5u];
    dproj[pr + p6b.alpha_offset + h] = gates3[g + 6u];
}

@compute @workgroup_size(WG)
fn delta_param_back(@builtin(global_invocation_id) gid: vec3<u32>) {
    let h = gid.x;
    let nv = p3.n_v_heads;
    if (h >= nv) { return; }
    var sa = 0.0;
    var sd = 0.0;
    for (var j = 0u; j < step4.n_tokens; j++) {
        let g = (j * nv + h) * G;
        sd += gates0[g + 6u];
        sa += gates0[g + 4u] * gates0[g + 2u];
    }
    ddt[h] += sd;
    da[h] += sa;
}
