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
// Math: invocation (g, k, q) owns group g of 8 columns (quant.wgsl: 4 at e = group_base(g, HALF), 4 at e + HALF),
//   tokens 4q .. 4q + 3 and chunk k, rows r0 = k * chunk_rows .. min(r0 + chunk_rows, n_rows) - 1 of the part; it
//   dequantizes each row's group once for its four tokens and adds dy[t, first_row + r] * W[r, e..] over the rows
//   in order r0, r0 + 1, ...: 8 x 4 running sums, stored to sums[chunk0 + k] (tokens >= n_tokens are not stored).
// Why this shape (a GPU's parallelism, determinism): dx is a product whose long dimension, the one summed, runs
//   across W's rows, the transpose of the forward's. Tokens and columns alone give cols / 8 * ceil(t / 4)
//   invocations (512 for a 4096-wide input at t = 1), each walking every row: too few to keep a GPU's memory busy and,
//   on lavapipe, a loop past its 32,768-iteration budget for a vocabulary's rows (tests/kernels/test_loop_budget.py).
//   So the rows are cut into chunks (dx_back picks chunk_rows so that the grid reaches ~2^17 invocations, within 256
//   to 4096 rows a chunk), each chunk summed by its own invocations, and a second pass sums the chunks. Both sums run
//   in a fixed order (rows in order within a chunk, chunks in order, a part's chunks after the previous part's), no
//   two invocations write one value and WGSL has no float atomics to tempt: every run gives the same bits. The
//   alternatives: one workgroup per column chunk reducing rows across its threads in workgroup memory needs barriers
//   (lavapipe and SwiftShader pay for each) and still caps the grid at the column count; float atomics do not exist
//   and a u32 compare-and-swap sum adds in scheduling order. Consecutive invocations take consecutive groups of one
//   row, so a workgroup's weight reads are one contiguous run of the row's bytes and its dy reads one broadcast.
//   The scratch costs chunks * n_tokens * cols floats, written once and read once: 128 bytes an invocation against
//   the >= 256 rows of weights it reads.
// Grid: (ceil(gpr / {{WG}}), the part's chunks, ceil(n_tokens / 4)). Constants: DQ, HALF, WG.

//!include common.wgsl
//!include quant.wgsl

struct Params { n_rows: u32, cols: u32, gpr: u32, row_bytes: u32, first_row: u32, chunk_rows: u32, chunk0: u32,
                dy_off: u32, dy_stride: u32, _p0: u32, _p1: u32, _p2: u32 };

const HALF: u32 = {{HALF}}u;
const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> sums: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

// dy of tokens t0 .. t0 + 3 at the weight's row r; a token past the step reads the last one (its sums are never
// stored), so no read leaves the step's rows.
fn dy4(t0: u32, r: u32) -> vec4<f32> {
    let last = step.n_tokens - 1u;
    let o = p.dy_off + r;
    return vec4<f32>(dy[o + min(t0, last) * p.dy_stride], dy[o + min(t0 + 1u, last) * p.dy_stride],
                     dy[o + min(t0 + 2u, last) * p.dy_stride], dy[o + min(t0 + 3u, last) * p.dy_stride]);
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
    let t0 = 4u * gid.z;
    if (g >= p.gpr || t0 >= step.n_tokens) { return; }
    let r0 = gid.y * p.chunk_rows;
    let r1 = min(r0 + p.chunk_rows, p.n_rows);
    var l0 = vec4<f32>(0.0);  var h0 = vec4<f32>(0.0);    // token t0: columns e.., e + HALF..
    var l1 = vec4<f32>(0.0);  var h1 = vec4<f32>(0.0);
    var l2 = vec4<f32>(0.0);  var h2 = vec4<f32>(0.0);
    var l3 = vec4<f32>(0.0);  var h3 = vec4<f32>(0.0);
    for (var r = r0; r < r1; r++) {
        let w = {{DQ}}(r * p.row_bytes, g);
        let d = dy4(t0, p.first_row + r);
        l0 += d.x * w.lo;  h0 += d.x * w.hi;
        l1 += d.y * w.lo;  h1 += d.y * w.hi;
        l2 += d.z * w.lo;  h2 += d.z * w.hi;
        l3 += d.w * w.lo;  h3 += d.w * w.hi;
    }
    let e = group_base(g, HALF);
    let k = p.chunk0 + gid.y;
    put(k, t0, e, l0, h0);
    put(k, t0 + 1u, e, l1, h1);
    put(k, t0 + 2u, e, l2, h2);
    put(k, t0 + 3u, e, l3, h3);
}
