// Activations quantized to 8 bits per block of 32, as llama.cpp's q8_1 does, for matmul_i8.wgsl.
// Bindings: 0 x (storage, read: array<f32>, token i's row at x_off + i * x_stride)
//           1 xq (storage, read_write: array<u32>, token i's cols int8 values packed four a word at word
//             i * cols / 4: the row-major [t, cols] int8 matrix the GEMM's left operand loads)
//           2 xd (storage, read_write: array<vec2<f32>>, per token and block b: (d, d * sum of its q))
//           3 p (uniform Params)
//           4 step (uniform Step; t = n_tokens)
// Math: per block of 32 inputs, d = max|x| / 127 and q = round(x * (127 / max|x|)) in -127..127 (all zero for a zero
//   block), so x ~ d * q. The GEMM's offset term (Q4_1's min, Q4_0's -8) multiplies d * sum(q), the sum of the
//   quantized inputs, as llama.cpp's q8_1 `s` field does.
// Grid: (ceil(t * nb / 64), 1, 1), one invocation per (token, block).

//!include common.wgsl

struct Params { cols: u32, nb: u32, x_off: u32, x_stride: u32 };

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> xq: array<u32>;
@group(0) @binding(2) var<storage, read_write> xd: array<vec2<f32>>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let tok = gid.x / p.nb;
    let b = gid.x % p.nb;
    if (tok >= step.n_tokens) { return; }
    let base = p.x_off + tok * p.x_stride + 32u * b;
    var amax = 0.0;
    for (var k = 0u; k < 32u; k++) { amax = max(amax, abs(x[base + k])); }
    let id = select(0.0, 127.0 / amax, amax > 0.0);
    var sum = 0;
    let out = (tok * p.cols + 32u * b) / 4u;
    for (var w = 0u; w < 8u; w++) {
        let o = base + 4u * w;
        let q = vec4<i32>(round(vec4<f32>(x[o], x[o + 1u], x[o + 2u], x[o + 3u]) * id));
        sum += q.x + q.y + q.z + q.w;
        xq[out + w] = pack4xI8(q);
    }
    let d = amax / 127.0;
    xd[tok * p.nb + b] = vec2<f32>(d, d * f32(sum));
}
