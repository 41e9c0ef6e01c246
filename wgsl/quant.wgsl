// Dequantization of GGUF weights read in place from their block layout (included, no entry points).
// Bindings: none of its own. The including kernel declares the weights as
//   `var<storage, read> W: array<u32>;`  (GGUF blocks, row-major, rows start at byte row * row_bytes)
// Math: one function per type, dq_TYPE(rb, g) -> Dq, gives the 8 values of "group" g of the row
//   whose first byte is rb: lo = elements e0..e0+3, hi = elements e0+HALF..e0+HALF+3, where
//   e0 = group_base(g, HALF) = (g / (HALF/4)) * 2*HALF + (g % (HALF/4)) * 4.
//   Groups 0..cols/8-1 cover a row exactly once. HALF per type (Python owns the table, lab/ops/weights.py):
//   F32 F16 BF16 Q8_0 TQ1_0: 4 (8 consecutive values); NVFP4: 8 (low/high nibbles of 4 qs bytes of a 16-value
//   sub-block); Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL IQ4_XS MXFP4: 16 (low/high nibbles of 4 qs bytes); Q2_K Q3_K Q4_K Q5_K
//   Q6_K TQ2_0: 32; the grid types IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M and the 1- and 2-bit types Q1_0
//   Q2_0: 4 (8 consecutive values). A span of 2*HALF consecutive elements is always whole groups, and divides the
//   block, so any range starting at a multiple of 64 holds whole groups.
// Uniforms: none. Constants: none filled by Python (the type is picked by the including file through the
//   function name), but for the grid types' lookup tables and IQ1's delta, which lab/gpu/shaders.py fills into every
//   file from lab/format/iq_grids.py (IQ2XXS_GRID ..., IQ1S_DELTA). Each block layout is spelled as named byte offsets beside its comment
//   (Q4_K_SCALES = byte of the scales in a Q4_K block); offsets into a 4-byte-aligned block are read as words
//   (offset / 4).
// Blocks of 17, 18, 22, 34, 50, 54, 66, 74, 82, 98, 110 and 210 bytes are not 4-byte aligned: fields are read with
// ld_u8/ld_u16/ld_u32, which take byte offsets into W (ld_u16 an even one: only blocks of even size use it).
// Scale fields are f16 (unpack2x16float, core WGSL: no shader-f16 needed), IQ1_M's spread over four nibbles, but for
// MXFP4's E8M0 and NVFP4's UE4M3 bytes, decoded from their bits.

struct Dq { lo: vec4<f32>, hi: vec4<f32> };

fn group_base(g: u32, hf: u32) -> u32 {
    let per = hf / 4u;
    return (g / per) * 2u * hf + (g % per) * 4u;
}

// ---- byte loaders ------------------------------------------------------------------------------

// Four bytes at any byte offset, little-endian.
fn ld_u32(off: u32) -> u32 {
    let i = off >> 2u;
    let s = (off & 3u) * 8u;
    let lo = W[i] >> s;
    let hi = select(0u, W[i + 1u] << ((32u - s) & 31u), s != 0u);
    return lo | hi;
}

// Two bytes at an even byte offset.
fn ld_u16(off: u32) -> u32 {
    return (W[off >> 2u] >> ((off & 2u) * 8u)) & 0xFFFFu;
}

fn ld_u8(off: u32) -> u32 {
    return (W[off >> 2u] >> ((off & 3u) * 8u)) & 0xFFu;
}

fn ld_f16(off: u32) -> f32 {
    return unpack2x16float(ld_u16(off)).x;
}

fn bf16x2(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xFFFF0000u));
}

// The four bytes of w as unsigned / signed values, byte 0 first.
fn u8x4(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu);
}

fn i8x4(w: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

// Low / high nibble of each byte of w.
fn nib_lo(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
}

fn nib_hi(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
}

// Bit `b` of each byte of w, as 0.0 / 1.0.
fn bit_of_bytes(w: u32, b: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(b))) & vec4<u32>(1u));
}

// ---- plain floats (group g = elements 8g..8g+7; rows of these types start 16-byte aligned) ----

fn dq_f32(rb: u32, g: u32) -> Dq {
    let i = (rb >> 2u) + 8u * g;
    return Dq(bitcast<vec4<f32>>(vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u])),
              bitcast<vec4<f32>>(vec4<u32>(W[i + 4u], W[i + 5u], W[i + 6u], W[i + 7u])));
}

fn dq_f16(rb: u32, g: u32) -> Dq {
    let i = (rb >> 2u) + 4u * g;
    return Dq(vec4<f32>(unpack2x16float(W[i]), unpack2x16float(W[i + 1u])),
              vec4<f32>(unpack2x16float(W[i + 2u]), unpack2x16float(W[i + 3u])));
}

fn dq_bf16(rb: u32, g: u32) -> Dq {
    let i = (rb >> 2u) + 4u * g;
    return Dq(vec4<f32>(bf16x2(W[i]), bf16x2(W[i + 1u])), vec4<f32>(bf16x2(W[i + 2u]), bf16x2(W[i + 3u])));
}

// ---- 32-element blocks (4 groups per block) ----------------------------------------------------

// Q8_0, 34 bytes: d f16, qs[32] i8.  x = d * q.  Group gi: lo = qs[8gi..8gi+3], hi = qs[8gi+4..8gi+7].
const Q8_0_BYTES: u32 = 34u;
const Q8_0_D: u32 = 0u;
const Q8_0_QS: u32 = 2u;
fn dq_q8_0(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 2u) * Q8_0_BYTES;
    let gi = g & 3u;
    let d = ld_f16(blk + Q8_0_D);
    return Dq(d * i8x4(ld_u32(blk + Q8_0_QS + 8u * gi)), d * i8x4(ld_u32(blk + Q8_0_QS + 4u + 8u * gi)));
}

// Q4_0, 18 bytes: d f16, qs[16]; element j = low nibble of qs[j], element j+16 = high nibble.  x = d * (q - 8)
const Q4_0_BYTES: u32 = 18u;
const Q4_0_D: u32 = 0u;
const Q4_0_QS: u32 = 2u;
fn dq_q4_0(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 2u) * Q4_0_BYTES;
    let d = ld_f16(blk + Q4_0_D);
    let q = ld_u32(blk + Q4_0_QS + 4u * (g & 3u));
    return Dq(d * (nib_lo(q) - 8.0), d * (nib_hi(q) - 8.0));
}

