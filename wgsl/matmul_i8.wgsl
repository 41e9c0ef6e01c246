enable chromium_experimental_subgroup_matrix;
enable subgroups;
// Prefill projection on the tensor cores, through Chromium's subgroup matrices (int8 x int8 -> int32, 16x16x32):
// for adapters with that configuration and 32-wide subgroups (lab.gpu.AdapterInfo.int8_matrix). matmul.wgsl's
// math on 8-bit activations, as llama.cpp's quantized matmuls compute it.
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks)
//           1 xq (storage, read: array<i32>, q8_rows.wgsl's [rows, cols] int8 matrix, four values a word; rows
//             past t up to the next multiple of 32 must exist: the left operand loads 16 whole rows)
//           2 xd (storage, read: array<vec2<f32>>, q8_rows.wgsl's (d, d * sum q) per token and block)
//           3 y (storage, read_write: array<f32>, token i's output at y_off + i * y_stride)
//           4 p (uniform Params)
//           5 step (uniform Step; t = n_tokens)
// Math: a weight block of 32 is w = a * q + c with small integers q (this file's IQ function per type:
//   Q8_0 a = d, c = 0; Q4_0 q = nibble, c = -8 d; Q4_1 c = m; Q5_0 q = 5 bits, c = -16 d; Q5_1 c = m; the
//   32-value sub-blocks of the 256-value types: Q4_K / Q5_K a = d sc, c = -dmin m (llama.cpp's MMQ scheme);
//   IQ4_XS q = the level, a = d (ls - 32), c = 0), and the input block x ~ dx * qx, so
//   sum_k w_k x_k = a dx (sum_k q_k qx_k) + c (dx sum_k qx_k): the integer dot product is the subgroup matrix
//   product, the rest f32 per (token, row, block).
//   Q6_K and Q3_K scale each 16 values apart (q - 32 and q - 4, signed, c = 0): their block of 32 is two products
//   (HV = 2), each with the other half's weights zeroed, so sum_k w_k x_k = dx (a0 I0 + a1 I1). Q2_K is not here:
//   its 16-value mins would need the inputs' sums per 16, which q8_rows does not make.
//   Y[i, r] = (acc ? Y[i, r] : 0) + sum over blocks.
// Organisation: a workgroup is one subgroup of 32 and owns 32 tokens x 16 RQ rows, as 2 RQ quarters of 16 x 16 (a
//   subgroup matrix's offsets must be uniform, so the quarters are a loop, not one subgroup each). RQ = 1 for
//   narrow projections: a 576-row projection of 512 tokens is then 576 workgroups, not 288 (one subgroup each, a
//   few per SM: too few to hide the loads' latency). Per block of 32 columns: each quarter multiplies 16 tokens'
//   int8 inputs (loaded straight from xq) by 16 rows of the block, unpacked to int8 in workgroup memory with its
//   (a, c), into a 16x16 int32 matrix stored to workgroup memory (a subgroup matrix has no per-element scaling).
//   Lane l then scales elements l, l + 32, .. of each quarter (row l % 16; tokens l / 16, + 2, ..): consecutive
//   lanes read consecutive words (the first build's 8 consecutive elements a lane were an 8-way bank conflict),
//   with the tokens' (d, d * sum q) staged in workgroup memory. The next block is unpacked (8 values a unit) and
//   its token scales staged into second buffers while the products land, so a block costs two barriers.
// Constants: IQ (the type's unpack function), BB (bytes per GGUF block), SB (blocks of 32 values in a GGUF block: 1,
//   or 8 for the 256-value ones), HV (1, or 2 for types scaled per 16 values), RQ (16-row quarters a workgroup: 1
//   or 2).
// Grid: (ceil(n_rows / (16 RQ)), ceil(t / 32), 1).

//!include common.wgsl

struct Params { n_rows: u32, cols: u32, nb: u32, row_bytes: u32, y_off: u32, y_stride: u32, acc: u32, _p0: u32 };

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> xq: array<i32>;
@group(0) @binding(2) var<storage, read> xd: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;

//!include quant.wgsl

const BB: u32 = {{BB}}u;
const SB: u32 = {{SB}}u;
const HV: u32 = {{HV}}u;
const RQ: u32 = {{RQ}}u;
const WG: u32 = 32u;                  // one subgroup (the adapter's subgroups are exactly 32 wide)
const TR: u32 = 16u * RQ;             // rows a workgroup

alias Left = subgroup_matrix_left<i8, 32, 16>;      // 16 tokens x 32 columns
alias Right = subgroup_matrix_right<i8, 16, 32>;    // 32 columns x 16 rows
alias Res = subgroup_matrix_result<i32, 16, 16>;    // 16 tokens x 16 rows

