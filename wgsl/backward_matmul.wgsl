// Projection backward, the input's gradient through a weight in any kernel type (the forward is matmul.wgsl /
// matvec.wgsl, y[t, r] = sum_c W[r, c] x[t, c]): dx[t, c] = sum_r W[r, c] dy[t, r], W read in place from its GGUF
// blocks by quant.wgsl's {{DQ}} (the base stays quantized; the same blocks and the same dequantization the forward
// reads). This is the first of two passes: it leaves, per chunk of rows, the chunk's partial sums in a scratch
// buffer; backward_gemm.wgsl's chunk_sum adds the chunks in order into dx (lab/ops/backward_matmul.py dx_back).
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks, its row r at byte r * row_bytes)
//           1 dy (storage, read: f32, token t's output gradient at dy_off + t * dy_stride, the part's row r at
//             first_row + r of it)
//           2 sums (storage, read_write: f32 partial sums, chunk k's token t at (k * n_tokens + t) * cols)
//           3 p (uniform Params)  4 step (uniform Step)
// Params { n_rows (this part's), cols, gpr (= cols / 8), row_bytes, first_row (the part's first row in the weight),
//          chunk_rows, chunk0 (the index of the part's first chunk among the weight's), dy_off, dy_stride, _p*3 }
// Math: invocation (g, k, z) owns group g of 8 columns (quant.wgsl: 4 at e = group_base(g, HALF), 4 at e + HALF),
//   tokens TQ z .. TQ z + TQ - 1 and chunk k, rows r0 = k * chunk_rows .. min(r0 + chunk_rows, n_rows) - 1 of the part; it
//   dequantizes each row's group once for its TQ tokens and adds dy[t, first_row + r] * W[r, e..] over the rows
//   in order r0, r0 + 1, ...: 8 x TQ running sums, stored to sums[chunk0 + k] (tokens >= n_tokens are not stored).
// Why this shape (a GPU's parallelism, determinism): dx is a product whose long dimension, the one summed, runs
//   across W's rows, the transpose of the forward's. Tokens and columns alone give cols / 8 * ceil(t / TQ)
//   invocations (512 for a 4096-wide input at t = 1), each walking every row: too few to keep a GPU's memory busy and,
//   on lavapipe, a loop past its 32,768-iteration budget for a vocabulary's rows (tests/kernels/test_loop_budget.py).
//   So the rows are cut into chunks (dx_back picks chunk_rows so that the grid reaches ~2^16 invocations, within 256
//   to 4096 rows a chunk), each chunk summed by its own invocations, and a second pass sums the chunks. Both sums run
//   in a fixed order (rows in order within a chunk, chunks in order, a part's chunks after the previous part's), no
//   two invocations write one value and WGSL has no float atomics to tempt: every run gives the same bits. The
//   alternatives: one workgroup per column chunk reducing rows across its threads in workgroup memory needs barriers
//   (lavapipe and SwiftShader pay for each) and still caps the grid at the column count; float atomics do not exist
//   and a u32 compare-and-swap sum adds in scheduling order. Consecutive invocations take consecutive groups of one
//   row, so a workgroup's weight reads are one contiguous run of the row's bytes and its dy reads one broadcast.
//   The scratch costs chunks * n_tokens * cols floats, written once and read once: 32 TQ bytes an invocation against
//   the >= 256 rows of weights it reads.
// TQ = 8: a row's dequantization (the scale, the block's bytes, the unpacking) shared by 8 tokens' FMAs: 3% faster
//   than 4 on the H100 (SmolLM2's training window, docs/performance.md), still ~2.5 TFLOP/s; what bounds it there is
//   not yet measured (the weights' reads, or dy's strided ones).
// Grid: (ceil(gpr / {{WG}}), the part's chunks, ceil(n_tokens / TQ)). Constants: DQ, HALF, WG, TQ.

//!include common.wgsl
//!include quant.wgsl

struct Params { n_rows: u32, cols: u32, gpr: u32, row_bytes: u32, first_row: u32, chunk_rows: u32, chunk0: u32,
                dy_off: u32, dy_stride: u32, _p0: u32, _p1: u32, _p2: u32 };

const HALF: u32 = {{HALF}}u;
const WG: u32 = {{WG}}u;
const TQ: u32 = {{TQ}}u;                  // tokens an invocation (lab.ops.backward_matmul DX_TOKENS)

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> sums: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

// Token t0 + q's dy at the weight's row r, q < TQ; a token past the step reads the last one (its sums are never
// stored), so no read leaves the step's rows.
fn dy_at(t0: u32, q: u32, r: u32) -> f32 {
    return dy[p.dy_off + r + min(t0 + q, step.n_tokens - 1u) * p.dy_stride];
}

// Token t's 8 sums of group g (its columns e .. e + 3 and e + HALF .. e + HALF + 3) into chunk k's slot.
fn put(k: u32, t: u32, e: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (t >= step.n_tokens) { return; }
    let o = (k * step.n_tokens + t) * p.cols + e;
    sums[o] = lo.x; sums[o + 1u] = lo.y; sums[o + 2u] = lo.z; sums[o + 3u] = lo.w;
    sums[o + HALF] = hi.x; sums[o + HALF + 1u] = hi.y; sums[o + HALF + 2u] = hi.z; sums[o + HALF + 3u] = hi.w;
}

@compute @workgroup_size(WG)
fn dx_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let g = gid.x;
    let t0 = TQ * gid.z;
    if (g >= p.gpr || t0 >= step.n_tokens) { return; }
    let r0 = gid.y * p.chunk_rows;
    let r1 = min(r0 + p.chunk_rows, p.n_rows);
    var lo: array<vec4<f32>, TQ>;             // token t0 + q: columns e.. (zero-initialised)
    var hi: array<vec4<f32>, TQ>;             // ... and e + HALF..
    for (var r = r0; r < r1; r++) {
        let w = {{DQ}}(r * p.row_bytes, g);
        for (var q = 0u; q < TQ; q++) {
            let d = dy_at(t0, q, p.first_row + r);
            lo[q] += d * w.lo;
            hi[q] += d * w.hi;
        }
    }
    let e = group_base(g, HALF);
    let k = p.chunk0 + gid.y;
    for (var q = 0u; q < TQ; q++) { put(k, t0 + q, e, lo[q], hi[q]); }
}