// Q4_1, 20 bytes: d f16, m f16, qs[16] (nibbles as Q4_0).  x = d * q + m
const Q4_1_BYTES: u32 = 20u;
const Q4_1_DM: u32 = 0u;
const Q4_1_QS: u32 = 4u;
fn dq_q4_1(rb: u32, g: u32) -> Dq {
    let w = (rb >> 2u) + (g >> 2u) * (Q4_1_BYTES / 4u);
    let dm = unpack2x16float(W[w + Q4_1_DM / 4u]);
    let q = W[w + Q4_1_QS / 4u + (g & 3u)];
    return Dq(dm.x * nib_lo(q) + dm.y, dm.x * nib_hi(q) + dm.y);
}

// The low / high nibbles of w's bytes with each one's fifth bit h (0 or 1) joined as 16, then converted: one
// int->float conversion a value, not two (the converts, not the reads, bounded the 5- and 6-bit matvecs on the
// H200: docs/performance.md).
fn q5_lo(w: u32, h: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u)) | (h << vec4<u32>(4u)));
}

fn q5_hi(w: u32, h: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(((vec4<u32>(w) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u)) | (h << vec4<u32>(4u)));
}

// Q5_0, 22 bytes: d f16, qh u32, qs[16]; 5th bit of element j is bit j of qh (j = 0..31).  x = d * (q - 16)
const Q5_0_BYTES: u32 = 22u;
const Q5_0_D: u32 = 0u;
const Q5_0_QH: u32 = 2u;
const Q5_0_QS: u32 = 6u;
fn dq_q5_0(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 2u) * Q5_0_BYTES;
    let j = 4u * (g & 3u);
    let d = ld_f16(blk + Q5_0_D);
    let qh = ld_u32(blk + Q5_0_QH);
    let q = ld_u32(blk + Q5_0_QS + j);
    let h = (vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(j))) & vec4<u32>(1u);
    let h2 = (vec4<u32>(qh) >> (vec4<u32>(16u, 17u, 18u, 19u) + vec4<u32>(j))) & vec4<u32>(1u);
    return Dq(d * (q5_lo(q, h) - 16.0), d * (q5_hi(q, h2) - 16.0));
}

// Q5_1, 24 bytes: d f16, m f16, qh u32, qs[16] (bits as Q5_0).  x = d * q + m
const Q5_1_BYTES: u32 = 24u;
const Q5_1_DM: u32 = 0u;
const Q5_1_QH: u32 = 4u;
const Q5_1_QS: u32 = 8u;
fn dq_q5_1(rb: u32, g: u32) -> Dq {
    let w = (rb >> 2u) + (g >> 2u) * (Q5_1_BYTES / 4u);
    let j = 4u * (g & 3u);
    let dm = unpack2x16float(W[w + Q5_1_DM / 4u]);
    let qh = W[w + Q5_1_QH / 4u];
    let q = W[w + Q5_1_QS / 4u + (g & 3u)];
    let h = (vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(j))) & vec4<u32>(1u);
    let h2 = (vec4<u32>(qh) >> (vec4<u32>(16u, 17u, 18u, 19u) + vec4<u32>(j))) & vec4<u32>(1u);
    return Dq(dm.x * q5_lo(q, h) + dm.y, dm.x * q5_hi(q, h2) + dm.y);
}

// The 16 non-linear levels of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl), as int8 bytes: level i is byte i % 4
// of word i / 4.  -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113
// The word is picked with selects, not by indexing: a vector or array indexed at run time went through
// local memory on the H200 (IQ4_NL matvec 103 us against Q4_0's 37 us at 14336 x 4096).
fn iq4_levels(n: vec4<u32>) -> vec4<f32> {
    const W0 = vec4<u32>(0xBFAD9881u);
    const W1 = vec4<u32>(0xF6EADDCFu);
    const W2 = vec4<u32>(0x26190D01u);
    const W3 = vec4<u32>(0x71594535u);
    let odd = (n & vec4<u32>(4u)) != vec4<u32>(0u);     // word 1 or 3
    let w = select(select(W0, W1, odd), select(W2, W3, odd), n >= vec4<u32>(8u));
    return vec4<f32>(bitcast<vec4<i32>>(w << (vec4<u32>(24u) - 8u * (n & vec4<u32>(3u)))) >> vec4<u32>(24u));
}

// Low / high nibble of each byte of w, as indices.
fn nibs_lo(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
}

fn nibs_hi(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u);
}

// IQ4_NL, 18 bytes: d f16, qs[16] (nibbles as Q4_0).  x = d * levels[q]
const IQ4_NL_BYTES: u32 = 18u;
const IQ4_NL_D: u32 = 0u;
const IQ4_NL_QS: u32 = 2u;
fn dq_iq4_nl(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 2u) * IQ4_NL_BYTES;
    let d = ld_f16(blk + IQ4_NL_D);
    let q = ld_u32(blk + IQ4_NL_QS + 4u * (g & 3u));
    return Dq(d * iq4_levels(nibs_lo(q)), d * iq4_levels(nibs_hi(q)));
}

// IQ4_XS, 136 bytes: d f16, scales_h u16, scales_l[4], qs[128]. Sub-block ib (0..7) of 32 elements: qs[16ib..]
// (element 32ib + j = low nibble of qs[16ib + j], 32ib + 16 + j its high nibble, as IQ4_NL), 6-bit scale
// ls = nibble ib%2 of scales_l[ib/2] | bits 2ib..2ib+1 of scales_h << 4, i.e. nibble ib of the scales_l word.
// x = d * (ls - 32) * levels[q].  HALF = 16: group gi (of 32 per block) is qs word gi, sub-block gi / 4.
const IQ4_XS_BYTES: u32 = 136u;
const IQ4_XS_D_SH: u32 = 0u;      // d in the low half of this word, scales_h in the high half
const IQ4_XS_SL: u32 = 4u;
const IQ4_XS_QS: u32 = 8u;
fn dq_iq4_xs(rb: u32, g: u32) -> Dq {
    let w = (rb + (g >> 5u) * IQ4_XS_BYTES) >> 2u;
    let gi = g & 31u;
    let ib = gi >> 2u;
    let dsh = W[w + IQ4_XS_D_SH / 4u];
    let ls = ((W[w + IQ4_XS_SL / 4u] >> (4u * ib)) & 15u) | (((dsh >> (16u + 2u * ib)) & 3u) << 4u);
    let dl = unpack2x16float(dsh).x * (f32(ls) - 32.0);
    let q = W[w + IQ4_XS_QS / 4u + gi];
    return Dq(dl * iq4_levels(nibs_lo(q)), dl * iq4_levels(nibs_hi(q)));
}

