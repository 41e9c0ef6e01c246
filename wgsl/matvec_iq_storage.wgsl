// matvec_iq.wgsl's grid in a storage binding (the default home): ggml's table as it is, bound at {{B_GRID}}, one more
// storage buffer of the kernel (lab/ops/matmul.py matvec_storage counts it). Point p of an 8-value grid is G[p] (value
// k is byte k of its 8), of a 4-value grid (IQ3) half p % 2 of G[p / 2]. The buffer is kind CONSTANT, made once per
// owner by lab/gpu/shaders.py KernelCache.table from lab/format/iq_grids.py. Unlike the private arrays, it costs
// nothing to compile and is read through the cache as the weights are, but it is one more binding.
// Constants: B_GRID, GV (gv_u: the IQ2 and IQ3 grids' unsigned bytes; gv_i: IQ1's int8).
@group(0) @binding({{B_GRID}}) var<storage, read> G: array<vec2<u32>>;

fn gv_u(w: u32) -> vec4<f32> { return vec4<f32>(u8x4(w)); }
fn gv_i(w: u32) -> vec4<f32> { return i8x4(w); }

fn g8(p: u32) -> Dq {
    let g = G[p];
    return Dq({{GV}}(g.x), {{GV}}(g.y));
}

fn g4(p: u32) -> vec4<f32> { return {{GV}}(G[p >> 1u][p & 1u]); }