var<workgroup> wq: array<i32, 2u * HV * TR * 8u>;  // two buffers of HV halves of [TR rows][32 columns] int8, 8
                                                   // words a row (half h: the other half's 16 values zero)
var<workgroup> wac: array<vec2<f32>, 2u * TR>; // two buffers of the block's (a, c) per row ((a0, a1) for HV = 2)
var<workgroup> sx: array<vec2<f32>, 64>;      // two buffers of the block's (d, d * sum q) per token
var<workgroup> res: array<i32, 512u * RQ * HV>; // per half, the quarters' 16 x 16 products, row-major (token, row)
// ---- one block's 8 values as int8 in two words, and the block's (a, c); the byte offsets are quant.wgsl's named
//      ones (one home for each block layout). Arguments: the GGUF block's first byte and the eighth e in it (of
//      4 SB): values 8 e .. 8 e + 7, in block of 32 number e / 4 -------------------------------------------------
struct Iq { q: vec2<u32>, ac: vec2<f32> };

// The low (hi = false) or high nibbles of the 8 bytes at byte offset off, one value a byte.
fn nib8(off: u32, hi: bool) -> vec2<u32> {
    let s = select(0u, 4u, hi);
    return vec2<u32>((ld_u32(off) >> s) & 0x0F0F0F0Fu, (ld_u32(off + 4u) >> s) & 0x0F0F0F0Fu);
}

// Bits e0 .. e0 + 7 of qh as bit 4 of each of 8 bytes (the fifth bit of Q5_0 / Q5_1 values).
fn spread4(b: u32) -> u32 {
    return ((b & 1u) << 4u) | ((b & 2u) << 11u) | ((b & 4u) << 18u) | ((b & 8u) << 25u);
}

fn bits5(qh: u32, e0: u32) -> vec2<u32> {
    let h = qh >> e0;
    return vec2<u32>(spread4(h & 15u), spread4((h >> 4u) & 15u));
}

// Values 0..15 are the low nibbles of qs[0..15], 16..31 their high nibbles.
fn iq_q4_0(blk: u32, j: u32) -> Iq {
    let d = ld_f16(blk + Q4_0_D);
    return Iq(nib8(blk + Q4_0_QS + 8u * (j & 1u), j >= 2u), vec2<f32>(d, -8.0 * d));
}

fn iq_q4_1(blk: u32, j: u32) -> Iq {
    return Iq(nib8(blk + Q4_1_QS + 8u * (j & 1u), j >= 2u),
              vec2<f32>(ld_f16(blk + Q4_1_DM), ld_f16(blk + Q4_1_DM + 2u)));
}

fn iq_q5_0(blk: u32, j: u32) -> Iq {
    let d = ld_f16(blk + Q5_0_D);
    return Iq(nib8(blk + Q5_0_QS + 8u * (j & 1u), j >= 2u) | bits5(ld_u32(blk + Q5_0_QH), 8u * j),
              vec2<f32>(d, -16.0 * d));
}

fn iq_q5_1(blk: u32, j: u32) -> Iq {
    return Iq(nib8(blk + Q5_1_QS + 8u * (j & 1u), j >= 2u) | bits5(ld_u32(blk + Q5_1_QH), 8u * j),
              vec2<f32>(ld_f16(blk + Q5_1_DM), ld_f16(blk + Q5_1_DM + 2u)));
}

fn iq_q8_0(blk: u32, j: u32) -> Iq {
    let qs = blk + Q8_0_QS + 8u * j;
    return Iq(vec2<u32>(ld_u32(qs), ld_u32(qs + 4u)), vec2<f32>(ld_f16(blk + Q8_0_D), 0.0));
}

fn ld_u32x2(off: u32) -> vec2<u32> {
    return vec2<u32>(ld_u32(off), ld_u32(off + 4u));
}

// Bytes v (each 0 .. 2 o - 1) minus o (o = 4 or 32) as int8: bit 7 set first, so no byte borrows from the next.
fn minus8(v: vec2<u32>, o: u32) -> vec2<u32> {
    return ((v | vec2<u32>(0x80808080u)) - vec2<u32>(o * 0x01010101u)) ^ vec2<u32>(0x80808080u);
}

// Sub-block s's (d sc, -dmin m) of a Q4_K / Q5_K block (quant.wgsl's k_scales: sub-blocks 2 (s / 2) and + 1).
fn k_ac(blk: u32, dm: u32, scales: u32, s: u32) -> vec2<f32> {
    let k = k_scales(ld_u32(blk + scales), ld_u32(blk + scales + 4u), ld_u32(blk + scales + 8u), s / 2u);
    return vec2<f32>(ld_f16(blk + dm), -ld_f16(blk + dm + 2u)) * select(k.xz, k.yw, (s & 1u) == 1u);
}

