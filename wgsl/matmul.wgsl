// Matrix-matrix product for a step of t tokens (prefill), dequantizing each weight tile once.
// Bindings, uniform fields and the output rule: matmul_io.wgsl (shared with matmul_lanes.wgsl).
// Math: Y[i, r] = (acc ? Y[i, r] : 0) + sum_c W[r, c] * X[i, c],  i < t, r < n_rows of this part.
// Organisation: a workgroup of 256 threads owns a tile of TR = 64 rows x TT = 64 tokens and walks the columns in
//   chunks of KC = 32. Per chunk its threads dequantize the 64 x 32 weight tile into workgroup memory (each weight
//   decoded once per tile, reused for 64 tokens) and load the 64 x 32 input tile; then each thread accumulates
//   4 rows x 4 tokens: per column one vec4 of weights and one vec4 of inputs feed 16 multiply-adds. (The first
//   version's 2 x 4 outputs a thread took three loads for 8: on the H200 SmolLM2's and Qwen2.5's prefill GEMMs
//   ran 1.5x longer with it.) Both tiles are stored column-major as vec4s ([k][row / 4], [k][token / 4]); the
//   input loads write consecutive floats, so no store hits one bank twice. 16,384 bytes of workgroup memory,
//   WebGPU's default limit exactly.
//   A chunk holds whole groups of 8 (see quant.wgsl) where HALF < 32. The K types' groups span 64 columns
//   (4 values at e0, 4 at e0 + 32): a chunk takes one half of each, so those groups are decoded twice.
//   Columns past cols (a partial last chunk) are zero-filled, weights and inputs both.
// Constants: DQ (dequant function, e.g. dq_q4_k), HALF (its group shape).
// Grid: (ceil(n_rows / 64), ceil(t / 64), 1).

//!include matmul_io.wgsl

//!include quant.wgsl

const HALF: u32 = {{HALF}}u;
const TR: u32 = 64u;
const TT: u32 = 64u;
const KC: u32 = 32u;
const WG: u32 = (TR / 4u) * (TT / 4u);

var<workgroup> ws: array<vec4<f32>, 512>;             // [KC][TR / 4] dequantized weights, 4 rows a vec4
var<workgroup> xs: array<vec4<f32>, 512>;             // [KC][TT / 4] inputs, 4 tokens a vec4

fn put_w(e: u32, r: u32, v: vec4<f32>) {    // chunk columns e..e+3 of tile row r
    let i = r / 4u;
    let j = r % 4u;
    ws[e * (TR / 4u) + i][j] = v.x;
    ws[(e + 1u) * (TR / 4u) + i][j] = v.y;
    ws[(e + 2u) * (TR / 4u) + i][j] = v.z;
    ws[(e + 3u) * (TR / 4u) + i][j] = v.w;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.x * TR;
    let tok0 = wid.y * TT;
    let nt = step.n_tokens;
    let last = p.n_rows - 1u;
    let tr = lid % 16u;     // rows 4 tr .. 4 tr + 3 of the tile
    let tq = lid / 16u;     // tokens 4 tq .. 4 tq + 3 of the tile
    var a0 = vec4<f32>(0.0);   // row 4 tr, four tokens
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);

    for (var k0 = 0u; k0 < p.cols; k0 += KC) {
        if (HALF < 32u) {
            // TR rows x 4 groups, each group's 8 values inside the chunk.
            for (var i = 0u; i < 256u / WG; i++) {
                let idx = lid + i * WG;
                let r = idx / 4u;
                let g = k0 / 8u + idx % 4u;
                let e = group_base(g, HALF) - k0;
                var v = Dq(vec4<f32>(0.0), vec4<f32>(0.0));
                if (g < p.gpr) { v = {{DQ}}(min(row0 + r, last) * p.row_bytes, g); }
                put_w(e, r, v.lo);
                put_w(e + HALF, r, v.hi);
            }
        } else {
            // TR rows x 8 quads; quad j is the low or the high half of group j of the chunk's 64-column span.
            for (var i = 0u; i < 512u / WG; i++) {
                let idx = lid + i * WG;
                let r = idx / 8u;
                let j = idx % 8u;
                let v = {{DQ}}(min(row0 + r, last) * p.row_bytes, (k0 / 64u) * 8u + j);
                put_w(4u * j, r, select(v.lo, v.hi, (k0 / 32u) % 2u == 1u));
            }
        }
        // Input tile: TT tokens x 8 quads of columns; consecutive threads take consecutive tokens.
        for (var i = 0u; i < 8u * TT / WG; i++) {
            let idx = lid + i * WG;
            let t = idx % TT;
            let c = 4u * (idx / TT);
            var v = vec4<f32>(0.0);
            if (tok0 + t < nt) {
                let o = p.x_off + (tok0 + t) * p.x_stride + k0 + c;
                for (var j = 0u; j < 4u; j++) {
                    if (k0 + c + j < p.cols) { v[j] = x[o + j]; }
                }
            }
            for (var j = 0u; j < 4u; j++) { xs[(c + j) * (TT / 4u) + t / 4u][t % 4u] = v[j]; }
        }
        workgroupBarrier();
        for (var k = 0u; k < KC; k++) {
            let xv = xs[k * (TT / 4u) + tq];
            let wv = ws[k * (TR / 4u) + tr];
            a0 += wv.x * xv;
            a1 += wv.y * xv;
            a2 += wv.z * xv;
            a3 += wv.w * xv;
        }
        workgroupBarrier();
    }

    for (var j = 0u; j < 4u; j++) {
        let t = tok0 + 4u * tq + j;
        store(row0 + 4u * tr, t, a0[j]);
        store(row0 + 4u * tr + 1u, t, a1[j]);
        store(row0 + 4u * tr + 2u, t, a2[j]);
        store(row0 + 4u * tr + 3u, t, a3[j]);
    }
}
