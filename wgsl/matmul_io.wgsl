// The prefill projection's interface (included by matmul.wgsl and matmul_lanes.wgsl, no entry points): the same
// bindings, Params and output rule for both kernels, so lab/ops/matmul.py binds either the same way.
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks)
//           1 x (storage, read: array<f32>, token i's input at x_off + i * x_stride)
//           2 y (storage, read_write: array<f32>, token i's output at y_off + i * y_stride)
//           3 p (uniform Params)
//           4 step (uniform Step: pos, n_tokens, n_ctx; t = n_tokens)
// Uniform fields: n_rows, cols, gpr (= cols / 8), row_bytes, x_off, y_off (floats; y_off includes the part's
//   first row), x_stride, y_stride (floats per token), acc (0 or 1).
// Math: store(r, t, v) writes Y[t, r] = (acc ? Y[t, r] : 0) + v for r < n_rows, t < n_tokens, nothing past them.

//!include common.wgsl

struct Params { n_rows: u32, cols: u32, gpr: u32, row_bytes: u32, x_off: u32, y_off: u32,
                x_stride: u32, y_stride: u32, acc: u32, _p0: u32, _p1: u32, _p2: u32 };

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

fn store(r: u32, t: u32, v: f32) {
    if (r < p.n_rows && t < step.n_tokens) {
        let o = p.y_off + t * p.y_stride + r;
        var s = v;
        if (p.acc != 0u) { s += y[o]; }
        y[o] = s;
    }
}
