// matvec.wgsl's loop for the grid types IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M (pasted there: reads its W,
// x, p, WG). Constants: IQ (the type's layout prefix in quant.wgsl, IQ2_XXS ...), STEP (its step function below),
// B_GRID (the grid's binding).
// One step is a 32-value sub-block u of a row (ib = u % 8 of block u / 8): four groups of 8 values, each one 8-value
// point (or two 4-value points, IQ3) of the grid. Its d, scale, sign and high-index words are read once per 32 values
// (the group loop, matvec_groups.wgsl through quant.wgsl's dq_*, read them once per 8), its 32 inputs as 8 vec4s
// shared by the 4 rows; neighbouring threads read neighbouring sub-blocks (8-14 bytes apart). Units per row: cols / 32.
// Layouts and formulas: quant.wgsl's comments beside dq_iq2_xxs ... dq_iq1_m (the same bytes, read a sub-block at a time).
// The grid is ggml's table as it is, in a storage binding, and values are made from float bit patterns: the one way
// kept of those `lab bench kernels` compared on the H200 at 14336x4096 and 4096x14336 (docs/results/h200_iq_loops/),
// the fastest or within noise of it in every row, against the table copied into workgroup memory (no gain), read from
// quant.wgsl's packed private arrays (1.6-14x slower, IQ1's the most) and values through int->float conversions
// (5-20% slower; IQ2 and IQ3 measured).

// ---- the grid: ggml's table bound at B_GRID, one more storage buffer of the kernel (lab/ops/matmul.py matvec_storage
// counts it), kind CONSTANT, made once per owner by lab/gpu/shaders.py KernelCache.table from lab/format/iq_grids.py
// (grid_bytes). Read in place through the cache as the weights are; unlike quant.wgsl's private arrays it costs nothing
// to compile. Point p of an 8-value grid is G[p] (value k is byte k of its 8; IQ1's int8), of a 4-value grid (IQ3)
// half p % 2 of G[p / 2].
@group(0) @binding({{B_GRID}}) var<storage, read> G: array<vec2<u32>>;

fn gw8(p: u32) -> vec2<u32> { return G[p]; }

fn gw4(p: u32) -> u32 { return G[p >> 1u][p & 1u]; }

// ---- values from float bit patterns, no int->float conversion: GPUs issue conversions at a fraction of their integer
// and float rates, and converting each grid byte and sign bit costs two a value, where Q4_K's loop converts once
// (measured on the H200: 5-20% faster than converting). Here an integer v < 2^23 becomes f32 as the float whose bits are
// 0x4B000000 | v, which is 2^23 + v exactly, less 2^23 (an OR and a subtraction); a sign bit moves to bit 31 and flips
// its value by XOR (a shift and a logical op). Exact: the products of int->float conversions and +-1 multiplies.
const F23: u32 = 0x4B000000u;      // the bits of 2^23: F23 | v is 2^23 + v for v < 2^23

// A small unsigned field (a scale) as f32.
fn uf(v: u32) -> f32 { return bitcast<f32>(v | F23) - 8388608.0; }

// Bytes 0-3 of w, each ORed into 2^23's bits.
fn bytes23(w: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu)) | vec4<u32>(F23));
}
// The IQ2 and IQ3 grids' unsigned bytes.
fn gv_u(w: u32) -> vec4<f32> { return bytes23(w) - 8388608.0; }
// IQ1's int8: byte b as b + 128 (its top bit flipped), less 2^23 + 128.
fn gv_i(w: u32) -> vec4<f32> { return bytes23(w ^ 0x80808080u) - 8388736.0; }

// v with bits b..b+3 of s (b = 0 or 4) as sign flips (a set bit is a minus): bit b + k moved to bit 31 of value k.
fn flip_lo(v: vec4<f32>, s: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) ^ ((vec4<u32>(s) << vec4<u32>(31u, 30u, 29u, 28u)) & vec4<u32>(0x80000000u)));
}
fn flip_hi(v: vec4<f32>, s: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) ^ ((vec4<u32>(s) << vec4<u32>(27u, 26u, 25u, 24u)) & vec4<u32>(0x80000000u)));
}

