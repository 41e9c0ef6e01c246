// matvec.wgsl's input read one float at a time, at any x_off (the group loop's view where x_off is not a
// multiple of 4). IN picks the
// prologue: in_plain, in_norm (RMSNorm: sums x^2 into ss as it goes) or in_glu ({{ACT}}(gate) * up).
@group(0) @binding(1) var<storage, read> x: array<f32>;
{{NORM}}@group(0) @binding({{B_NW}}) var<storage, read> nw: array<f32>;

fn in_plain(c: u32) -> f32 { return x[x_base + c]; }
{{NORM}}fn in_norm(c: u32) -> f32 { let v = x[x_base + c]; ss += v * v; return v * nw[c]; }
fn in_glu(c: u32) -> f32 { return {{ACT}}(x[x_base + c]) * x[x_base + p.up_off + c]; }

// Four input values from element e.
fn in4(e: u32) -> vec4<f32> {
    return vec4<f32>({{IN}}(e), {{IN}}(e + 1u), {{IN}}(e + 2u), {{IN}}(e + 3u));
}

// The normed input, stored once (by workgroup 0) for traces and probes.
{{NORM}}fn store_xn(lid: u32, inv_rms: f32) {
{{NORM}}    for (var c = lid; c < p.cols; c += WG) { xn[p.xn_off + c] = x[p.x_off + c] * inv_rms * nw[c]; }
{{NORM}}}
