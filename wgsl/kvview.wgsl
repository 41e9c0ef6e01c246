// KV-cache magnitudes for the KV panel: the L2 norm of every cached K row and V row of one layer, positions a .. a+n-1.
// Bindings: 0 k_cache (storage, read)       [n_ctx, kvd]       one layer's K cache, row = position: f32 (KV32) or
//                                                              f16 two to a u32 word (KV16; wgsl/kv.wgsl's layout)
//           1 v_cache (storage, read)       [n_ctx, kvd]       the same layer's V cache
//           2 out     (storage, read_write) f32 [COLS, n_layer, 2]: out[(j * n_layer + layer) * 2 + w], w = 0 K, 1 V
//           3 span    (uniform Span)        a, n: the positions of this request (n <= COLS; rewritten per request)
//           4 p       (uniform LayerParams) layer, n_layer, kvd (fixed per layer at build)
// Math: out[j, layer, 0] = sqrt(sum_c k_cache[a + j, c]^2), out[j, layer, 1] likewise over v_cache, for j < n;
//       summed in f32 over the row's kvd = n_kv_head * head_dim floats (all KV heads of the layer).
// Organisation: one thread per (row j, K or V), e = 2 j + w, looping over the row; a row is a few hundred floats and
// a request a few dozen rows, so a reduction across threads would cost more in workgroup memory than it saves.
// Grid: lab.ops.groups_1d(2 n, {{WG}}) per layer, folded into y past the per-dimension limit; one dispatch per layer
// (a layer's two caches are two bindings; every layer at once would pass the storage-binding limit).

struct Span { a: u32, n: u32, _p0: u32, _p1: u32 };
struct LayerParams { layer: u32, n_layer: u32, kvd: u32, _p: u32 };

{{KV32}}@group(0) @binding(0) var<storage, read> k_cache: array<f32>;
{{KV32}}@group(0) @binding(1) var<storage, read> v_cache: array<f32>;
{{KV16}}@group(0) @binding(0) var<storage, read> k_cache: array<u32>;
{{KV16}}@group(0) @binding(1) var<storage, read> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> span: Span;
@group(0) @binding(4) var<uniform> p: LayerParams;

const WG: u32 = {{WG}}u;

// Value i of the K (w 0) or V (w 1) cache.
{{KV32}}fn value(w: u32, i: u32) -> f32 { if (w == 0u) { return k_cache[i]; } return v_cache[i]; }
{{KV16}}fn value(w: u32, i: u32) -> f32 {
{{KV16}}    var word: u32;
{{KV16}}    if (w == 0u) { word = k_cache[i / 2u]; } else { word = v_cache[i / 2u]; }
{{KV16}}    return unpack2x16float(word)[i % 2u];
{{KV16}}}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = (wid.y * nwg.x + wid.x) * WG + lid;
    if (e >= 2u * span.n) { return; }
    let j = e / 2u;
    let w = e % 2u;
    let base = (span.a + j) * p.kvd;
    var acc = 0.0;
    for (var c = 0u; c < p.kvd; c++) {
        let x = value(w, base + c);
        acc += x * x;
    }
    out[(j * p.n_layer + p.layer) * 2u + w] = sqrt(acc);
}
