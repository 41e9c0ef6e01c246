// Matrix-matrix product for a step of t tokens (prefill), dequantizing each weight tile once.
// Bindings, uniform fields and the output rule: matmul_io.wgsl (shared with matmul_lanes.wgsl).
// Math: Y[i, r] = (acc ? Y[i, r] : 0) + sum_c W[r, c] * X[i, c],  i < t, r < n_rows of this part.
// Organisation: a workgroup owns a tile of TR = 32 rows x TT = 32 tokens and walks the columns in
//   chunks of KC = 64. Per chunk, the 128 threads dequantize the 32 x 64 weight tile into workgroup
//   memory (2 groups of 8 values per thread: each weight decoded once per tile, reused for 32 tokens)
//   and load the 32 x 64 input tile; then each thread accumulates 2 rows x 4 tokens (two vec4s): per
//   column, two weight loads and one vec4 input load feed 8 multiply-adds. Both tiles are stored
//   column-major ([k][row], [k][token / 4] as vec4), which needs no padding against bank conflicts:
//   16,384 bytes of workgroup memory, WebGPU's default limit exactly.
//   A chunk past the end of a row (cols not a multiple of 64) holds whole groups (see quant.wgsl) and
//   is zero-filled past cols.
// Constants: DQ (dequant function, e.g. dq_q4_k), HALF (its group shape).
// Grid: (ceil(n_rows / 32), ceil(t / 32), 1).

//!include matmul_io.wgsl

//!include quant.wgsl

const HALF: u32 = {{HALF}}u;
const TR: u32 = 32u;
const TT: u32 = 32u;
const KC: u32 = 64u;
const WG: u32 = 128u;

var<workgroup> ws: array<f32, 2048>;         // [KC][TR] dequantized weights
var<workgroup> xs: array<vec4<f32>, 512>;    // [KC][TT / 4] inputs, 4 tokens a vec4

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.x * TR;
    let tok0 = wid.y * TT;
    let nt = stp.n_tokens;
    let last = p.n_rows - 1u;
    let tr = lid % 16u;     // rows tr, tr + 16 of the tile
    let tq = lid / 16u;     // tokens 4 tq .. 4 tq + 3 of the tile
    var a0 = vec4<f32>(0.0);   // row tr, four tokens
    var a1 = vec4<f32>(0.0);   // row tr + 16

    for (var k0 = 0u; k0 < p.cols; k0 += KC) {
        // Weight tile: TR rows x KC / 8 groups = 256 groups, two per thread.
        for (var i = 0u; i < 2u; i++) {
            let idx = lid + i * WG;
            let r = idx / 8u;
            let g = k0 / 8u + idx % 8u;
            let e = group_base(g, HALF) - k0;
            var v = Dq(vec4<f32>(0.0), vec4<f32>(0.0));
            if (g < p.gpr) { v = {{DQ}}(min(row0 + r, last) * p.row_bytes, g); }
            ws[e * TR + r] = v.lo.x; ws[(e + 1u) * TR + r] = v.lo.y;
            ws[(e + 2u) * TR + r] = v.lo.z; ws[(e + 3u) * TR + r] = v.lo.w;
            ws[(e + HALF) * TR + r] = v.hi.x; ws[(e + HALF + 1u) * TR + r] = v.hi.y;
            ws[(e + HALF + 2u) * TR + r] = v.hi.z; ws[(e + HALF + 3u) * TR + r] = v.hi.w;
        }
        // Input tile: TT tokens x KC columns, sixteen per thread (consecutive threads, consecutive columns).
        for (var i = 0u; i < 16u; i++) {
            let idx = lid + i * WG;
            let t = idx / KC;
            let c = idx % KC;
            var v = 0.0;
            if (tok0 + t < nt && k0 + c < p.cols) { v = x[p.x_off + (tok0 + t) * p.x_stride + k0 + c]; }
            xs[c * (TT / 4u) + t / 4u][t % 4u] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < KC; k++) {
            let xv = xs[k * (TT / 4u) + tq];
            a0 += ws[k * TR + tr] * xv;
            a1 += ws[k * TR + tr + 16u] * xv;
        }
        workgroupBarrier();
    }

    for (var j = 0u; j < 4u; j++) {
        store(row0 + tr, tok0 + 4u * tq + j, a0[j]);
        store(row0 + tr + 16u, tok0 + 4u * tq + j, a1[j]);
    }
}
