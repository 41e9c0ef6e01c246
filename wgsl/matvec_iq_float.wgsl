// matvec_iq.wgsl's values through int->float conversions (the loop as first measured, the baseline; IQV=float): each
// grid byte and each sign bit converted to f32, the signs applied as +-1 multiplies, unaligned words read by ld_u32.
// Constants: GV (gv_u: the IQ2 and IQ3 grids' unsigned bytes; gv_i: IQ1's int8).
fn gv_u(w: u32) -> vec4<f32> { return vec4<f32>(u8x4(w)); }
fn gv_i(w: u32) -> vec4<f32> { return i8x4(w); }

// A small unsigned field (a scale) as f32.
fn uf(v: u32) -> f32 { return f32(v); }

// Eight / four bytes at an even byte offset (the blocks are 2-byte aligned).
fn ld8(off: u32) -> vec2<u32> { return vec2<u32>(ld_u32(off), ld_u32(off + 4u)); }
fn ld4(off: u32) -> u32 { return ld_u32(off); }

// One 8-value point p signed by bits 0-7 of s (a set bit is a minus), dotted with its inputs xa (values 0-3), xb (4-7).
fn pt8(p: u32, s: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let g = gw8(p);
    return dot({{GV}}(g.x) * signs4(s, 0u), xa) + dot({{GV}}(g.y) * signs4(s, 4u), xb);
}

// Two 4-value points (IQ3) of one group of 8, signed by bits 0-7 of s.
fn pt4x2(p1: u32, p2: u32, s: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    return dot({{GV}}(gw4(p1)) * signs4(s, 0u), xa) + dot({{GV}}(gw4(p2)) * signs4(s, 4u), xb);
}

// IQ1's 8-value point p unsigned (its values carry their own signs), dotted with xa, xb.
fn pt8u(p: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let g = gw8(p);
    return dot({{GV}}(g.x), xa) + dot({{GV}}(g.y), xb);
}
