// L2 norm of every row of a quantized matrix (the embedding table, for cosine neighbours), dequantized in place.
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks, rows first_row..first_row+n_rows)
//           1 norms (storage, read_write: array<f32>, one per row of the whole matrix)
//           2 p (uniform Params)
// Math: norms[first_row + r] = sqrt(sum_c W[r, c]^2), r < n_rows, summed in f32 over the row's groups of 8.
// Uniform fields: first_row, n_rows, gpr (groups of 8 values per row = cols / 8), row_bytes.
// Organisation: one thread per row (it runs once per model: simplicity over speed). Constants: WG, DQ.
// Grid: groups_1d(n_rows, WG): row = (wid.x + wid.y * num_workgroups.x) * WG + lid.

struct Params { first_row: u32, n_rows: u32, gpr: u32, row_bytes: u32 };

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read_write> norms: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

//!include quant.wgsl

const WG: u32 = {{WG}}u;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = (wid.x + wid.y * nwg.x) * WG + lid;
    if (r >= p.n_rows) { return; }
    var acc = 0.0;
    for (var g = 0u; g < p.gpr; g++) {
        let v = {{DQ}}(r * p.row_bytes, g);
        acc += dot(v.lo, v.lo) + dot(v.hi, v.hi);
    }
    norms[p.first_row + r] = sqrt(acc);
}