// ---- 256-element K blocks (32 groups per block; group gi: chunk j = gi/8 of 64 elements, l = 4*(gi%8);
//      lo = elements 64j+l.., sub-block 2j; hi = elements 64j+32+l.., sub-block 2j+1) --------------

// Q4_K / Q5_K: 6-bit scales and mins of chunk j's two sub-blocks a = 2j and b = 2j + 1, from the three words
// s0 s1 s2 that hold the block's 12 scale bytes (ggml's get_scale_min_k4: sub-block s < 4: sc = b[s] & 63,
// m = b[s+4] & 63; s >= 4: sc = b[s+4] & 15 | (b[s-4] >> 6) << 4, m = b[s+4] >> 4 | (b[s] >> 6) << 4). Both
// sub-blocks of a chunk sit on the same side of 4, in the same two bytes (bits 16(j % 2)..+15) of each word,
// so three word loads serve a chunk: byte loads per sub-block made these types the slowest (0.21-0.36 TB/s
// on the H200, docs/performance.md). Returns (sc_a, sc_b, m_a, m_b).
fn k_scales(s0: u32, s1: u32, s2: u32, j: u32) -> vec4<f32> {
    let i = 16u * (j & 1u);
    let a = vec2<u32>(s0 >> i, s0 >> (i + 8u)) & vec2<u32>(0xFFu);
    let b = vec2<u32>(s1 >> i, s1 >> (i + 8u)) & vec2<u32>(0xFFu);
    let c = vec2<u32>(s2 >> i, s2 >> (i + 8u)) & vec2<u32>(0xFFu);
    let hi = j >= 2u;
    let sc = select(a & vec2<u32>(63u), (c & vec2<u32>(15u)) | ((a >> vec2<u32>(6u)) << vec2<u32>(4u)), hi);
    let mn = select(b & vec2<u32>(63u), (c >> vec2<u32>(4u)) | ((b >> vec2<u32>(6u)) << vec2<u32>(4u)), hi);
    return vec4<f32>(vec2<f32>(sc), vec2<f32>(mn));
}

// ---- 2- and 3-bit K blocks: the 256 elements are two halves n of 128; byte qs[32n + l] (l = 0..31) holds
//      element 128n + 32j + l in bits 2j, 2j+1 (j = 0..3), and that element's 16-element sub-block is
//      s = 8n + 2j + l/16. Group gi (HALF = 32): chunk c = gi/8 (= 2n + j/2), l = 4*(gi%8); lo has j = 2(c%2),
//      hi j + 1; both come from the word qs[32n + l..l+3] (shifted by 4(c%2), then bits 0-1 / 2-3 of each
//      byte), and their sub-blocks are s = 4c + l/16 (lo) and s + 2 (hi).

// Two bits of each byte of q: bits 0-1 (lo) or 2-3 (hi) of each byte.
fn crumbs_lo(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(3u));
}

fn crumbs_hi(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(2u, 10u, 18u, 26u)) & vec4<u32>(3u));
}

// Q2_K, 84 bytes: scales[16] (sub-block s: scale = low nibble, min = high nibble of scales[s]), qs[64],
// d f16, dmin f16.  x = d * sc * q - dmin * m.  The scales of a group's two sub-blocks (4c + l/16 and +2)
// are bytes l/16 and l/16 + 2 of scales word c.
const Q2_K_BYTES: u32 = 84u;
const Q2_K_SCALES: u32 = 0u;
const Q2_K_QS: u32 = 16u;
const Q2_K_DM: u32 = 80u;
fn dq_q2_k(rb: u32, g: u32) -> Dq {
    let w = (rb + (g >> 5u) * Q2_K_BYTES) >> 2u;
    let gi = g & 31u;
    let c = gi >> 3u;
    let dm = unpack2x16float(W[w + Q2_K_DM / 4u]);
    let sw = W[w + Q2_K_SCALES / 4u + c] >> (8u * ((gi & 7u) >> 2u));     // byte l/16 -> bits 0..7
    let sc = vec2<f32>(f32(sw & 15u), f32((sw >> 16u) & 15u));
    let mn = vec2<f32>(f32((sw >> 4u) & 15u), f32((sw >> 20u) & 15u));
    let q = W[w + Q2_K_QS / 4u + 8u * (c >> 1u) + (gi & 7u)] >> (4u * (c & 1u));
    return Dq(dm.x * sc.x * crumbs_lo(q) - dm.y * mn.x, dm.x * sc.y * crumbs_hi(q) - dm.y * mn.y);
}

// Q3_K, 110 bytes: hmask[32], qs[64], scales[12], d f16. Element 128n + 32j + l: q = its 2 bits in qs (above)
// - 4 unless bit 4n + j of hmask[l] is set; for a group that is bit 2c (lo) and 2c + 1 (hi) of hmask[l..l+3].
// Sub-block s's 6-bit scale: low 4 bits = nibble s/8 of scales[s % 8], high 2 bits = bits 2(s/4)..+1 of
// scales[8 + s % 4]; x = d * (scale - 32) * q. For s = 4c + l/16 and s + 2 these are bytes l/16 and
// l/16 + 2 of scales[4(c%2)..] (nibble c/2) and of scales[8..] (bits 2c).
const Q3_K_BYTES: u32 = 110u;
const Q3_K_HMASK: u32 = 0u;
const Q3_K_QS: u32 = 32u;
const Q3_K_SCALES: u32 = 96u;
const Q3_K_D: u32 = 108u;
fn dq_q3_k(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * Q3_K_BYTES;
    let gi = g & 31u;
    let c = gi >> 3u;
    let l = 4u * (gi & 7u);
    let h = l >> 4u;
    let d = ld_f16(blk + Q3_K_D);
    let lw = ld_u32(blk + Q3_K_SCALES + 4u * (c & 1u)) >> (8u * h + 4u * (c >> 1u));
    let hw = ld_u32(blk + Q3_K_SCALES + 8u) >> (8u * h + 2u * c);
    let sc0 = f32((lw & 15u) | ((hw & 3u) << 4u)) - 32.0;
    let sc1 = f32(((lw >> 16u) & 15u) | (((hw >> 16u) & 3u) << 4u)) - 32.0;
    let q = ld_u32(blk + Q3_K_QS + 32u * (c >> 1u) + l) >> (4u * (c & 1u));
    let hm = ld_u32(blk + Q3_K_HMASK + l);
    return Dq(d * sc0 * (crumbs_lo(q) - 4.0 + 4.0 * bit_of_bytes(hm, 2u * c)),
              d * sc1 * (crumbs_hi(q) - 4.0 + 4.0 * bit_of_bytes(hm, 2u * c + 1u)));
}

