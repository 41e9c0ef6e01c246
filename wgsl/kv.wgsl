// KV-cache write: copy the step's t new K and V rows into one layer's caches, f32 or f16 (KV32 / KV16 below).
// Bindings: 0 src     (storage, read)       f32 [t, src_stride]   e.g. the fused QKV [t, (nh + 2*nkv) * hd]
//           1 k_cache (storage, read_write) [n_ctx, kvd] values   kvd = n_kv_head * head_dim, row = position
//           2 v_cache (storage, read_write) [n_ctx, kvd] values   same layout as k_cache
//           3 step    (uniform Step)        pos, n_tokens (= t), n_ctx
//           4 params  (uniform KvParams)    kvd, src_stride, k_offset, v_offset, n_ctx (all in floats / rows)
// Math: k_cache[pos + j, c] = src[j * src_stride + k_offset + c],  v_cache[pos + j, c] = src[j * src_stride + v_offset + c]
//       for j < n_tokens, c < kvd; a row at or past n_ctx is dropped (the engine never asks for one).
// The cache's values: KV32 ("" or "// ", lab/ops/attention.py kv_consts) an array<f32>; KV16 IEEE halves two to a
// u32 word (value c in bits 16 (c % 2) of word c / 2), written with pack2x16float: core WGSL, so the f16 cache needs
// no shader-f16 (which the page on NVIDIA/Linux lacks without a browser flag). Each value is rounded to f16 on store.
// One invocation per (j, pair of columns c = 2e, 2e + 1): a pair is one f16 word (kvd is even); the grid is
// lab.ops.groups_1d(t * kvd / 2, {{WG}}), folded into y past the per-dimension limit.

//!include common.wgsl

struct KvParams { kvd: u32, src_stride: u32, k_offset: u32, v_offset: u32, n_ctx: u32, _p0: u32, _p1: u32, _p2: u32 };

@group(0) @binding(0) var<storage, read> src: array<f32>;
{{KV32}}@group(0) @binding(1) var<storage, read_write> k_cache: array<f32>;
{{KV32}}@group(0) @binding(2) var<storage, read_write> v_cache: array<f32>;
{{KV16}}@group(0) @binding(1) var<storage, read_write> k_cache: array<u32>;
{{KV16}}@group(0) @binding(2) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: KvParams;

const WG: u32 = {{WG}}u;

// Values i, i + 1 (i even) of both caches.
{{KV32}}fn put(i: u32, k: vec2<f32>, v: vec2<f32>) {
{{KV32}}    k_cache[i] = k.x;
{{KV32}}    k_cache[i + 1u] = k.y;
{{KV32}}    v_cache[i] = v.x;
{{KV32}}    v_cache[i + 1u] = v.y;
{{KV32}}}
{{KV16}}fn put(i: u32, k: vec2<f32>, v: vec2<f32>) {
{{KV16}}    k_cache[i / 2u] = pack2x16float(k);
{{KV16}}    v_cache[i / 2u] = pack2x16float(v);
{{KV16}}}

@compute @workgroup_size(WG)
fn kv_write(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = (wid.y * nwg.x + wid.x) * WG + lid;
    let pairs = p.kvd / 2u;
    if (e >= step.n_tokens * pairs) { return; }
    let j = e / pairs;
    let c = 2u * (e % pairs);
    let row = step.pos + j;
    if (row >= p.n_ctx) { return; }
    let k = p.k_offset + j * p.src_stride + c;
    let v = p.v_offset + j * p.src_stride + c;
    put(row * p.kvd + c, vec2<f32>(src[k], src[k + 1u]), vec2<f32>(src[v], src[v + 1u]));
}
