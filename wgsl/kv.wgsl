// KV-cache write: copy the step's t new K and V rows into one layer's caches (of {{KV}}, f32 or f16: a value is
// rounded to the cache's type as it is stored).
// Bindings: 0 src     (storage, read)       f32 [t, src_stride]   e.g. the fused QKV [t, (nh + 2*nkv) * hd]
//           1 k_cache (storage, read_write) KV  [n_ctx, kvd]      kvd = n_kv_head * head_dim, row = position
//           2 v_cache (storage, read_write) KV  [n_ctx, kvd]      same layout as k_cache
//           3 step    (uniform Step)        pos, n_tokens (= t), n_ctx
//           4 params  (uniform KvParams)    kvd, src_stride, k_offset, v_offset, n_ctx (all in floats / rows)
// Math: k_cache[pos + j, c] = src[j * src_stride + k_offset + c],  v_cache[pos + j, c] = src[j * src_stride + v_offset + c]
//       for j < n_tokens, c < kvd; a row at or past n_ctx is dropped (the engine never asks for one).
// One invocation per (j, c); the grid is lab.ops.groups_1d(t * kvd, {{WG}}), folded into y past the per-dimension limit.

{{KV_ENABLE}}
//!include common.wgsl

struct KvParams { kvd: u32, src_stride: u32, k_offset: u32, v_offset: u32, n_ctx: u32, _p0: u32, _p1: u32, _p2: u32 };

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> k_cache: array<{{KV}}>;
@group(0) @binding(2) var<storage, read_write> v_cache: array<{{KV}}>;
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: KvParams;

const WG: u32 = {{WG}}u;

@compute @workgroup_size(WG)
fn kv_write(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = (wid.y * nwg.x + wid.x) * WG + lid;
    if (e >= step.n_tokens * p.kvd) { return; }
    let j = e / p.kvd;
    let c = e % p.kvd;
    let row = step.pos + j;
    if (row >= p.n_ctx) { return; }
    let s = j * p.src_stride;
    k_cache[row * p.kvd + c] = {{KV}}(src[s + p.k_offset + c]);
    v_cache[row * p.kvd + c] = {{KV}}(src[s + p.v_offset + c]);
}
