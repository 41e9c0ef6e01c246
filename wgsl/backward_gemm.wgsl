// The backward pass's plain f32 products (lab/ops/backward_matmul.py): one generic strided GEMM in three shapes of
// workgroup and the sum of the projection dx's partial chunks (backward_matmul.wgsl). Entries, each with its own
// layout from binding 0 up
// (variables of the two share binding numbers on purpose, as backward_norm.wgsl's, here even of other types and
// access: WGSL forbids two variables at one binding only within the SAME entry point; a bind group holds bindings
// 0, 1, ... with no gap, lab.gpu.Device.bind):
//   gemm, gemm_split, gemm_tiles: 0 A (read)  1 B (read)  2 C (read_write)  3 p (uniform Gemm)  4 step (uniform Step)
//   chunk_sum: 0 sums (read: dx_rows' partial sums)  1 dx (read_write)  2 q (uniform Sum)  3 step_s (uniform Step)
//
// gemm: C[i, j] = (acc ? C[i, j] : 0) + scale * sum_{k < K} A[i, k] B[k, j], for i < M, j < N, where
//   A[i, k] = A[a_off + i * a_si + k * a_sk], B[k, j] = B[b_off + k * b_sk + j * b_sj], C[i, j] = C[c_off + i * c_si +
//   j * c_sj]: any of the three may be read transposed through its strides, so the one kernel serves every shape the
//   projections' weight and LoRA gradients take ("C += A^T B over the tokens", "C = A B"): dW += dy^T x, u = x A^T,
//   du = s dy B, dA += du^T x, dB += s dy^T u, dx += du A. `tok` says which of M (bit 0), N (bit 1), K (bit 2) is the
//   step's token count instead of the field's value (the grid follows it: lab.ops.backward_matmul).
//   One invocation per element of C sums its K products in order k = 0, 1, ..., scales once, then adds C's value:
//   deterministic, no element written by two invocations. Why this and not tiles in workgroup memory: these products
//   are small next to the projections (K is the step's tokens, <= 64 here, or a LoRA rank, or one projection's width
//   for u and du, whose M x N is tokens x rank), and a tile's barriers cost lavapipe and SwiftShader more than they
//   save there. The one large case, a full fine-tune's dW (rows x cols outputs, t products each), reads A and B through
//   the cache: consecutive invocations take consecutive j, so its x reads are contiguous and its dy read one broadcast
//   per workgroup row. It bounded the step on a GPU: gemm_tiles below is the upgrade.
//   On lavapipe one invocation's loop stops silently past 32,768 iterations (tests/kernels/test_loop_budget.py): K
//   stays under that there.
//   Grid: (ceil(N / 8), ceil(M / 8), 1), workgroups of 8 x 8.
//
// gemm_split: the same C, for a long K and few outputs, on a GPU. The LoRA products are mostly that: u = x A^T and
//   du = s dy B have t x rank outputs and K = a projection's width (576 to 1536 at SmolLM2), dA and dB rank x width
//   outputs and K = the step's tokens. One invocation an output walks K alone: a few thousand invocations in all,
//   each waiting on its loads one after the other, with too few warps to hide them. Here a workgroup takes a tile of TI x TJ = 4 x 4 outputs and splits each one's K
//   over KS = 16 lanes: lane s sums k = s, s + KS, s + 2 KS, ... in order (consecutive lanes read consecutive k,
//   one contiguous run where an operand's k stride is 1), then the tile's 16 partial sums an output are added as a
//   tree in workgroup memory (strides 8, 4, 2, 1) and lane 0 scales, adds C's value and stores. The order is fixed
//   by K alone: deterministic, and no element written twice. K / 16 + 4 roundings against gemm's K.
//   Not on a CPU adapter (lab.ops.backward_matmul `gemm`, split=None): SwiftShader pays for every barrier per
//   thread, and a CPU gains nothing from the extra lanes.
//   Grid: (ceil(N / TJ), ceil(M / TI), 1), workgroups of 256 = TI x TJ x KS.
// Gemm { m, n, k, tok, a_off, a_si, a_sk, b_off, b_sk, b_sj, c_off, c_si, c_sj, acc: u32, scale: f32, _p: u32 }
//
// chunk_sum: dx[dx_off + t * dx_stride + c] = (acc ? that value : 0) + sum over chunks k = 0, 1, ... in order of
//   sums[(k * n_tokens + t) * cols + c], for t < n_tokens, c < cols: the second pass of the projection's dx.
//   Grid: 1-D over n_tokens * cols, folded into y past 65535 groups: index = gid.x + gid.y * (num_workgroups.x * 64).
// Sum { cols, chunks, dx_off, dx_stride, acc, _p0, _p1, _p2: u32 }

//!include common.wgsl

struct Gemm { m: u32, n: u32, k: u32, tok: u32, a_off: u32, a_si: u32, a_sk: u32, b_off: u32,
              b_sk: u32, b_sj: u32, c_off: u32, c_si: u32, c_sj: u32, acc: u32, scale: f32, _p: u32 };
struct Sum { cols: u32, chunks: u32, dx_off: u32, dx_stride: u32, acc: u32, _p0: u32, _p1: u32, _p2: u32 };

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> p: Gemm;
@group(0) @binding(4) var<uniform> step: Step;
// chunk_sum's own
@group(0) @binding(0) var<storage, read> sums: array<f32>;
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;
@group(0) @binding(2) var<uniform> q: Sum;
@group(0) @binding(3) var<uniform> step_s: Step;

// A dimension of the product: the field's value, or the step's token count where `tok` has bit `b`.
fn dim(v: u32, b: u32) -> u32 {
    return select(v, step.n_tokens, (p.tok & b) != 0u);
}

