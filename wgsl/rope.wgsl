// Rotary position embedding, in place, on heads inside token rows (Q, K, or both of a fused QKV row).
// Bindings: 0 x (storage, read_write)  1 freqs (storage, read: n_rot/2 floats)  2 p (uniform Params)  3 step (uniform Step)
// Math: for pair i < n_rot/2 of head h of token j:  theta = (step.pos + j) * freqs[i]  (freqs[i] = freq_scale *
//       base^(-2i/n_rot) / factor_i, computed by Python in f64),  (x0, x1) <- (x0 cos - x1 sin, x0 sin + x1 cos);
//       dims n_rot..head_dim-1 pass through untouched.
//   rope_adjacent: pair (2i, 2i+1)       (llama-family GGUF, llama.cpp rope mode 0)
//   rope_neox:     pair (i, i + n_rot/2) (Qwen, Gemma: llama.cpp mode 2)
// Params { n_head, head_dim, half (= n_rot/2), row_stride, col_offset, n_q_head, n_ctx, _p: u32 }
//   head h of token j starts at float  j*row_stride + col_offset + h*head_dim.
// Grid: (ceil(n_head*half / {{WG}}), t, 1), one invocation per (token, head, pair).
//
// rope_kv_adjacent / rope_kv_neox: the same rotation of a fused [q | k | v] row (n_head = Q heads + K heads, the
// K heads from head n_q_head on, V right after them), and the step's K (rotated) and V rows written into cache
// row pos + j (rows at or past n_ctx dropped):  a decode step saves the separate KV-write dispatch, which on a GPU
// costs more in the switch between dependent kernels (~2 us) than its copy.
//   Bindings 4 k_cache, 5 v_cache (storage, read_write) [n_ctx, kvd] values, kvd = (n_head - n_q_head) * head_dim:
//   f32 (KV32) or f16 two to a u32 word (KV16, wgsl/kv.wgsl's layout; pack2x16float rounds each value).
//   Grid: (ceil(n_head*head_dim/4 / {{WG}}), t, 1), one invocation per (token, head, slots 2s and 2s + 1 of the
//   head_dim/2): slot i < half rotates pair i; a slot past half carries dims n_rot + 2(i - half) and the next one
//   through unrotated (partial rotary); invocation e < kvd/4 of the token also copies V values 4e .. 4e + 3.

//!include common.wgsl
//!include rotary.wgsl

