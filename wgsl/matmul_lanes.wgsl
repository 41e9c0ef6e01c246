// Matrix-matrix product for SwiftShader (the page without a GPU): matmul.wgsl's math, bindings and Params, with
// no workgroup memory and no barrier. SwiftShader runs a workgroup as 4-wide SIMD groups and switches them at
// every barrier; matmul.wgsl's 128-thread tiles paid for that more than they saved by sharing the dequantized
// weights (SmolLM2's 37-token prefill: lab/ops/matmul.py, matmul).
// Bindings, uniform fields and the output rule: matmul_io.wgsl (shared with matmul.wgsl).
// Math: Y[i, r] = (acc ? Y[i, r] : 0) + sum_c W[r, c] * X[i, c],  i < t, r < n_rows of this part.
// Organisation: every invocation owns 4 rows x 4 tokens and walks all of a row's groups of 8 (quant.wgsl's
//   {{DQ}}), each weight group dequantized once for the 4 tokens. Workgroups of 4 (one SIMD group).
// Constants: DQ, HALF. Grid: (ceil(n_rows / 16), ceil(t / 4), 1).

//!include matmul_io.wgsl

//!include quant.wgsl

const HALF: u32 = {{HALF}}u;
const WG: u32 = 4u;

// Four inputs of token t from element e; a token past the step reads the last one (its sums are never stored).
fn xin(t: u32, e: u32) -> vec4<f32> {
    let o = p.x_off + min(t, step.n_tokens - 1u) * p.x_stride + e;
    return vec4<f32>(x[o], x[o + 1u], x[o + 2u], x[o + 3u]);
}

fn dots(w: Dq, l0: vec4<f32>, h0: vec4<f32>, l1: vec4<f32>, h1: vec4<f32>, l2: vec4<f32>, h2: vec4<f32>,
        l3: vec4<f32>, h3: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(dot(w.lo, l0) + dot(w.hi, h0), dot(w.lo, l1) + dot(w.hi, h1),
                     dot(w.lo, l2) + dot(w.hi, h2), dot(w.lo, l3) + dot(w.hi, h3));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row0 = gid.x * 4u;
    let tok0 = gid.y * 4u;
    if (row0 >= p.n_rows || tok0 >= step.n_tokens) { return; }
    let last = p.n_rows - 1u;
    let rb = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)) * p.row_bytes;
    var a0 = vec4<f32>(0.0);   // row0, tokens tok0 .. tok0 + 3
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var g = 0u; g < p.gpr; g++) {
        let e = group_base(g, HALF);
        let l0 = xin(tok0, e);      let h0 = xin(tok0, e + HALF);
        let l1 = xin(tok0 + 1u, e); let h1 = xin(tok0 + 1u, e + HALF);
        let l2 = xin(tok0 + 2u, e); let h2 = xin(tok0 + 2u, e + HALF);
        let l3 = xin(tok0 + 3u, e); let h3 = xin(tok0 + 3u, e + HALF);
        a0 += dots({{DQ}}(rb.x, g), l0, h0, l1, h1, l2, h2, l3, h3);
        a1 += dots({{DQ}}(rb.y, g), l0, h0, l1, h1, l2, h2, l3, h3);
        a2 += dots({{DQ}}(rb.z, g), l0, h0, l1, h1, l2, h2, l3, h3);
        a3 += dots({{DQ}}(rb.w, g), l0, h0, l1, h1, l2, h2, l3, h3);
    }
    for (var j = 0u; j < 4u; j++) {
        store(row0, tok0 + j, a0[j]);
        store(row0 + 1u, tok0 + j, a1[j]);
        store(row0 + 2u, tok0 + j, a2[j]);
        store(row0 + 3u, tok0 + j, a3[j]);
    }
}
