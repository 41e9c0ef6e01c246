// The output head fused with the cross-entropy (lab/ops/backward_head.py): the loss and dlogits of
//   z = W xn (the head, the forward's own matmul), l = cap ? c tanh(z / c) : z (gemma2's final soft-cap),
//   nll[t] = logsumexp_v l[t, v] - l[t, target[t]],   loss = sum over rows with a target of nll / N,
// without a [t, n_vocab] matrix: the vocabulary's rows are cut into slabs (row ranges of W, lab.ops.backward_head
// says how many rows), and per slab the forward's matmul leaves the slab's z in a scratch L [t, stride]; these
// kernels read it. A target >= n_vocab (the sentinel 0xFFFFFFFF among them) means "no loss at this row".
// Four entries, each with its own gapless bindings from 0 (variables of two entries share binding numbers, as in
// backward_gemm.wgsl: WGSL forbids that only within one entry point):
//   ce_stats:   0 L (read)  1 targets (read, u32)  2 stats (read_write, vec2: (max, sum-exp) a chunk and token)
//               3 tl (read_write: the target's logit a token)  4 p (uniform Params)  5 step (uniform Step)
//   ce_merge:   0 stats (read)  1 tl (read)  2 targets (read)  3 lse (read_write)  4 nll (read_write)  5 p  6 step
//   ce_loss:    0 nll (read)  1 targets (read)  2 out (read_write, 4 floats)  3 p  4 step
//   ce_dlogits: 0 L (read_write: z in, dlogits out)  1 targets (read)  2 lse (read)  3 out (read)  4 p  5 step
// Params { n_vocab, v0 (the slab's first vocabulary row), n (the slab's rows), stride (floats of L a token),
//          chunk_rows, chunk0 (the slab's first chunk among all the slabs'), chunks (all of them), t_off (token t's
//          target at targets[t_off + t]), cap (0: none), rows_total (0: N is the rows with a target), _p0, _p1 }
//
// Loss, in a fixed order (every run the same bits):
//   ce_stats: invocation (k, t) owns chunk k of the slab's rows, r0 = k * chunk_rows .. min(r0 + chunk_rows, n), and
//     token t: m_k = max l over the chunk, then s_k = sum of exp(l - m_k) in row order (two walks of the chunk:
//     every term is exp of a value <= 0, never an overflow, and no running rescale compounds its roundings), stored
//     at stats[(chunk0 + k) * n_tokens + t]. The invocation whose chunk holds the target stores its l in tl[t] (one
//     writer a token). Grid (ceil(chunks of the slab / WG), n_tokens, 1).
//   ce_merge: one invocation a token merges the chunks in order k = 0, 1, ...: m = max_k m_k, then
//     s = sum_k s_k exp(m_k - m), lse = m + log(s); nll = lse - tl (0 without a target). Grid (ceil(n_tokens / WG)).
//   ce_loss: one invocation sums nll over the tokens with a target in token order: out = (sum / N, count, 1 / N,
//     sum), N = rows_total if given (the step's rows over several calls), else the count. Grid (1, 1, 1).
// Gradient (right after the loss, per slab, last slab first: the loss left its z in L, each earlier one's recomputed):
//   ce_dlogits: L[t, r] = (exp(l - lse[t]) - [v0 + r == target]) * dl/dz * (1 / N), 0 on a row without a target,
//     where dl/dz = 1 - tanh(z / c)^2 = 4 e / (1 + e)^2, e = exp(-2 |z / c|) (no cancellation near saturation;
//     0 past the forward's clamp at |z / c| = 15, where tanh is 1 in f32), 1 without the cap.
//     Grid (ceil(n / WG), n_tokens, 1). Then backward_matmul's dx_rows and chunk_sum give dxn += W^T L.
// Loops: lavapipe stops an invocation's loops silently past 32,768 iterations (tests/kernels/test_loop_budget.py):
//   ce_stats walks 2 chunk_rows, ce_merge 2 chunks, ce_loss n_tokens; lab/ops/backward_head.py keeps each under it.
// Constants: WG.

//!include common.wgsl

struct Params { n_vocab: u32, v0: u32, n: u32, stride: u32, chunk_rows: u32, chunk0: u32, chunks: u32, t_off: u32,
                cap: f32, rows_total: u32, _p0: u32, _p1: u32 };

const WG: u32 = {{WG}}u;
const LOWEST: f32 = -3.4028234663852886e38;

