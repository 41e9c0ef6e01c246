// Matrix-vector product for one token (decode), dequantizing the weights in place.
// Bindings: 0 W (storage, read: array<u32>, one weight part's GGUF blocks)
//           1 x (storage, read: array<f32>, the input vector at x_off)
//           2 y (storage, read_write: array<f32>, the output at y_off)
//           3 p (uniform Params)
// Math: y[y_off + r] = (acc ? y[y_off + r] : 0) + sum_c W[r, c] * x[x_off + c],  r < n_rows of this part.
// Uniform fields: n_rows (rows of this part), cols, gpr (groups of 8 values per row = cols / 8),
//   row_bytes, x_off, y_off (floats; y_off already includes the part's first row), acc (0 or 1).
// Organisation: one workgroup of WG threads per 4 rows (vec4 accumulator, one lane per row); every
//   thread walks the groups g = lid, lid + WG, ... of all 4 rows, so each x value is loaded once for
//   4 rows and neighbouring threads read neighbouring u32 words of the blocks. The 4 partial sums are
//   reduced over the workgroup: with subgroups, subgroupAdd then one slot per subgroup in shared memory
//   (subgroups assumed to be consecutive ranges of local_invocation_index); without, a shared tree.
// Constants: WG (threads, power of two), DQ (dequant function, e.g. dq_q4_0), HALF (its group shape),
//   SG / NOSG: "" or "// " so that only the chosen reduction is compiled (a device without the
//   subgroups feature rejects any subgroup builtin even in dead code); SG_ENABLE: "enable subgroups;"
//   where the WGSL compiler wants it (browser), "" for naga, which refuses the directive.
// Grid: groups_1d(ceil(n_rows / 4)): workgroup index = wid.x + wid.y * num_workgroups.x.
{{SG_ENABLE}}

struct Params { n_rows: u32, cols: u32, gpr: u32, row_bytes: u32, x_off: u32, y_off: u32, acc: u32, _p: u32 };

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

//!include quant.wgsl

const WG: u32 = {{WG}}u;
const HALF: u32 = {{HALF}}u;

var<workgroup> red: array<vec4<f32>, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>
{{SG}}        , @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sg_lane: u32
        ) {
    let row0 = (wid.x + wid.y * nwg.x) * 4u;
    if (row0 >= p.n_rows) { return; }
    // Rows past the end repeat the last row (valid memory, no branch); their sums are not written.
    let last = p.n_rows - 1u;
    let rb = vec4<u32>(min(row0, last), min(row0 + 1u, last), min(row0 + 2u, last), min(row0 + 3u, last)) * p.row_bytes;

    var acc = vec4<f32>(0.0);
    for (var g = lid; g < p.gpr; g += WG) {
        let e = p.x_off + group_base(g, HALF);
        let xl = vec4<f32>(x[e], x[e + 1u], x[e + 2u], x[e + 3u]);
        let xh = vec4<f32>(x[e + HALF], x[e + HALF + 1u], x[e + HALF + 2u], x[e + HALF + 3u]);
        let v0 = {{DQ}}(rb.x, g);
        let v1 = {{DQ}}(rb.y, g);
        let v2 = {{DQ}}(rb.z, g);
        let v3 = {{DQ}}(rb.w, g);
        acc += vec4<f32>(dot(v0.lo, xl) + dot(v0.hi, xh), dot(v1.lo, xl) + dot(v1.hi, xh),
                         dot(v2.lo, xl) + dot(v2.hi, xh), dot(v3.lo, xl) + dot(v3.hi, xh));
    }

    // Subgroup reduction: one partial per subgroup, then lane r < 4 sums them for row r.
{{SG}}    let s = subgroupAdd(acc);
{{SG}}    if (sg_lane == 0u) { red[lid / sg_size] = s; }
{{SG}}    workgroupBarrier();
{{SG}}    let n_parts = max(WG / sg_size, 1u);
    // Shared-memory tree reduction.
{{NOSG}}    red[lid] = acc;
{{NOSG}}    workgroupBarrier();
{{NOSG}}    for (var k = WG / 2u; k > 0u; k >>= 1u) {
{{NOSG}}        if (lid < k) { red[lid] += red[lid + k]; }
{{NOSG}}        workgroupBarrier();
{{NOSG}}    }
{{NOSG}}    let n_parts = 1u;

    if (lid < 4u && row0 + lid < p.n_rows) {
        var total = 0.0;
        for (var i = 0u; i < n_parts; i++) { total += red[i][lid]; }
        let o = p.y_off + row0 + lid;
        if (p.acc != 0u) { total += y[o]; }
        y[o] = total;
    }
}
