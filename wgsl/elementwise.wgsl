// Elementwise ops over f32 vectors of n elements.
// Bindings: 0 a (read), 1 b (read), 2 out (read_write), 3 params (uniform: n, scale)
//   add:        out[i] = a[i] + b[i]
//   mul:        out[i] = a[i] * b[i]
//   scale_add:  out[i] = a[i] + scale * b[i]
// Workgroup size {{WG}} is owned by Python (lab.kernels), which sizes the grid to match.

struct Params { n: u32, scale: f32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size({{WG}})
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < p.n) { out[i] = a[i] + b[i]; }
}

@compute @workgroup_size({{WG}})
fn mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < p.n) { out[i] = a[i] * b[i]; }
}

@compute @workgroup_size({{WG}})
fn scale_add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < p.n) { out[i] = a[i] + p.scale * b[i]; }
}