// Q4_K, 144 bytes: d f16, dmin f16, scales[12], qs[128].  x = d * sc * q - dmin * m
const Q4_K_BYTES: u32 = 144u;
const Q4_K_DM: u32 = 0u;
const Q4_K_SCALES: u32 = 4u;
const Q4_K_QS: u32 = 16u;
fn dq_q4_k(rb: u32, g: u32) -> Dq {
    let w = (rb >> 2u) + (g >> 5u) * (Q4_K_BYTES / 4u);
    let gi = g & 31u;
    let dm = unpack2x16float(W[w + Q4_K_DM / 4u]);
    let sw = w + Q4_K_SCALES / 4u;
    let s = k_scales(W[sw], W[sw + 1u], W[sw + 2u], gi >> 3u);
    let q = W[w + Q4_K_QS / 4u + gi];
    return Dq(dm.x * s.x * nib_lo(q) - dm.y * s.z, dm.x * s.y * nib_hi(q) - dm.y * s.w);
}

// Q5_K, 176 bytes: d f16, dmin f16, scales[12], qh[32], qs[128]; 5th bit of element 64j+l (+32) is
// bit 2j (2j+1) of qh[l].  x = d * sc * q - dmin * m
const Q5_K_BYTES: u32 = 176u;
const Q5_K_DM: u32 = 0u;
const Q5_K_SCALES: u32 = 4u;
const Q5_K_QH: u32 = 16u;
const Q5_K_QS: u32 = 48u;
fn dq_q5_k(rb: u32, g: u32) -> Dq {
    let w = (rb >> 2u) + (g >> 5u) * (Q5_K_BYTES / 4u);
    let gi = g & 31u;
    let j = gi >> 3u;
    let dm = unpack2x16float(W[w + Q5_K_DM / 4u]);
    let sw = w + Q5_K_SCALES / 4u;
    let s = k_scales(W[sw], W[sw + 1u], W[sw + 2u], j);
    let qh = W[w + Q5_K_QH / 4u + (gi & 7u)];
    let q = W[w + Q5_K_QS / 4u + gi];
    return Dq(dm.x * s.x * (nib_lo(q) + 16.0 * bit_of_bytes(qh, 2u * j)) - dm.y * s.z,
              dm.x * s.y * (nib_hi(q) + 16.0 * bit_of_bytes(qh, 2u * j + 1u)) - dm.y * s.w);
}

// Q6_K, 210 bytes: ql[128], qh[64], scales[16] i8, d f16. Half h (128 elements) uses ql[64h..], qh[32h..],
// scales[8h..]; its element 32k + l (k = 0..3, l = 0..31) is
//   q = (nibble k/2 of ql[64h + 32(k%2) + l]) | ((qh[32h + l] >> 2k) & 3) << 4,  x = d * scales[8h + l/16 + 2k] * (q - 32).
// Here group gi: h = gi/16, k = 2s (lo) and 2s+1 (hi) with s = (gi/8)%2, l = 4*(gi%8).
const Q6_K_BYTES: u32 = 210u;
const Q6_K_QL: u32 = 0u;
const Q6_K_QH: u32 = 128u;
const Q6_K_SCALES: u32 = 192u;
const Q6_K_D: u32 = 208u;
fn dq_q6_k(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * Q6_K_BYTES;
    let gi = g & 31u;
    let h = gi >> 4u;
    let s = (gi >> 3u) & 1u;
    let l = 4u * (gi & 7u);
    let d = ld_f16(blk + Q6_K_D);
    let qa = ld_u32(blk + Q6_K_QL + 64u * h + l);
    let qb = ld_u32(blk + Q6_K_QL + 64u * h + 32u + l);
    let qh = ld_u32(blk + Q6_K_QH + 32u * h + l);
    let sc = blk + Q6_K_SCALES + 8u * h + l / 16u + 4u * s;
    let sca = f32(bitcast<i32>(ld_u8(sc) << 24u) >> 24u);
    let scb = f32(bitcast<i32>(ld_u8(sc + 2u) << 24u) >> 24u);
    let na = select(nib_lo(qa), nib_hi(qa), s == 1u);
    let nb = select(nib_lo(qb), nib_hi(qb), s == 1u);
    let ha = vec4<f32>((vec4<u32>(qh) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(4u * s))) & vec4<u32>(3u));
    let hb = vec4<f32>((vec4<u32>(qh) >> (vec4<u32>(2u, 10u, 18u, 26u) + vec4<u32>(4u * s))) & vec4<u32>(3u));
    return Dq(d * sca * (na + 16.0 * ha - 32.0), d * scb * (nb + 16.0 * hb - 32.0));
}

// ---- ternary types: x = d * (t - 1) for a trit t = 0, 1, 2 ------------------------------------------------

// TQ2_0, 66 bytes: qs[64], d f16. The 2-bit fields sit as Q2_K's (above): element 128n + 32j + l is bits 2j, 2j+1
// of qs[32n + l], t = that field (a 3 decodes as 2, as ggml does).  HALF = 32: group gi as Q2_K's.
const TQ2_0_BYTES: u32 = 66u;
const TQ2_0_QS: u32 = 0u;
const TQ2_0_D: u32 = 64u;
fn dq_tq2_0(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * TQ2_0_BYTES;
    let gi = g & 31u;
    let c = gi >> 3u;
    let d = ld_f16(blk + TQ2_0_D);
    let q = ld_u32(blk + TQ2_0_QS + 32u * (c >> 1u) + 4u * (gi & 7u)) >> (4u * (c & 1u));
    return Dq(d * (crumbs_lo(q) - 1.0), d * (crumbs_hi(q) - 1.0));
}