@compute @workgroup_size(8, 8)
fn gemm(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y;
    let j = gid.x;
    if (i >= dim(p.m, 1u) || j >= dim(p.n, 2u)) { return; }
    let kn = dim(p.k, 4u);
    var s = 0.0;
    for (var k = 0u; k < kn; k++) {
        s += A[p.a_off + i * p.a_si + k * p.a_sk] * B[p.b_off + k * p.b_sk + j * p.b_sj];
    }
    let o = p.c_off + i * p.c_si + j * p.c_sj;
    var v = p.scale * s;
    if (p.acc != 0u) { v += C[o]; }
    C[o] = v;
}

const TI: u32 = 4u;
const TJ: u32 = 4u;
const KS: u32 = 16u;
var<workgroup> red: array<f32, 256>;      // TI x TJ x KS partial sums: output o's lanes at o * KS ..

@compute @workgroup_size(256)
fn gemm_split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let s = li % KS;
    let o = li / KS;
    let i = wid.y * TI + o / TJ;
    let j = wid.x * TJ + o % TJ;
    let inside = i < dim(p.m, 1u) && j < dim(p.n, 2u);
    var acc = 0.0;
    if (inside) {
        let kn = dim(p.k, 4u);
        for (var k = s; k < kn; k += KS) {
            acc += A[p.a_off + i * p.a_si + k * p.a_sk] * B[p.b_off + k * p.b_sk + j * p.b_sj];
        }
    }
    red[li] = acc;
    workgroupBarrier();
    for (var h = KS / 2u; h > 0u; h = h / 2u) {     // every lane reaches each barrier: uniform control flow
        if (s < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    if (s == 0u && inside) {
        let c = p.c_off + i * p.c_si + j * p.c_sj;
        var v = p.scale * red[li];
        if (p.acc != 0u) { v += C[c]; }
        C[c] = v;
    }
}

// gemm_tiles: the same C for large products on a GPU: a full fine-tune's dW += dy^T x (rows x cols outputs, K the
//   step's tokens), the head's dW, dx += du A. A workgroup of 256 invocations takes a tile of BM x BN = 64 x 64
//   outputs; K goes in chunks of BK = 16: the chunk's A [64 rows x 16] and B [16 x 64 cols] are loaded once into
//   workgroup memory (each invocation 4 of each, consecutive invocations at consecutive i of A and j of B, so dW's dy
//   and x are read in contiguous runs), then each invocation adds the chunk's terms into its 4 x 4 outputs (rows
//   ti .. ti + 3, columns tj .. tj + 3) from there. Each output still sums k = 0, 1, ..., K - 1 in order, one term at a
//   time: gemm's order, deterministic. Where gemm and gemm_split re-read A and B from memory for every output (the
//   tiles cut those reads 64-fold), measured: SmolLM2's full fine-tune spent 270 of a T = 512 window's 347 ms in
//   gemm_split's dW. Elements past M, N or K load as zero and are never stored. Not on a CPU adapter (the barriers).
//   Grid: (ceil(N / 64), ceil(M / 64), 1).

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;
var<workgroup> ta: array<f32, 1024>;      // BK x BM: the chunk's A, ta[kk * BM + ii]
var<workgroup> tb: array<f32, 1024>;      // BK x BN: the chunk's B, tb[kk * BN + jj]

@compute @workgroup_size(256)
fn gemm_tiles(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let mn = dim(p.m, 1u);
    let nn = dim(p.n, 2u);
    let kn = dim(p.k, 4u);
    let i0 = wid.y * BM;
    let j0 = wid.x * BN;
    let ti = (li / 16u) * 4u;
    let tj = (li % 16u) * 4u;
    var sum: array<f32, 16>;
    for (var k0 = 0u; k0 < kn; k0 += BK) {
        for (var r = 0u; r < 4u; r++) {
            let e = li + r * 256u;
            let ka = k0 + e / BM;
            let ia = i0 + e % BM;
            var va = 0.0;
            if (ia < mn && ka < kn) { va = A[p.a_off + ia * p.a_si + ka * p.a_sk]; }
            ta[e] = va;
            let kb = k0 + e / BN;
            let jb = j0 + e % BN;
            var vb = 0.0;
            if (jb < nn && kb < kn) { vb = B[p.b_off + kb * p.b_sk + jb * p.b_sj]; }
            tb[e] = vb;
        }
        workgroupBarrier();
        let kend = min(BK, kn - k0);
        for (var kk = 0u; kk < kend; kk++) {
            for (var r = 0u; r < 4u; r++) {
                let a = ta[kk * BM + ti + r];
                for (var c = 0u; c < 4u; c++) {
                    sum[r * 4u + c] += a * tb[kk * BN + tj + c];
                }
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r++) {
        for (var c = 0u; c < 4u; c++) {
            let i = i0 + ti + r;
            let j = j0 + tj + c;
            if (i < mn && j < nn) {
                let o = p.c_off + i * p.c_si + j * p.c_sj;
                var v = p.scale * sum[r * 4u + c];
                if (p.acc != 0u) { v += C[o]; }
                C[o] = v;
            }
        }
    }
}

@compute @workgroup_size(64)
fn chunk_sum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * (nwg.x * 64u);
    let nt = step_s.n_tokens;
    if (idx >= nt * q.cols) { return; }
    let t = idx / q.cols;
    let c = idx % q.cols;
    var s = 0.0;
    for (var k = 0u; k < q.chunks; k++) {
        s += sums[(k * nt + t) * q.cols + c];
    }
    let o = q.dx_off + t * q.dx_stride + c;
    if (q.acc != 0u) { s += dx[o]; }
    dx[o] = s;
}
