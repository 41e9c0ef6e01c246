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
//   Q8_0 a = d, c = 0; Q4_0 q = nibble, c = -8 d; Q4_1 c = m; Q5_0 q = 5 bits, c = -16 d; Q5_1 c = m), and the
//   input block x ~ dx * qx, so sum_k w_k x_k = a dx (sum_k q_k qx_k) + c (dx sum_k qx_k): the integer dot
//   product is the subgroup matrix product, the rest f32 per (token, row, block).
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
// Constants: IQ (the type's unpack function), BB (bytes per block), RQ (16-row quarters a workgroup: 1 or 2).
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
const RQ: u32 = {{RQ}}u;
const WG: u32 = 32u;                  // one subgroup (the adapter's subgroups are exactly 32 wide)
const TR: u32 = 16u * RQ;             // rows a workgroup

alias Left = subgroup_matrix_left<i8, 32, 16>;      // 16 tokens x 32 columns
alias Right = subgroup_matrix_right<i8, 16, 32>;    // 32 columns x 16 rows
alias Res = subgroup_matrix_result<i32, 16, 16>;    // 16 tokens x 16 rows

var<workgroup> wq: array<i32, 2u * TR * 8u>;  // two buffers of [TR rows][32 columns] int8, 8 words a row
var<workgroup> wac: array<vec2<f32>, 2u * TR>; // two buffers of the block's (a, c) per row
var<workgroup> sx: array<vec2<f32>, 64>;      // two buffers of the block's (d, d * sum q) per token
var<workgroup> res: array<i32, 512u * RQ>;    // the quarters' 16 x 16 products, row-major (token, row)
// ---- one block's 8 values (j-th eight of 32) as int8 in two words, and the block's (a, c); the byte offsets
//      are quant.wgsl's named ones (one home for each block layout) ------------------------------------------
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

// Block b's TR rows into buffer `buf` of wq / wac (TR rows x 4 eighths), and its 32 tokens' scales into sx.
fn unpack(buf: u32, b: u32, lid: u32, row0: u32, last: u32, tok0: u32, nt: u32) {
    for (var u = lid; u < 4u * TR; u += WG) {
        let ur = u / 4u;
        let uj = u % 4u;
        let iq = {{IQ}}(min(row0 + ur, last) * p.row_bytes + b * BB, uj);
        wq[8u * TR * buf + 8u * ur + 2u * uj] = bitcast<i32>(iq.q.x);
        wq[8u * TR * buf + 8u * ur + 2u * uj + 1u] = bitcast<i32>(iq.q.y);
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
                let r = subgroupMatrixLoad<Right>(&wq, 32u * TR * cur + 16u * ri * 32u, true, 32u);
                subgroupMatrixStore(&res, 256u * (RQ * ti + ri), subgroupMatrixMultiplyAccumulate(l, r, Res()),
                                    false, 16u);
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
                    acc[8u * q + e] += f32(res[256u * q + lid + 32u * e]) * (xv.x * ac.x) + xv.y * ac.y;
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