// TQ1_0, 54 bytes: qs[48], qh[4], d f16. A byte b holds up to 5 trits as base-3 digits of b * 243 / 256
// (ggml's fixed point): digit k (k = 0 most significant) is t = ((b * 3^k) mod 256) * 3 >> 8. The 256 elements are
// three runs, each of 4-aligned quads of consecutive bytes times one power 3^k (ggml's dequantize_row_tq1_0):
//   elements   0..159: element 32k + l from qs[l]      (l < 32, k < 5)
//   elements 160..239: element 160 + 16k + l from qs[32 + l]  (l < 16, k < 5)
//   elements 240..255: element 240 + 4k + l from qh[l] (l < 4,  k < 4), and qh follows qs, at byte 48.
// HALF = 4: group g is elements 8g..8g+7 of the row, two quads, never across a run (160 and 240 are multiples of 8).
const TQ1_0_BYTES: u32 = 54u;
const TQ1_0_QS: u32 = 0u;     // qs[48], then qh[4] at byte 48: the three runs read bytes 0, 32, 48 on
const TQ1_0_D: u32 = 52u;

// 3^k for k = 0..4, picked with selects (no run-time indexed array: see iq4_levels).
fn pow3(k: u32) -> u32 {
    return select(select(select(select(1u, 3u, k >= 1u), 9u, k >= 2u), 27u, k >= 3u), 81u, k >= 4u);
}

// The trits of the quad of elements e..e+3 (e % 4 == 0, e < 256) of the block starting at byte blk, as 0, 1, 2.
fn tq1_quad(blk: u32, e: u32) -> vec4<f32> {
    let run1 = e >= 160u;
    let run2 = e >= 240u;
    let start = select(select(0u, 160u, run1), 240u, run2);        // first element of the run
    let width = select(select(32u, 16u, run1), 4u, run2);          // bytes of the run
    let byte0 = select(select(0u, 32u, run1), 48u, run2);          // its first byte
    let k = (e - start) / width;
    let b = u8x4(ld_u32(blk + TQ1_0_QS + byte0 + (e - start) % width));
    let v = (b * pow3(k)) & vec4<u32>(0xFFu);
    return vec4<f32>((v * 3u) >> vec4<u32>(8u));
}

fn dq_tq1_0(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * TQ1_0_BYTES;
    let e = 8u * (g & 31u);
    let d = ld_f16(blk + TQ1_0_D);
    return Dq(d * (tq1_quad(blk, e) - 1.0), d * (tq1_quad(blk, e + 4u) - 1.0));
}

// ---- 1- and 2-bit blocks of consecutive values: x = d * a small integer -----------------------------------------

// Q1_0, 18 bytes, 128 elements: d f16, qs[16]; element j is bit j % 8 of qs[j / 8]: set gives +d, clear -d.
// HALF = 4: group gi (of 16 per block) is byte gi, lo its bits 0-3, hi bits 4-7.
const Q1_0_BYTES: u32 = 18u;
const Q1_0_D: u32 = 0u;
const Q1_0_QS: u32 = 2u;

// Bits first..first+3 of b, as -1.0 (clear) or +1.0 (set).
fn pm1(b: u32, first: u32) -> vec4<f32> {
    let bit = (vec4<u32>(b) >> (vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
    return 2.0 * vec4<f32>(bit) - 1.0;
}

fn dq_q1_0(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 4u) * Q1_0_BYTES;
    let d = ld_f16(blk + Q1_0_D);
    let b = ld_u8(blk + Q1_0_QS + (g & 15u));
    return Dq(d * pm1(b, 0u), d * pm1(b, 4u));
}

// Q2_0, 18 bytes, 64 elements: d f16, qs[16]; element j is bits 2(j % 4), 2(j % 4) + 1 of qs[j / 4], a field q
// of 0..3.  x = d * (q - 1), so -1, 0, 1, 2 (TQ2_0's arithmetic; its fields sit in Q2_K's order, these in element
// order).  HALF = 4: group gi (of 8 per block) is the bytes qs[2gi], qs[2gi + 1] (an even offset), lo the first's four
// fields, hi the second's.
const Q2_0_BYTES: u32 = 18u;
const Q2_0_D: u32 = 0u;
const Q2_0_QS: u32 = 2u;
fn dq_q2_0(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 3u) * Q2_0_BYTES;
    let d = ld_f16(blk + Q2_0_D);
    let q = ld_u16(blk + Q2_0_QS + 2u * (g & 7u));
    let lo = vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(3u));
    let hi = vec4<f32>((vec4<u32>(q) >> vec4<u32>(8u, 10u, 12u, 14u)) & vec4<u32>(3u));
    return Dq(d * (lo - 1.0), d * (hi - 1.0));
}

// ---- 4-bit floats: E2M1 values times a block scale ----------------------------------------------------------

// The 16 E2M1 codes doubled (ggml's kvalues_mxfp4; the scales carry the 1/2), as int8 bytes as iq4_levels holds its
// table: code i is byte i % 4 of word i / 4.  0 1 2 3 | 4 6 8 12 | -0 -1 -2 -3 | -4 -6 -8 -12
fn fp4_levels(n: vec4<u32>) -> vec4<f32> {
    const W0 = vec4<u32>(0x03020100u);
    const W1 = vec4<u32>(0x0C080604u);
    const W2 = vec4<u32>(0xFDFEFF00u);
    const W3 = vec4<u32>(0xF4F8FAFCu);
    let odd = (n & vec4<u32>(4u)) != vec4<u32>(0u);     // word 1 or 3
    let w = select(select(W0, W1, odd), select(W2, W3, odd), n >= vec4<u32>(8u));
    return vec4<f32>(bitcast<vec4<i32>>(w << (vec4<u32>(24u) - 8u * (n & vec4<u32>(3u)))) >> vec4<u32>(24u));
}

// MXFP4, 17 bytes: e u8 (E8M0), qs[16] (nibbles as Q4_0).  x = 2^(e - 128) * levels[q] (ggml_e8m0_to_fp32_half:
// e < 2 gives the subnormals 2^-128, 2^-127, built from their bits as ggml does; a GPU may flush them to zero).
const MXFP4_BYTES: u32 = 17u;
const MXFP4_E: u32 = 0u;
const MXFP4_QS: u32 = 1u;
fn dq_mxfp4(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 2u) * MXFP4_BYTES;
    let e = ld_u8(blk + MXFP4_E);
    let d = bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << (e & 1u), e < 2u));
    let q = ld_u32(blk + MXFP4_QS + 4u * (g & 3u));
    return Dq(d * fp4_levels(nibs_lo(q)), d * fp4_levels(nibs_hi(q)));
}

