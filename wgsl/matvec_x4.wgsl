// matvec.wgsl's input read four floats at a time, where x_off is a multiple of 4 (cols always is: whole groups
// of 8). One vec4 load instead of four scalar ones: a K loop's thread reads runs of 16 inputs 64 bytes apart
// from its neighbours', and as scalars those loads, not the weights, bounded the Q4_K matvec at 0.8 TB/s on
// the H200. The K loops need this view; IN picks the prologue as in matvec_x1.wgsl.
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
{{NORM}}@group(0) @binding({{B_NW}}) var<storage, read> nw: array<vec4<f32>>;

fn in_plain(e: u32) -> vec4<f32> { return x[(x_base + e) >> 2u]; }
{{NORM}}fn in_norm(e: u32) -> vec4<f32> { let v = x[(x_base + e) >> 2u]; ss += dot(v, v); return v * nw[e >> 2u]; }
fn in_glu(e: u32) -> vec4<f32> {
    let g = x[(x_base + e) >> 2u];
    return vec4<f32>({{ACT}}(g.x), {{ACT}}(g.y), {{ACT}}(g.z), {{ACT}}(g.w)) * x[(x_base + p.up_off + e) >> 2u];
}

// Four input values from element e (a multiple of 4).
fn in4(e: u32) -> vec4<f32> { return {{IN}}(e); }

{{NORM}}fn store_xn(lid: u32, inv_rms: f32) {
{{NORM}}    for (var c = lid; c < p.cols / 4u; c += WG) {
{{NORM}}        let v = x[(p.x_off >> 2u) + c] * inv_rms * nw[c];
{{NORM}}        let o = p.xn_off + 4u * c;
{{NORM}}        xn[o] = v.x; xn[o + 1u] = v.y; xn[o + 2u] = v.z; xn[o + 3u] = v.w;
{{NORM}}    }
{{NORM}}}
