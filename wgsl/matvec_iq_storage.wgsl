// matvec_iq.wgsl's grid in a storage binding (the default home): ggml's table as it is, bound at {{B_GRID}}, one more
// storage buffer of the kernel (lab/ops/matmul.py matvec_storage counts it). Point p of an 8-value grid is G[p] (value
// k is byte k of its 8), of a 4-value grid (IQ3) half p % 2 of G[p / 2]. The buffer is kind CONSTANT, made once per
// owner by lab/gpu/shaders.py KernelCache.table from lab/format/iq_grids.py. Unlike the private arrays, it costs
// nothing to compile and is read through the cache as the weights are, but it is one more binding.
// Each home gives a point's raw bytes (gw8: two words, gw4: one; byte k = value k, IQ1's as int8); the loop's value
// file (IQV) makes the values.
@group(0) @binding({{B_GRID}}) var<storage, read> G: array<vec2<u32>>;

// Nothing to stage: the table is read in place.
fn grid_load(lid: u32) {}

fn gw8(p: u32) -> vec2<u32> { return G[p]; }

fn gw4(p: u32) -> u32 { return G[p >> 1u][p & 1u]; }