// NVFP4, 36 bytes: d[4] (UE4M3, one per 16 elements), qs[32]. Sub-block s (elements 16s..16s+15) has scale d[s] and
// qs[8s..8s+7]: element 16s + j is the low nibble of qs[8s + j], 16s + 8 + j its high nibble.
// UE4M3 (ggml_ue4m3_to_fp32, halved for the doubled levels): exponent bits 3-6, mantissa bits 0-2, bit 7 ignored;
// 0 and 0x7F decode to 0; exponent 0: m * 2^-10; else (1 + m/8) * 2^(exp - 8).  x = scale * levels[q].
// HALF = 8: group gi (of 8 per block) is qs word gi, sub-block gi / 2; 36-byte blocks keep words aligned.
const NVFP4_BYTES: u32 = 36u;
const NVFP4_D: u32 = 0u;
const NVFP4_QS: u32 = 4u;
fn ue4m3_half(x: u32) -> f32 {
    let ex = (x >> 3u) & 15u;
    let m = x & 7u;
    let v = select(bitcast<f32>(((ex + 119u) << 23u) | (m << 20u)), f32(m) * (1.0 / 1024.0), ex == 0u);
    return select(v, 0.0, x == 0x7Fu);
}

fn dq_nvfp4(rb: u32, g: u32) -> Dq {
    let w = (rb >> 2u) + (g >> 3u) * (NVFP4_BYTES / 4u);
    let gi = g & 7u;
    let d = ue4m3_half((W[w + NVFP4_D / 4u] >> (8u * (gi >> 1u))) & 0xFFu);
    let q = W[w + NVFP4_QS / 4u + gi];
    return Dq(d * fp4_levels(nibs_lo(q)), d * fp4_levels(nibs_hi(q)));
}

// ---- grid types: 8 (or 4) values a point of a lattice table, times a sub-block scale, and signs or (IQ1) a delta --
// The tables are lab/format/iq_grids.py's (ggml's iq2xxs_grid ...), packed by lab/gpu/shaders.py into private arrays
// of u32 words (shaders.py says why this form): point p is the 16-bit half p % 2 of word p / 2, its values codes of
// b bits (2: the IQ2 and IQ1 grids, 8 values a point; 3: the IQ3 grids, 4 values) into the grid's levels, NAME_LEVELS
// (level c is byte c % 4 of word c / 4; int8 in IQ1's). The grids over 256 words come in parts of 256 (IQ2S_GRID0 ...),
// each part its own array, read through a function that picks one (shaders.py: GRID_PART, and why). HALF = 4 for all
// of them: group g is elements 8g..8g+7, one 8-value point, or two 4-value points, of sub-block (g % 32) / 4 of block
// g / 32.
var<private> IQ2XXS_GRID: array<u32, 128> = {{IQ2XXS_GRID}};
var<private> IQ2XS_GRID: array<u32, 256> = {{IQ2XS_GRID}};
var<private> IQ2S_GRID0: array<u32, 256> = {{IQ2S_GRID0}};
var<private> IQ2S_GRID1: array<u32, 256> = {{IQ2S_GRID1}};
var<private> IQ3XXS_GRID: array<u32, 128> = {{IQ3XXS_GRID}};
var<private> IQ3S_GRID: array<u32, 256> = {{IQ3S_GRID}};
var<private> IQ1S_GRID0: array<u32, 256> = {{IQ1S_GRID0}};
var<private> IQ1S_GRID1: array<u32, 256> = {{IQ1S_GRID1}};
var<private> IQ1S_GRID2: array<u32, 256> = {{IQ1S_GRID2}};
var<private> IQ1S_GRID3: array<u32, 256> = {{IQ1S_GRID3}};
const IQ2XXS_LEVELS: vec2<u32> = {{IQ2XXS_LEVELS}};
const IQ2XS_LEVELS: vec2<u32> = {{IQ2XS_LEVELS}};
const IQ2S_LEVELS: vec2<u32> = {{IQ2S_LEVELS}};
const IQ3XXS_LEVELS: vec2<u32> = {{IQ3XXS_LEVELS}};
const IQ3S_LEVELS: vec2<u32> = {{IQ3S_LEVELS}};
const IQ1S_LEVELS: vec2<u32> = {{IQ1S_LEVELS}};

// Word i of IQ2S's grid (points 2i, 2i + 1), and of IQ1S's.
fn iq2s_word(i: u32) -> u32 {
    if (i < 256u) {
        return IQ2S_GRID0[i];
    }
    return IQ2S_GRID1[i & 255u];
}

fn iq1s_word(i: u32) -> u32 {
    switch (i >> 8u) {
        case 0u: { return IQ1S_GRID0[i & 255u]; }
        case 1u: { return IQ1S_GRID1[i & 255u]; }
        case 2u: { return IQ1S_GRID2[i & 255u]; }
        default: { return IQ1S_GRID3[i & 255u]; }
    }
}

// Point p's 16 bits, from w = its grid's word p / 2.
fn grid_point(w: u32, p: u32) -> u32 {
    return (w >> (16u * (p & 1u))) & 0xFFFFu;
}

