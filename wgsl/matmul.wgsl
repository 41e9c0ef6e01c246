// Matrix-matrix product for a step of t tokens (prefill), dequantizing each weight tile once.
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks)
//           1 x (storage, read: array<f32>, token i's input at x_off + i * x_stride)
//           2 y (storage, read_write: array<f32>, token i's output at y_off + i * y_stride)
//           3 p (uniform Params)
//           4 stp (uniform Step: pos, n_tokens, n_ctx; t = n_tokens)
// Math: Y[i, r] = (acc ? Y[i, r] : 0) + sum_c W[r, c] * X[i, c],  i < t, r < n_rows of this part.
// Uniform fields: n_rows, cols, gpr (= cols / 8), row_bytes, x_off, y_off (floats; y_off includes the
//   part's first row), x_stride, y_stride (floats per token), acc (0 or 1).
// Organisation: a workgroup owns a tile of TR = 32 rows x TT = 16 tokens and walks the columns in
//   chunks of KC = 64. Per chunk, the 128 threads dequantize the 32 x 64 weight tile into shared memory
//   (2 groups of 8 values per thread: each weight decoded once per tile, reused for all 16 tokens) and
//   load the 16 x 64 input tile; then each thread accumulates 2 rows x 2 tokens from shared memory.
//   Rows of shared tiles are padded to 65 floats against bank conflicts. Shared memory: 12,480 bytes.
//   A chunk past the end of a row (cols not a multiple of 64) holds whole groups (see quant.wgsl) and
//   is zero-filled past cols.
// Constants: DQ (dequant function, e.g. dq_q4_k), HALF (its group shape).
// Grid: (ceil(n_rows / 32), ceil(t / 16), 1).

struct Params { n_rows: u32, cols: u32, gpr: u32, row_bytes: u32, x_off: u32, y_off: u32,
                x_stride: u32, y_stride: u32, acc: u32, _p0: u32, _p1: u32, _p2: u32 };
struct Step { pos: u32, n_tokens: u32, n_ctx: u32, _pad: u32 };

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> stp: Step;

//!include quant.wgsl

const HALF: u32 = {{HALF}}u;
const TR: u32 = 32u;
const TT: u32 = 16u;
const KC: u32 = 64u;
const KP: u32 = 65u;     // padded row length of the shared tiles
const WG: u32 = 128u;

var<workgroup> ws: array<f32, 2080>;   // TR * KP dequantized weights
var<workgroup> xs: array<f32, 1040>;   // TT * KP inputs

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.x * TR;
    let tok0 = wid.y * TT;
    let nt = stp.n_tokens;
    let last = p.n_rows - 1u;
    let tr = lid % 16u;     // rows tr, tr + 16 of the tile
    let tt = lid / 16u;     // tokens tt, tt + 8 of the tile
    var a00 = 0.0; var a01 = 0.0; var a10 = 0.0; var a11 = 0.0;   // a[row][token]

    for (var k0 = 0u; k0 < p.cols; k0 += KC) {
        // Weight tile: TR rows x KC / 8 groups = 256 groups, two per thread.
        for (var i = 0u; i < 2u; i++) {
            let idx = lid + i * WG;
            let r = idx / 8u;
            let g = k0 / 8u + idx % 8u;
            let o = r * KP + group_base(g, HALF) - k0;
            var v = Dq(vec4<f32>(0.0), vec4<f32>(0.0));
            if (g < p.gpr) { v = {{DQ}}(min(row0 + r, last) * p.row_bytes, g); }
            ws[o] = v.lo.x; ws[o + 1u] = v.lo.y; ws[o + 2u] = v.lo.z; ws[o + 3u] = v.lo.w;
            ws[o + HALF] = v.hi.x; ws[o + HALF + 1u] = v.hi.y; ws[o + HALF + 2u] = v.hi.z; ws[o + HALF + 3u] = v.hi.w;
        }
        // Input tile: TT tokens x KC columns, eight per thread (consecutive threads, consecutive columns).
        for (var i = 0u; i < 8u; i++) {
            let idx = lid + i * WG;
            let t = idx / KC;
            let c = idx % KC;
            var v = 0.0;
            if (tok0 + t < nt && k0 + c < p.cols) { v = x[p.x_off + (tok0 + t) * p.x_stride + k0 + c]; }
            xs[t * KP + c] = v;
        }
        workgroupBarrier();
        let w0 = tr * KP;
        let w1 = (tr + 16u) * KP;
        let x0 = tt * KP;
        let x1 = (tt + 8u) * KP;
        for (var k = 0u; k < KC; k++) {
            let wa = ws[w0 + k];
            let wb = ws[w1 + k];
            let xa = xs[x0 + k];
            let xb = xs[x1 + k];
            a00 += wa * xa; a01 += wa * xb; a10 += wb * xa; a11 += wb * xb;
        }
        workgroupBarrier();
    }

    let ra = row0 + tr;
    let rb = row0 + tr + 16u;
    let ta = tok0 + tt;
    let tb = tok0 + tt + 8u;
    store(ra, ta, a00);
    store(ra, tb, a01);
    store(rb, ta, a10);
    store(rb, tb, a11);
}

fn store(r: u32, t: u32, v: f32) {
    if (r < p.n_rows && t < stp.n_tokens) {
        let o = p.y_off + t * p.y_stride + r;
        var s = v;
        if (p.acc != 0u) { s += y[o]; }
        y[o] = s;
    }
}