// Q4_K / Q5_K: sub-block s's values are the low (s even) or high nibbles of qs[32 (s / 2) ..], Q5_K's fifth bit
// bit s of qh[0 .. 31].
fn iq_q4_k(blk: u32, e: u32) -> Iq {
    let s = e / 4u;
    return Iq(nib8(blk + Q4_K_QS + 32u * (s / 2u) + 8u * (e % 4u), (s & 1u) == 1u),
              k_ac(blk, Q4_K_DM, Q4_K_SCALES, s));
}

fn iq_q5_k(blk: u32, e: u32) -> Iq {
    let s = e / 4u;
    let h = (ld_u32x2(blk + Q5_K_QH + 8u * (e % 4u)) >> vec2<u32>(s)) & vec2<u32>(0x01010101u);
    return Iq(nib8(blk + Q5_K_QS + 32u * (s / 2u) + 8u * (e % 4u), (s & 1u) == 1u) | (h << vec2<u32>(4u)),
              k_ac(blk, Q5_K_DM, Q5_K_SCALES, s));
}

// Q6_K (HV = 2): block of 32 s = 4 h + k of half h; q - 32 (quant.wgsl's layout), scales[2 s] and [2 s + 1].
fn iq_q6_k(blk: u32, e: u32) -> Iq {
    let s = e / 4u;
    let h = s / 4u;
    let k = s % 4u;
    let j = 8u * (e % 4u);
    let lo = (ld_u32x2(blk + Q6_K_QL + 64u * h + 32u * (k & 1u) + j) >> vec2<u32>(select(0u, 4u, k >= 2u)))
             & vec2<u32>(0x0F0F0F0Fu);
    let hi = (ld_u32x2(blk + Q6_K_QH + 32u * h + j) >> vec2<u32>(2u * k)) & vec2<u32>(0x03030303u);
    let sc = ld_u16(blk + Q6_K_SCALES + 2u * s);
    let a = vec2<f32>(f32(bitcast<i32>(sc << 24u) >> 24u), f32(bitcast<i32>(sc << 16u) >> 24u));
    return Iq(minus8(lo | (hi << vec2<u32>(4u)), 32u), ld_f16(blk + Q6_K_D) * a);
}

// Q3_K (HV = 2): block of 32 s = 4 n + k of half n: bits 2 k of qs[32 n ..] and bit s of hmask[0 .. 31], minus 4;
// the 6-bit scales (minus 32) of sub-blocks t = 2 s and 2 s + 1 (quant.wgsl's layout: nibble t / 8 of
// scales[t % 8], bits 2 (t / 4) of scales[8 + t % 4]; both t share t / 8 and t / 4, so each is one u16).
fn iq_q3_k(blk: u32, e: u32) -> Iq {
    let s = e / 4u;
    let j = 8u * (e % 4u);
    let lo = (ld_u32x2(blk + Q3_K_QS + 32u * (s / 4u) + j) >> vec2<u32>(2u * (s % 4u))) & vec2<u32>(0x03030303u);
    let hi = (ld_u32x2(blk + Q3_K_HMASK + j) >> vec2<u32>(s)) & vec2<u32>(0x01010101u);
    let t = 2u * s;
    let lw = ld_u16(blk + Q3_K_SCALES + t % 8u) >> (4u * (t / 8u));
    let hw = ld_u16(blk + Q3_K_SCALES + 8u + t % 4u) >> (2u * (t / 4u));
    let sc = vec2<u32>((lw & 15u) | ((hw & 3u) << 4u), ((lw >> 8u) & 15u) | (((hw >> 8u) & 3u) << 4u));
    return Iq(minus8(lo | (hi << vec2<u32>(2u)), 4u), ld_f16(blk + Q3_K_D) * (vec2<f32>(sc) - 32.0));
}