// The level bytes of the four b-bit codes at bits first, first + b, first + 2b, first + 3b of point h.
fn grid_values(h: u32, first: u32, b: u32, lv: vec2<u32>) -> vec4<u32> {
    let c = (vec4<u32>(h) >> (vec4<u32>(first) + b * vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>((1u << b) - 1u);
    let w = select(vec4<u32>(lv.x), vec4<u32>(lv.y), c >= vec4<u32>(4u));
    return (w >> (8u * (c & vec4<u32>(3u)))) & vec4<u32>(0xFFu);
}

// The 8 sign bits of a 7-bit sign index i: i | parity(i) << 7 (ggml's ksigns_iq2xs, an even count of minus signs;
// tests/unit/test_iq_grids.py holds the formula to the table).
fn ksigns(i: u32) -> u32 {
    return i | ((countOneBits(i) & 1u) << 7u);
}

// +1 or -1 for bits first..first+3 of s (a set bit is a minus).
fn signs4(s: u32, first: u32) -> vec4<f32> {
    let b = (vec4<u32>(s) >> (vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
    return vec4<f32>(1.0) - 2.0 * vec4<f32>(b);
}

// IQ2_XXS, 66 bytes: d f16, qs[64]. Sub-block ib (0..7) of 32 elements is the 8 bytes qs[8ib..]: word a0 holds four
// grid indices (byte l: elements 32ib + 8l..+7), word a1 four 7-bit sign indices (bits 7l..7l+6) and the 4-bit scale
// (bits 28-31).  x = d * (0.5 + scale) * 0.25 * grid[a0 byte l][j] * sign bit j of ksigns(index l).
const IQ2_XXS_BYTES: u32 = 66u;
const IQ2_XXS_D: u32 = 0u;
const IQ2_XXS_QS: u32 = 2u;
fn dq_iq2_xxs(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * IQ2_XXS_BYTES;
    let ib = (g >> 2u) & 7u;
    let l = g & 3u;
    let a0 = ld_u32(blk + IQ2_XXS_QS + 8u * ib);
    let a1 = ld_u32(blk + IQ2_XXS_QS + 8u * ib + 4u);
    let db = ld_f16(blk + IQ2_XXS_D) * (0.5 + f32(a1 >> 28u)) * 0.25;
    let p = (a0 >> (8u * l)) & 0xFFu;
    let s = ksigns((a1 >> (7u * l)) & 127u);
    let h = grid_point(IQ2XXS_GRID[p >> 1u], p);
    return Dq(db * vec4<f32>(grid_values(h, 0u, 2u, IQ2XXS_LEVELS)) * signs4(s, 0u),
              db * vec4<f32>(grid_values(h, 8u, 2u, IQ2XXS_LEVELS)) * signs4(s, 4u));
}

// IQ3_XXS, 98 bytes: d f16, qs[64] (grid indices, one byte a 4-value point), scales_and_signs[32] (one word a
// sub-block). Sub-block ib (0..7): qs[8ib..8ib+7]; word a = scales_and_signs[4ib..]: four 7-bit sign indices
// (bits 7l..7l+6, for elements 32ib + 8l..+7) and the 4-bit scale (bits 28-31). Elements 32ib + 8l + j are point
// qs[8ib + 2l] (j < 4) and point qs[8ib + 2l + 1] (j >= 4).  x = d * (0.5 + scale) * 0.5 * grid value * sign.
const IQ3_XXS_BYTES: u32 = 98u;
const IQ3_XXS_D: u32 = 0u;
const IQ3_XXS_QS: u32 = 2u;
const IQ3_XXS_SS: u32 = 66u;
fn dq_iq3_xxs(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * IQ3_XXS_BYTES;
    let ib = (g >> 2u) & 7u;
    let l = g & 3u;
    let a = ld_u32(blk + IQ3_XXS_SS + 4u * ib);
    let db = ld_f16(blk + IQ3_XXS_D) * (0.5 + f32(a >> 28u)) * 0.5;
    let q = ld_u16(blk + IQ3_XXS_QS + 8u * ib + 2u * l);
    let s = ksigns((a >> (7u * l)) & 127u);
    let p1 = q & 0xFFu;
    let p2 = q >> 8u;
    return Dq(db * vec4<f32>(grid_values(grid_point(IQ3XXS_GRID[p1 >> 1u], p1), 0u, 3u, IQ3XXS_LEVELS)) * signs4(s, 0u),
              db * vec4<f32>(grid_values(grid_point(IQ3XXS_GRID[p2 >> 1u], p2), 0u, 3u, IQ3XXS_LEVELS)) * signs4(s, 4u));
}

// The sub-block scale of the IQ2_XS / IQ2_S group gi (of 32 per block): d * (0.5 + nibble) * 0.25, where byte
// scales[gi / 4] holds the scale of the sub-block's first 16 values in its low nibble, of the last 16 in its high.
fn iq2_scale(d: f32, scales: u32, gi: u32) -> f32 {
    return d * (0.5 + f32((scales >> (4u * ((gi >> 1u) & 1u))) & 15u)) * 0.25;
}

// IQ2_XS, 74 bytes: d f16, qs[32] u16, scales[8]. Group gi (elements 8gi..8gi+7 of the block) is qs[gi]: bits 0-8
// the index of an 8-value point of iq2xs_grid (512), bits 9-15 a 7-bit sign index (ksigns, as IQ2_XXS).
// x = iq2_scale * grid value * sign.
const IQ2_XS_BYTES: u32 = 74u;
const IQ2_XS_D: u32 = 0u;
const IQ2_XS_QS: u32 = 2u;
const IQ2_XS_SCALES: u32 = 66u;
fn dq_iq2_xs(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * IQ2_XS_BYTES;
    let gi = g & 31u;
    let db = iq2_scale(ld_f16(blk + IQ2_XS_D), ld_u8(blk + IQ2_XS_SCALES + (gi >> 2u)), gi);
    let q = ld_u16(blk + IQ2_XS_QS + 2u * gi);
    let p = q & 511u;
    let s = ksigns(q >> 9u);
    let h = grid_point(IQ2XS_GRID[p >> 1u], p);
    return Dq(db * vec4<f32>(grid_values(h, 0u, 2u, IQ2XS_LEVELS)) * signs4(s, 0u),
              db * vec4<f32>(grid_values(h, 8u, 2u, IQ2XS_LEVELS)) * signs4(s, 4u));
}

// IQ2_S, 82 bytes: d f16, qs[32] (grid index, low 8 bits), signs[32] (a whole sign byte a group, no parity rule),
// qh[8], scales[8] (as IQ2_XS). Group gi = 4ib + l: point qs[gi] | (bits 2l, 2l+1 of qh[ib]) << 8 of iq2s_grid
// (1024), signs[gi].  x = iq2_scale * grid value * sign.
const IQ2_S_BYTES: u32 = 82u;
const IQ2_S_D: u32 = 0u;
const IQ2_S_QS: u32 = 2u;
const IQ2_S_SIGNS: u32 = 34u;
const IQ2_S_QH: u32 = 66u;
const IQ2_S_SCALES: u32 = 74u;
fn dq_iq2_s(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * IQ2_S_BYTES;
    let gi = g & 31u;
    let ib = gi >> 2u;
    let db = iq2_scale(ld_f16(blk + IQ2_S_D), ld_u8(blk + IQ2_S_SCALES + ib), gi);
    let p = ld_u8(blk + IQ2_S_QS + gi) | (((ld_u8(blk + IQ2_S_QH + ib) >> (2u * (gi & 3u))) & 3u) << 8u);
    let s = ld_u8(blk + IQ2_S_SIGNS + gi);
    let h = grid_point(iq2s_word(p >> 1u), p);
    return Dq(db * vec4<f32>(grid_values(h, 0u, 2u, IQ2S_LEVELS)) * signs4(s, 0u),
              db * vec4<f32>(grid_values(h, 8u, 2u, IQ2S_LEVELS)) * signs4(s, 4u));
}

// IQ3_S, 110 bytes: d f16, qs[64] (grid index, low 8 bits; two 4-value points a group), qh[8], signs[32] (a whole
// sign byte a group), scales[4]. Group gi = 4ib + l: points qs[8ib + 2l] | (bit 2l of qh[ib]) << 8 (lo) and
// qs[8ib + 2l + 1] | (bit 2l + 1 of qh[ib]) << 8 (hi) of iq3s_grid (512), signs[gi]; the sub-block's scale is nibble
// ib % 2 of scales[ib / 2].  x = d * (1 + 2 scale) * grid value * sign.
const IQ3_S_BYTES: u32 = 110u;
const IQ3_S_D: u32 = 0u;
const IQ3_S_QS: u32 = 2u;
const IQ3_S_QH: u32 = 66u;
const IQ3_S_SIGNS: u32 = 74u;
const IQ3_S_SCALES: u32 = 106u;
fn dq_iq3_s(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * IQ3_S_BYTES;
    let gi = g & 31u;
    let ib = gi >> 2u;
    let sc = (ld_u8(blk + IQ3_S_SCALES + (ib >> 1u)) >> (4u * (ib & 1u))) & 15u;
    let db = ld_f16(blk + IQ3_S_D) * f32(1u + 2u * sc);
    let q = ld_u16(blk + IQ3_S_QS + 2u * gi);
    let h = ld_u8(blk + IQ3_S_QH + ib) >> (2u * (gi & 3u));
    let s = ld_u8(blk + IQ3_S_SIGNS + gi);
    let p1 = (q & 0xFFu) | ((h & 1u) << 8u);
    let p2 = (q >> 8u) | ((h & 2u) << 7u);
    return Dq(db * vec4<f32>(grid_values(grid_point(IQ3S_GRID[p1 >> 1u], p1), 0u, 3u, IQ3S_LEVELS)) * signs4(s, 0u),
              db * vec4<f32>(grid_values(grid_point(IQ3S_GRID[p2 >> 1u], p2), 0u, 3u, IQ3S_LEVELS)) * signs4(s, 4u));
}

// IQ1_S and IQ1_M: 8-value points of iq1s_grid (2048; values -1, 0, 1 as int8 bytes), each value plus a delta of
// +-IQ1S_DELTA (lab/format/iq_grids.py), times a sub-block scale dl.  x = dl * (grid value + delta)
fn iq1_values(p: u32, dl: f32, delta: f32) -> Dq {
    let h = grid_point(iq1s_word(p >> 1u), p);
    let lo = bitcast<vec4<i32>>(grid_values(h, 0u, 2u, IQ1S_LEVELS) << vec4<u32>(24u)) >> vec4<u32>(24u);
    let hi = bitcast<vec4<i32>>(grid_values(h, 8u, 2u, IQ1S_LEVELS) << vec4<u32>(24u)) >> vec4<u32>(24u);
    return Dq(dl * (vec4<f32>(lo) + delta), dl * (vec4<f32>(hi) + delta));
}

// IQ1_S, 50 bytes: d f16, qs[32] (grid index, low 8 bits), qh[8] u16 (one a sub-block ib of 32 values). Group
// gi = 4ib + l: point qs[gi] | (bits 3l..3l+2 of qh[ib]) << 8; bits 12-14 of qh[ib] the scale s, dl = d * (2s + 1);
// bit 15 the delta's sign (set: -0.125).
const IQ1_S_BYTES: u32 = 50u;
const IQ1_S_D: u32 = 0u;
const IQ1_S_QS: u32 = 2u;
const IQ1_S_QH: u32 = 34u;
const IQ1_DELTA: f32 = {{IQ1S_DELTA}};
fn dq_iq1_s(rb: u32, g: u32) -> Dq {
    let blk = rb + (g >> 5u) * IQ1_S_BYTES;
    let gi = g & 31u;
    let qh = ld_u16(blk + IQ1_S_QH + 2u * (gi >> 2u));
    let dl = ld_f16(blk + IQ1_S_D) * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let p = ld_u8(blk + IQ1_S_QS + gi) | (((qh >> (3u * (gi & 3u))) & 7u) << 8u);
    return iq1_values(p, dl, select(IQ1_DELTA, -IQ1_DELTA, (qh & 0x8000u) != 0u));
}

// IQ1_M, 56 bytes: qs[32] (grid index, low 8 bits), qh[16], scales[8] (four u16, sc[0..3]); no d field: d is the
// f16 whose nibbles 0..3 are the top nibbles of sc[0..3]. Group gi = 4ib + l: point qs[gi] | (bits 4(l%2)..+2 of
// qh[2ib + l/2]) << 8, the delta's sign bit 4(l%2) + 3 of that byte (set: -0.125); the 3-bit scale s is bits
// 6(ib%2) + 3(l/2)..+2 of sc[ib/2], dl = d * (2s + 1). 56-byte blocks keep the scale words aligned.
const IQ1_M_BYTES: u32 = 56u;
const IQ1_M_QS: u32 = 0u;
const IQ1_M_QH: u32 = 32u;
const IQ1_M_SCALES: u32 = 48u;
fn dq_iq1_m(rb: u32, g: u32) -> Dq {
    let w = (rb + (g >> 5u) * IQ1_M_BYTES) >> 2u;
    let gi = g & 31u;
    let ib = gi >> 2u;
    let s01 = W[w + IQ1_M_SCALES / 4u];             // sc[0] | sc[1] << 16
    let s23 = W[w + IQ1_M_SCALES / 4u + 1u];        // sc[2] | sc[3] << 16
    let dbits = ((s01 >> 12u) & 0xFu) | ((s01 >> 24u) & 0xF0u) | ((s23 >> 4u) & 0xF00u) | ((s23 >> 16u) & 0xF000u);
    let sc = select(s01, s23, ib >= 4u) >> (16u * ((ib >> 1u) & 1u));
    let s = (sc >> (6u * (ib & 1u) + 3u * ((gi >> 1u) & 1u))) & 7u;
    let dl = unpack2x16float(dbits).x * f32(2u * s + 1u);
    let qh = (W[w + (IQ1_M_QH + (gi >> 1u)) / 4u] >> (8u * ((gi >> 1u) & 3u) + 4u * (gi & 1u))) & 15u;
    let p = ((W[w + (IQ1_M_QS + gi) / 4u] >> (8u * (gi & 3u))) & 0xFFu) | ((qh & 7u) << 8u);
    return iq1_values(p, dl, select(IQ1_DELTA, -IQ1_DELTA, (qh & 8u) != 0u));
}