// ce_stats
@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<u32>;
@group(0) @binding(2) var<storage, read_write> stats: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> tl: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;
// ce_merge
@group(0) @binding(0) var<storage, read> m_stats: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read> m_tl: array<f32>;
@group(0) @binding(2) var<storage, read> m_targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> m_lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> m_nll: array<f32>;
@group(0) @binding(5) var<uniform> m_p: Params;
@group(0) @binding(6) var<uniform> m_step: Step;
// ce_loss
@group(0) @binding(0) var<storage, read> s_nll: array<f32>;
@group(0) @binding(1) var<storage, read> s_targets: array<u32>;
@group(0) @binding(2) var<storage, read_write> s_out: array<f32>;
@group(0) @binding(3) var<uniform> s_p: Params;
@group(0) @binding(4) var<uniform> s_step: Step;
// ce_dlogits
@group(0) @binding(0) var<storage, read_write> d_L: array<f32>;
@group(0) @binding(1) var<storage, read> d_targets: array<u32>;
@group(0) @binding(2) var<storage, read> d_lse: array<f32>;
@group(0) @binding(3) var<storage, read> d_out: array<f32>;
@group(0) @binding(4) var<uniform> d_p: Params;
@group(0) @binding(5) var<uniform> d_step: Step;

// The logit the model predicts with: z, or the forward's soft-cap of it (elementwise.wgsl softcap_to's arithmetic,
// so that the loss scores the logits the forward samples from).
fn capped(z: f32, cap: f32) -> f32 {
    if (cap > 0.0) { return cap * tanh(clamp(z / cap, -15.0, 15.0)); }
    return z;
}

// dl/dz of `capped`.
fn cap_slope(z: f32, cap: f32) -> f32 {
    if (cap <= 0.0) { return 1.0; }
    let u = abs(z / cap);
    let e = exp(-2.0 * u);
    return select(0.0, 4.0 * e / ((1.0 + e) * (1.0 + e)), u < 15.0);
}

// The largest logit of rows r0 .. r1 - 1 of token row `row` of L.
fn chunk_max(row: u32, r0: u32, r1: u32) -> f32 {
    var m = LOWEST;
    for (var r = r0; r < r1; r++) { m = max(m, capped(L[row + r], p.cap)); }
    return m;
}

@compute @workgroup_size(WG)
fn ce_stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    let t = gid.y;
    let r0 = k * p.chunk_rows;
    if (r0 >= p.n || t >= step.n_tokens) { return; }
    let r1 = min(r0 + p.chunk_rows, p.n);
    let row = t * p.stride;
    let m = chunk_max(row, r0, r1);
    var s = 0.0;
    for (var r = r0; r < r1; r++) { s += exp(capped(L[row + r], p.cap) - m); }
    stats[(p.chunk0 + k) * step.n_tokens + t] = vec2<f32>(m, s);
    // the target's row in this slab: ids before v0 wrap to values past every chunk, as the sentinel is
    let j = targets[p.t_off + t] - p.v0;
    if (j >= r0 && j < r1) { tl[t] = capped(L[row + j], p.cap); }
}

@compute @workgroup_size(WG)
fn ce_merge(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    let nt = m_step.n_tokens;
    if (t >= nt) { return; }
    var m = LOWEST;
    for (var k = 0u; k < m_p.chunks; k++) { m = max(m, m_stats[k * nt + t].x); }
    var s = 0.0;
    for (var k = 0u; k < m_p.chunks; k++) {
        let st = m_stats[k * nt + t];
        s += st.y * exp(st.x - m);
    }
    let lse = m + log(s);
    m_lse[t] = lse;
    m_nll[t] = select(0.0, lse - m_tl[t], m_targets[m_p.t_off + t] < m_p.n_vocab);
}

@compute @workgroup_size(1)
fn ce_loss() {
    var sum = 0.0;
    var count = 0u;
    for (var t = 0u; t < s_step.n_tokens; t++) {
        if (s_targets[s_p.t_off + t] < s_p.n_vocab) {
            sum += s_nll[t];
            count += 1u;
        }
    }
    let n = select(f32(count), f32(s_p.rows_total), s_p.rows_total != 0u);
    s_out[0] = select(0.0, sum / n, n > 0.0);
    s_out[1] = f32(count);
    s_out[2] = select(0.0, 1.0 / n, n > 0.0);
    s_out[3] = sum;
}

@compute @workgroup_size(WG)
fn ce_dlogits(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let t = gid.y;
    if (r >= d_p.n || t >= d_step.n_tokens) { return; }
    let i = t * d_p.stride + r;
    let tgt = d_targets[d_p.t_off + t];
    if (tgt >= d_p.n_vocab) { d_L[i] = 0.0; return; }
    let z = d_L[i];
    let prob = exp(capped(z, d_p.cap) - d_lse[t]);
    let d = prob - select(0.0, 1.0, d_p.v0 + r == tgt);
    d_L[i] = d * cap_slope(z, d_p.cap) * d_out[2];
}
