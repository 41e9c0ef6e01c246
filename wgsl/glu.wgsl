// Gated linear units: out = act(gate) * up, over n features of each of the step's tokens.
// Bindings: 0 gate (storage, read)  1 up (storage, read)  2 out (storage, read_write)  3 p (uniform Params)
//           4 step (uniform Step)
// Math: swiglu: out = silu(g) * u,  silu(g) = g / (1 + exp(-g))
//       geglu:  out = gelu_tanh(g) * u,  gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
// Params { n, gate_stride, gate_offset, up_stride, up_offset, out_stride, _p0, _p1: u32 }
//   feature c of token j: gate at j*gate_stride + gate_offset + c, up at j*up_stride + up_offset + c,
//   out at j*out_stride + c (floats). Fused [t, 2n] rows [gate | up]: bind that buffer as both gate and up
//   (two read-only bindings of one buffer are allowed), strides 2n, up_offset n. Separate: strides n, offsets 0.
// Grid: (ceil(n / {{WG}}), t, 1).

//!include common.wgsl

struct Params { n: u32, gate_stride: u32, gate_offset: u32, up_stride: u32,
                up_offset: u32, out_stride: u32, _p0: u32, _p1: u32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read> gate: array<f32>;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

//!include act.wgsl

fn at(gid: vec3<u32>) -> vec3<u32> {   // (gate index, up index, out index); x = 0xffffffff when outside
    let c = gid.x;
    let row = gid.y;
    if (c >= p.n || row >= step.n_tokens) { return vec3<u32>(0xffffffffu); }
    return vec3<u32>(row * p.gate_stride + p.gate_offset + c, row * p.up_stride + p.up_offset + c,
                     row * p.out_stride + c);
}

@compute @workgroup_size(WG)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = at(gid);
    if (i.x == 0xffffffffu) { return; }
    out[i.z] = silu(gate[i.x]) * up[i.y];
}

@compute @workgroup_size(WG)
fn geglu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = at(gid);
    if (i.x == 0xffffffffu) { return; }
    out[i.z] = gelu_tanh(gate[i.x]) * up[i.y];
}