// Eight bytes at an even byte offset (the blocks are 2-byte aligned): words i, i + 1, or with a 2-byte shift the three
// aligned words covering them (ld_u32 twice reads four).
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

// One 8-value point p (IQ2) signed by bits 0-7 of s, dotted with its inputs xa (values 0-3), xb (4-7).
fn pt8(p: u32, s: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let g = gw8(p);
    return dot(flip_lo(gv_u(g.x), s), xa) + dot(flip_hi(gv_u(g.y), s), xb);
}

// Two 4-value points (IQ3) of one group of 8, signed by bits 0-7 of s.
fn pt4x2(p1: u32, p2: u32, s: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    return dot(flip_lo(gv_u(gw4(p1)), s), xa) + dot(flip_hi(gv_u(gw4(p2)), s), xb);
}

// IQ1's 8-value point p unsigned (its int8 values carry their own signs), dotted with xa, xb.
fn pt8u(p: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let g = gw8(p);
    return dot(gv_i(g.x), xa) + dot(gv_i(g.y), xb);
}

// ---- the steps
fn sum4(v: vec4<f32>) -> f32 { return dot(v, vec4<f32>(1.0)); }

// Each step function: sub-block ib of the block at byte b of W, dotted with its 32 inputs x0..x7 (4 values each).

// IQ2_XXS: word a0 = four grid indices (byte l: group l), a1 = four 7-bit sign indices (bits 7l..) and the scale (28-31).
fn iq2_xxs_step(b: u32, ib: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>,
                x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let q = b + IQ2_XXS_QS + 8u * ib;
    let a = ld8(q);
    let a0 = a.x;
    let a1 = a.y;
    let db = ld_f16(b + IQ2_XXS_D) * (0.5 + uf(a1 >> 28u)) * 0.25;
    return db * (pt8(a0 & 0xFFu, ksigns(a1 & 127u), x0, x1) + pt8((a0 >> 8u) & 0xFFu, ksigns((a1 >> 7u) & 127u), x2, x3)
               + pt8((a0 >> 16u) & 0xFFu, ksigns((a1 >> 14u) & 127u), x4, x5)
               + pt8(a0 >> 24u, ksigns((a1 >> 21u) & 127u), x6, x7));
}

// IQ3_XXS: q0, q1 = the 8 point indices (bytes 2l, 2l + 1: group l), a = the sign indices and scale as IQ2_XXS's a1.
fn iq3_xxs_step(b: u32, ib: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>,
                x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let q = b + IQ3_XXS_QS + 8u * ib;
    let qq = ld8(q);
    let q0 = qq.x;
    let q1 = qq.y;
    let a = ld4(b + IQ3_XXS_SS + 4u * ib);
    let db = ld_f16(b + IQ3_XXS_D) * (0.5 + uf(a >> 28u)) * 0.5;
    return db * (pt4x2(q0 & 0xFFu, (q0 >> 8u) & 0xFFu, ksigns(a & 127u), x0, x1)
               + pt4x2((q0 >> 16u) & 0xFFu, q0 >> 24u, ksigns((a >> 7u) & 127u), x2, x3)
               + pt4x2(q1 & 0xFFu, (q1 >> 8u) & 0xFFu, ksigns((a >> 14u) & 127u), x4, x5)
               + pt4x2((q1 >> 16u) & 0xFFu, q1 >> 24u, ksigns((a >> 21u) & 127u), x6, x7));
}

