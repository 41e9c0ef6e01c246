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
//   Bindings 4 k_cache, 5 v_cache (storage, read_write) {{KV}} [n_ctx, kvd], kvd = (n_head - n_q_head) * head_dim
//   (f32 or f16: the values are rounded to the cache's type as they are stored).
//   Grid: (ceil(n_head*head_dim/2 / {{WG}}), t, 1), one invocation per (token, head, slot i < head_dim/2): slot
//   i < half rotates pair i; a slot past half carries dims n_rot + 2(i - half) and the next one through
//   unrotated (partial rotary); slot e < kvd/2 of the token also copies V elements 2e, 2e+1.

{{KV_ENABLE}}
//!include common.wgsl
//!include rotary.wgsl

struct Params { n_head: u32, head_dim: u32, half: u32, row_stride: u32,
                col_offset: u32, n_q_head: u32, n_ctx: u32, _p: u32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> freqs: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<storage, read_write> k_cache: array<{{KV}}>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<{{KV}}>;

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

// The fused variant (header): rotate in place as above, and write K and V into the caches.
fn rotate_kv(gid: vec3<u32>, neox: bool) {
    let row = gid.y;
    let e = gid.x;
    let slots = p.head_dim / 2u;
    if (row >= step.n_tokens || e >= p.n_head * slots) { return; }
    let h = e / slots;
    let i = e % slots;
    let base = row * p.row_stride + p.col_offset + h * p.head_dim;
    var ab: vec2<u32>;
    var y: vec2<f32>;
    if (i < p.half) {
        let r = turn(base, row, i, neox);
        ab = r.ab;
        y = r.y;
    } else {
        ab = vec2<u32>(2u * i, 2u * i + 1u);     // past n_rot: the same dims in either pairing
        y = vec2<f32>(x[base + ab.x], x[base + ab.y]);
    }
    let pos = step.pos + row;
    if (pos >= p.n_ctx) { return; }
    let kvd = (p.n_head - p.n_q_head) * p.head_dim;
    if (h >= p.n_q_head) {
        let c = pos * kvd + (h - p.n_q_head) * p.head_dim;
        k_cache[c + ab.x] = {{KV}}(y.x);
        k_cache[c + ab.y] = {{KV}}(y.y);
    }
    if (2u * e < kvd) {     // V sits right after the K heads in the row, never rotated
        let v = row * p.row_stride + p.col_offset + p.n_head * p.head_dim + 2u * e;
        v_cache[pos * kvd + 2u * e] = {{KV}}(x[v]);
        v_cache[pos * kvd + 2u * e + 1u] = {{KV}}(x[v + 1u]);
    }
}

@compute @workgroup_size(WG)
fn rope_kv_adjacent(@builtin(global_invocation_id) gid: vec3<u32>) { rotate_kv(gid, false); }

@compute @workgroup_size(WG)
fn rope_kv_neox(@builtin(global_invocation_id) gid: vec3<u32>) { rotate_kv(gid, true); }