// Four int8 levels into one word.
fn pack_i8(v: vec4<f32>) -> u32 {
    let b = bitcast<vec4<u32>>(vec4<i32>(v)) & vec4<u32>(0xFFu);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

// IQ4_XS: sub-block s's values 0..15 are the low nibbles of qs[16 s ..], 16..31 the high ones, as levels.
fn iq_iq4_xs(blk: u32, e: u32) -> Iq {
    let s = e / 4u;
    let w = ld_u32x2(blk + IQ4_XS_QS + 16u * s + 8u * (e & 1u)) >> vec2<u32>(select(0u, 4u, (e % 4u) >= 2u));
    let dsh = ld_u32(blk + IQ4_XS_D_SH);
    let ls = ((ld_u32(blk + IQ4_XS_SL) >> (4u * s)) & 15u) | (((dsh >> (16u + 2u * s)) & 3u) << 4u);
    return Iq(vec2<u32>(pack_i8(iq4_levels(nibs_lo(w.x))), pack_i8(iq4_levels(nibs_lo(w.y)))),
              vec2<f32>(unpack2x16float(dsh).x * (f32(ls) - 32.0), 0.0));
}

// Block b's TR rows into buffer `buf` of wq / wac (TR rows x 4 eighths), and its 32 tokens' scales into sx.
fn unpack(buf: u32, b: u32, lid: u32, row0: u32, last: u32, tok0: u32, nt: u32) {
    for (var u = lid; u < 4u * TR; u += WG) {
        let ur = u / 4u;
        let uj = u % 4u;
        let iq = {{IQ}}(min(row0 + ur, last) * p.row_bytes + (b / SB) * BB, 4u * (b % SB) + uj);
        let at = 8u * TR * HV * buf + 8u * ur + 2u * uj;
        for (var h = 0u; h < HV; h++) {          // HV = 2: eighths 0, 1 in half 0, 2, 3 in half 1, zeros beside
            let keep = HV == 1u || h == uj / 2u;
            wq[at + 8u * TR * h] = select(0i, bitcast<i32>(iq.q.x), keep);
            wq[at + 8u * TR * h + 1u] = select(0i, bitcast<i32>(iq.q.y), keep);
        }
        if (uj == 0u) { wac[TR * buf + ur] = iq.ac; }
    }
    sx[32u * buf + lid] = xd[min(tok0 + lid, nt - 1u) * p.nb + b];
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.x * TR;
    let tok0 = wid.y * 32u;
    let nt = step.n_tokens;
    let last = p.n_rows - 1u;
    // This lane's results in quarter (ti, ri): element lid + 32 e is token 16 ti + lid / 16 + 2 e, row 16 ri + n.
    let n = lid % 16u;
    let m0 = lid / 16u;
    var acc: array<f32, 16u * RQ>;       // [quarter 2 ti + ri][e]
    for (var e = 0u; e < 16u * RQ; e++) { acc[e] = 0.0; }

    unpack(0u, 0u, lid, row0, last, tok0, nt);
    for (var b = 0u; b < p.nb; b++) {
        let cur = b % 2u;
        // block b is unpacked; the last block's scaling has read res and the other buffers
        workgroupBarrier();
        // Offsets must be uniform (a subgroup matrix is the whole subgroup's): one subgroup, quarters in a loop.
        // Offsets and strides count int8 elements, not the i32 words that hold them.
        for (var ti = 0u; ti < 2u; ti++) {
            let l = subgroupMatrixLoad<Left>(&xq, (tok0 + 16u * ti) * p.cols + 32u * b, false, p.cols);
            for (var ri = 0u; ri < RQ; ri++) {
                for (var h = 0u; h < HV; h++) {
                    let r = subgroupMatrixLoad<Right>(&wq, 32u * TR * (HV * cur + h) + 16u * ri * 32u, true, 32u);
                    subgroupMatrixStore(&res, 256u * (2u * RQ * h + RQ * ti + ri),
                                        subgroupMatrixMultiplyAccumulate(l, r, Res()), false, 16u);
                }
            }
        }
        // the next block into the other buffers while this one's products land (its global loads overlap)
        if (b + 1u < p.nb) { unpack(1u - cur, b + 1u, lid, row0, last, tok0, nt); }
        workgroupBarrier();
        for (var ri = 0u; ri < RQ; ri++) {
            let ac = wac[TR * cur + 16u * ri + n];
            for (var ti = 0u; ti < 2u; ti++) {
                let q = RQ * ti + ri;
                for (var e = 0u; e < 8u; e++) {
                    let xv = sx[32u * cur + 16u * ti + m0 + 2u * e];
                    let i0 = f32(res[256u * q + lid + 32u * e]);
                    if (HV == 1u) {
                        acc[8u * q + e] += i0 * (xv.x * ac.x) + xv.y * ac.y;
                    } else {
                        let i1 = f32(res[256u * (2u * RQ + q) + lid + 32u * e]);
                        acc[8u * q + e] += (i0 * ac.x + i1 * ac.y) * xv.x;
                    }
                }
            }
        }
    }

    for (var ti = 0u; ti < 2u; ti++) {
        for (var ri = 0u; ri < RQ; ri++) {
            let r = row0 + 16u * ri + n;
            for (var e = 0u; e < 8u; e++) {
                let tok = tok0 + 16u * ti + m0 + 2u * e;
                if (tok < nt && r < p.n_rows) {
                    let o = p.y_off + tok * p.y_stride + r;
                    var s = acc[8u * (RQ * ti + ri) + e];
                    if (p.acc != 0u) { s += y[o]; }
                    y[o] = s;
                }
            }
        }
    }
}