// IQ2_XS: q0, q1 = the sub-block's four u16 (9-bit index, 7-bit sign index); scale byte: low nibble groups 0-1, high 2-3.
fn iq2_xs_step(b: u32, ib: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>,
               x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let q = b + IQ2_XS_QS + 8u * ib;
    let qq = ld8(q);
    let q0 = qq.x;
    let q1 = qq.y;
    let sc = ld_u8(b + IQ2_XS_SCALES + ib);
    let d = ld_f16(b + IQ2_XS_D) * 0.25;
    let lo = pt8(q0 & 511u, ksigns((q0 >> 9u) & 127u), x0, x1) + pt8((q0 >> 16u) & 511u, ksigns(q0 >> 25u), x2, x3);
    let hi = pt8(q1 & 511u, ksigns((q1 >> 9u) & 127u), x4, x5) + pt8((q1 >> 16u) & 511u, ksigns(q1 >> 25u), x6, x7);
    return d * ((0.5 + uf(sc & 15u)) * lo + (0.5 + uf(sc >> 4u)) * hi);
}

// IQ2_S: qs word (byte l: index bits 0-7 of group l), qh byte (bits 2l, 2l + 1: index bits 8-9), signs word (byte l),
// scale byte as IQ2_XS's.
fn iq2_s_step(b: u32, ib: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>,
              x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let qs = ld4(b + IQ2_S_QS + 4u * ib);
    let sg = ld4(b + IQ2_S_SIGNS + 4u * ib);
    let qh = ld_u8(b + IQ2_S_QH + ib);
    let sc = ld_u8(b + IQ2_S_SCALES + ib);
    let d = ld_f16(b + IQ2_S_D) * 0.25;
    let lo = pt8((qs & 0xFFu) | ((qh & 3u) << 8u), sg & 0xFFu, x0, x1)
           + pt8(((qs >> 8u) & 0xFFu) | ((qh & 12u) << 6u), (sg >> 8u) & 0xFFu, x2, x3);
    let hi = pt8(((qs >> 16u) & 0xFFu) | ((qh & 48u) << 4u), (sg >> 16u) & 0xFFu, x4, x5)
           + pt8((qs >> 24u) | ((qh & 192u) << 2u), sg >> 24u, x6, x7);
    return d * ((0.5 + uf(sc & 15u)) * lo + (0.5 + uf(sc >> 4u)) * hi);
}

// IQ3_S: q0, q1 = the 8 point indices' low bits (bytes 2l, 2l + 1: group l), qh byte (bit k: point k's 9th bit),
// signs word (byte l), the scale nibble ib % 2 of byte ib / 2.
fn iq3_s_step(b: u32, ib: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>,
              x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let q = b + IQ3_S_QS + 8u * ib;
    let qq = ld8(q);
    let q0 = qq.x;
    let q1 = qq.y;
    let h = ld_u8(b + IQ3_S_QH + ib) << 8u;
    let sg = ld4(b + IQ3_S_SIGNS + 4u * ib);
    let sc = (ld_u8(b + IQ3_S_SCALES + (ib >> 1u)) >> (4u * (ib & 1u))) & 15u;
    let db = ld_f16(b + IQ3_S_D) * uf(1u + 2u * sc);
    return db * (pt4x2((q0 & 0xFFu) | (h & 256u), ((q0 >> 8u) & 0xFFu) | ((h >> 1u) & 256u), sg & 0xFFu, x0, x1)
               + pt4x2(((q0 >> 16u) & 0xFFu) | ((h >> 2u) & 256u), (q0 >> 24u) | ((h >> 3u) & 256u), (sg >> 8u) & 0xFFu, x2, x3)
               + pt4x2((q1 & 0xFFu) | ((h >> 4u) & 256u), ((q1 >> 8u) & 0xFFu) | ((h >> 5u) & 256u), (sg >> 16u) & 0xFFu, x4, x5)
               + pt4x2(((q1 >> 16u) & 0xFFu) | ((h >> 6u) & 256u), (q1 >> 24u) | ((h >> 7u) & 256u), sg >> 24u, x6, x7));
}

