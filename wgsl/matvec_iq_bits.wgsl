// matvec_iq.wgsl's values made from float bit patterns (IQV=bits), no int->float conversion: on NVIDIA a conversion
// issues at a quarter of the integer rate or less (16 a clock per SM against 64, Volta to Hopper), and the float
// loop converts twice a value (grid byte, sign), where Q4_K's converts once. Here an integer v < 2^23 becomes f32 as
// the float whose bits are 0x4B000000 | v, which is 2^23 + v exactly, less 2^23 (an OR and a subtraction); a sign bit
// moves to bit 31 and flips its value by XOR (a shift and a logical op). Exact: the same products as the float loop.
// The 8-byte fields are read as the three aligned words covering them (ld_u32 twice reads four). Constants: GV
// (gv_u: the IQ2 and IQ3 grids' unsigned bytes; gv_i: IQ1's int8).
const F23: u32 = 0x4B000000u;      // the bits of 2^23: F23 | v is 2^23 + v for v < 2^23

fn uf(v: u32) -> f32 { return bitcast<f32>(v | F23) - 8388608.0; }

// Bytes 0-3 of w, each ORed into 2^23's bits.
fn bytes23(w: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu)) | vec4<u32>(F23));
}
fn gv_u(w: u32) -> vec4<f32> { return bytes23(w) - 8388608.0; }
// int8 b as the byte b + 128 (its top bit flipped), less 2^23 + 128.
fn gv_i(w: u32) -> vec4<f32> { return bytes23(w ^ 0x80808080u) - 8388736.0; }

// v with bits b..b+3 of s (b = 0 or 4) as sign flips: bit b + k moved to bit 31 of value k.
fn flip_lo(v: vec4<f32>, s: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) ^ ((vec4<u32>(s) << vec4<u32>(31u, 30u, 29u, 28u)) & vec4<u32>(0x80000000u)));
}
fn flip_hi(v: vec4<f32>, s: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) ^ ((vec4<u32>(s) << vec4<u32>(27u, 26u, 25u, 24u)) & vec4<u32>(0x80000000u)));
}

// Eight bytes at an even byte offset: words i, i + 1, or with a 2-byte shift the three covering them.
fn ld8(off: u32) -> vec2<u32> {
    let i = off >> 2u;
    let a = W[i];
    let b = W[i + 1u];
    let c = W[i + 2u];
    return select(vec2<u32>(a, b), vec2<u32>((a >> 16u) | (b << 16u), (b >> 16u) | (c << 16u)), (off & 2u) != 0u);
}

// Four bytes at an even byte offset (ld_u32's shift is 0 or 16 here, known apart from the select).
fn ld4(off: u32) -> u32 {
    let i = off >> 2u;
    let a = W[i];
    return select(a, (a >> 16u) | (W[i + 1u] << 16u), (off & 2u) != 0u);
}

fn pt8(p: u32, s: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let g = gw8(p);
    return dot(flip_lo({{GV}}(g.x), s), xa) + dot(flip_hi({{GV}}(g.y), s), xb);
}

fn pt4x2(p1: u32, p2: u32, s: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    return dot(flip_lo({{GV}}(gw4(p1)), s), xa) + dot(flip_hi({{GV}}(gw4(p2)), s), xb);
}

fn pt8u(p: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let g = gw8(p);
    return dot({{GV}}(g.x), xa) + dot({{GV}}(g.y), xb);
}