struct Params { n_head: u32, head_dim: u32, half: u32, row_stride: u32,
                col_offset: u32, n_q_head: u32, n_ctx: u32, _p: u32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> freqs: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;
{{KV32}}@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
{{KV32}}@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;
{{KV16}}@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
{{KV16}}@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;

// Indices (within the head) of the two elements pair i rotates.
fn pair_adjacent(i: u32) -> vec2<u32> { return vec2<u32>(2u * i, 2u * i + 1u); }
fn pair_neox(i: u32) -> vec2<u32> { return vec2<u32>(i, i + p.half); }

// Pair i of the head starting at float `base`, of token `row`, rotated in place; returns the pair's indices
// within the head and the rotated values (shared by both entries' kinds, so the rotation is written once).
struct Turned { ab: vec2<u32>, y: vec2<f32> };
fn turn(base: u32, row: u32, i: u32, neox: bool) -> Turned {
    var ab: vec2<u32>;
    if (neox) { ab = pair_neox(i); } else { ab = pair_adjacent(i); }
    let cs = cos_sin(f32(step.pos + row) * freqs[i]);
    let x0 = x[base + ab.x];
    let x1 = x[base + ab.y];
    let y = vec2<f32>(x0 * cs.x - x1 * cs.y, x0 * cs.y + x1 * cs.x);
    x[base + ab.x] = y.x;
    x[base + ab.y] = y.y;
    return Turned(ab, y);
}

fn rotate(gid: vec3<u32>, neox: bool) {
    let row = gid.y;
    let q = gid.x;
    if (row >= step.n_tokens || q >= p.n_head * p.half) { return; }
    turn(row * p.row_stride + p.col_offset + (q / p.half) * p.head_dim, row, q % p.half, neox);
}

@compute @workgroup_size(WG)
fn rope_adjacent(@builtin(global_invocation_id) gid: vec3<u32>) { rotate(gid, false); }

@compute @workgroup_size(WG)
fn rope_neox(@builtin(global_invocation_id) gid: vec3<u32>) { rotate(gid, true); }

// The fused variant (header): rotate in place as above, and write K and V into the caches. One invocation per (token,
// head, pair of slots 2s, 2s + 1): the four values of K they leave are two whole f16 words of the cache (KV16) in
// either pairing (neox: slots i, i + 1 rotate dims i, i + 1 and i + half, i + half + 1, so half must be even; the
// builder checks), and no other invocation touches them, so no word is shared between two writers.

// Slot i of the head at `base`: pair i rotated (i < half), or dims n_rot + 2 (i - half) and the next carried over.
fn slot(base: u32, row: u32, i: u32, neox: bool) -> Turned {
    if (i < p.half) { return turn(base, row, i, neox); }
    let ab = vec2<u32>(2u * i, 2u * i + 1u);     // past n_rot: the same dims in either pairing
    return Turned(ab, vec2<f32>(x[base + ab.x], x[base + ab.y]));
}

// The values two slots leave, into the K cache row at c (f32: one value at a time; f16: the two words they fill).
{{KV32}}fn put_k(c: u32, a: Turned, b: Turned) {
{{KV32}}    k_cache[c + a.ab.x] = a.y.x;
{{KV32}}    k_cache[c + a.ab.y] = a.y.y;
{{KV32}}    k_cache[c + b.ab.x] = b.y.x;
{{KV32}}    k_cache[c + b.ab.y] = b.y.y;
{{KV32}}}
{{KV16}}fn put_k(c: u32, a: Turned, b: Turned) {
{{KV16}}    if (a.ab.y == a.ab.x + 1u) {        // adjacent pairs, or dims past n_rot: each slot's two dims are a word
{{KV16}}        k_cache[(c + a.ab.x) / 2u] = pack2x16float(a.y);
{{KV16}}        k_cache[(c + b.ab.x) / 2u] = pack2x16float(b.y);
{{KV16}}    } else {                            // neox pairs: dims i, i + 1 and i + half, i + half + 1
{{KV16}}        k_cache[(c + a.ab.x) / 2u] = pack2x16float(vec2<f32>(a.y.x, b.y.x));
{{KV16}}        k_cache[(c + a.ab.y) / 2u] = pack2x16float(vec2<f32>(a.y.y, b.y.y));
{{KV16}}    }
{{KV16}}}
{{KV32}}fn put_v(c: u32, v: vec4<f32>) {
{{KV32}}    v_cache[c] = v.x;
{{KV32}}    v_cache[c + 1u] = v.y;
{{KV32}}    v_cache[c + 2u] = v.z;
{{KV32}}    v_cache[c + 3u] = v.w;
{{KV32}}}
{{KV16}}fn put_v(c: u32, v: vec4<f32>) {
{{KV16}}    v_cache[c / 2u] = pack2x16float(v.xy);
{{KV16}}    v_cache[c / 2u + 1u] = pack2x16float(v.zw);
{{KV16}}}

fn rotate_kv(gid: vec3<u32>, neox: bool) {
    let row = gid.y;
    let e = gid.x;
    let quads = p.head_dim / 4u;           // slot pairs a head
    if (row >= step.n_tokens || e >= p.n_head * quads) { return; }
    let h = e / quads;
    let i = 2u * (e % quads);
    let base = row * p.row_stride + p.col_offset + h * p.head_dim;
    let a = slot(base, row, i, neox);
    let b = slot(base, row, i + 1u, neox);
    let pos = step.pos + row;
    if (pos >= p.n_ctx) { return; }
    let kvd = (p.n_head - p.n_q_head) * p.head_dim;
    if (h >= p.n_q_head) {
        put_k(pos * kvd + (h - p.n_q_head) * p.head_dim, a, b);
    }
    if (4u * e < kvd) {     // V sits right after the K heads in the row, never rotated: values 4e .. 4e + 3
        let v = row * p.row_stride + p.col_offset + p.n_head * p.head_dim + 4u * e;
        put_v(pos * kvd + 4u * e, vec4<f32>(x[v], x[v + 1u], x[v + 2u], x[v + 3u]));
    }
}

@compute @workgroup_size(WG)
fn rope_kv_adjacent(@builtin(global_invocation_id) gid: vec3<u32>) { rotate_kv(gid, false); }

@compute @workgroup_size(WG)
fn rope_kv_neox(@builtin(global_invocation_id) gid: vec3<u32>) { rotate_kv(gid, true); }