// IQ1_S: qs word (byte l: index bits 0-7 of group l), qh u16 (bits 3l..3l+2: index bits 8-10; 12-14 the scale; 15 the
// delta's sign). sum dl (g + delta) x = dl (sum g x + delta sum x).
fn iq1_s_step(b: u32, ib: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>,
              x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let qs = ld4(b + IQ1_S_QS + 4u * ib);
    let qh = ld_u16(b + IQ1_S_QH + 2u * ib);
    let dl = ld_f16(b + IQ1_S_D) * uf(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(IQ1_DELTA, -IQ1_DELTA, (qh & 0x8000u) != 0u);
    let g = pt8u((qs & 0xFFu) | ((qh & 7u) << 8u), x0, x1) + pt8u(((qs >> 8u) & 0xFFu) | ((qh & 0x38u) << 5u), x2, x3)
          + pt8u(((qs >> 16u) & 0xFFu) | ((qh & 0x1C0u) << 2u), x4, x5)
          + pt8u((qs >> 24u) | ((qh & 0xE00u) >> 1u), x6, x7);
    return dl * (g + delta * sum4(x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7));
}

// IQ1_M (56-byte blocks: word reads): qs word (byte l: index bits 0-7 of group l), qh u16 (nibble l: index bits 8-10 and
// the delta's sign of group l), 3-bit scales of the two 16-value halves from sc[ib / 2], d from the scales' top nibbles.
fn iq1_m_step(b: u32, ib: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>,
              x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let w = b >> 2u;
    let qs = W[w + IQ1_M_QS / 4u + ib];
    let qh = (W[w + IQ1_M_QH / 4u + (ib >> 1u)] >> (16u * (ib & 1u))) & 0xFFFFu;
    let s01 = W[w + IQ1_M_SCALES / 4u];
    let s23 = W[w + IQ1_M_SCALES / 4u + 1u];
    let dbits = ((s01 >> 12u) & 0xFu) | ((s01 >> 24u) & 0xF0u) | ((s23 >> 4u) & 0xF00u) | ((s23 >> 16u) & 0xF000u);
    let sc = (select(s01, s23, ib >= 4u) >> (16u * ((ib >> 1u) & 1u) + 6u * (ib & 1u))) & 63u;
    let d = unpack2x16float(dbits).x;
    let dv = vec4<f32>(IQ1_DELTA) - 2.0 * IQ1_DELTA * vec4<f32>((vec4<u32>(qh) >> vec4<u32>(3u, 7u, 11u, 15u)) & vec4<u32>(1u));
    let lo = pt8u((qs & 0xFFu) | ((qh & 7u) << 8u), x0, x1) + dv.x * sum4(x0 + x1)
           + pt8u(((qs >> 8u) & 0xFFu) | ((qh & 0x70u) << 4u), x2, x3) + dv.y * sum4(x2 + x3);
    let hi = pt8u(((qs >> 16u) & 0xFFu) | (qh & 0x700u), x4, x5) + dv.z * sum4(x4 + x5)
           + pt8u((qs >> 24u) | ((qh & 0x7000u) >> 4u), x6, x7) + dv.w * sum4(x6 + x7);
    return d * (uf(2u * (sc & 7u) + 1u) * lo + uf(2u * (sc >> 3u) + 1u) * hi);
}

fn accumulate(rb: vec4<u32>, lid: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var u = lid; u < p.cols / 32u; u += WG) {
        let e = 32u * u;
        let x0 = in4(e);
        let x1 = in4(e + 4u);
        let x2 = in4(e + 8u);
        let x3 = in4(e + 12u);
        let x4 = in4(e + 16u);
        let x5 = in4(e + 20u);
        let x6 = in4(e + 24u);
        let x7 = in4(e + 28u);
        let b = rb + vec4<u32>((u >> 3u) * {{IQ}}_BYTES);
        let ib = u & 7u;
        acc += vec4<f32>({{STEP}}(b.x, ib, x0, x1, x2, x3, x4, x5, x6, x7), {{STEP}}(b.y, ib, x0, x1, x2, x3, x4, x5, x6, x7),
                         {{STEP}}(b.z, ib, x0, x1, x2, x3, x4, x5, x6, x7), {{STEP}}(b.w, ib, x0, x1, x2, x3, x4, x5, x6, x7));
    }
    return acc;
}
