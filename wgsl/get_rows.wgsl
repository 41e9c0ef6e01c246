// Row lookup (embedding): dequantize the rows named by token ids, scaled.
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks, rows first_row..first_row+n_rows)
//           1 ids (storage, read: array<u32>, one token id per token of the step)
//           2 out (storage, read_write: array<f32>, token i's row at out_off + i * cols)
//           3 p (uniform Params)
//           4 step (uniform Step: pos, n_tokens, n_ctx; t = n_tokens)
// Math: out[i, c] = scale * W[ids[i], c] for i < t, when first_row <= ids[i] < first_row + n_rows
//   (ids held by another part are left to that part's dispatch).
// Uniform fields: first_row, n_rows, cols, gpr (= cols / 8), row_bytes, out_off, scale (f32).
// Organisation: one thread per group of 8 values (see quant.wgsl), WG threads per workgroup;
//   wid.y = token. Constants: WG, DQ (dequant function), HALF.
// Grid: (ceil(gpr / WG), t, 1).

//!include common.wgsl

struct Params { first_row: u32, n_rows: u32, cols: u32, gpr: u32, row_bytes: u32, out_off: u32, scale: f32, _p: u32 };

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

//!include quant.wgsl

const WG: u32 = {{WG}}u;
const HALF: u32 = {{HALF}}u;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = wid.y;
    let g = wid.x * WG + lid;
    if (i >= step.n_tokens || g >= p.gpr) { return; }
    let id = ids[i];
    if (id < p.first_row || id - p.first_row >= p.n_rows) { return; }
    let v = {{DQ}}((id - p.first_row) * p.row_bytes, g);
    let o = p.out_off + i * p.cols + group_base(g, HALF);
    let lo = p.scale * v.lo;
    let hi = p.scale * v.hi;
    out[o] = lo.x; out[o + 1u] = lo.y; out[o + 2u] = lo.z; out[o + 3u] = lo.w;
    out[o + HALF] = hi.x; out[o + HALF + 1u] = hi.y; out[o + HALF + 2u] = hi.z; out[o + HALF + 3u] = hi.w;
}
