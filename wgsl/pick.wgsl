// The log-normaliser of one row of logits and a few picked logits from it, into one slot of a results table: what a
// sweep of intervened runs keeps of each run (lab/instruments/experiments.py), so that a whole sweep is read back once.
// Bindings: 0 logits (read, f32 [.., n]: the row starts at p.row)   1 ids (read, u32 [p.n_pick]: the picked ids)
//           2 out (read_write, f32: the results table)            3 p (uniform Params)
// Math: out[p.out] = M + log(sum_i exp(logits[i] - M)) with M the row's maximum (ggml's soft_max does the same
//   shift), out[p.out + 1 + k] = logits[ids[k]]; a log-probability is then the difference of the two.
// Non-finite logits are skipped by the maximum and the sum (as the sampler skips them); a row with none finite gives
//   -inf + log(0): the caller treats a non-finite normaliser as "this run broke the model".
// Params { n, row, n_pick, out }: a CONVERSATION uniform (it follows the user's runs), rewritten before each run.
// Grid: one workgroup of WG threads (a strided pass for the maximum, one for the sum, each reduced in shared memory).

struct Params { n: u32, row: u32, n_pick: u32, out: u32 };

const WG: u32 = {{WG}}u;
const BIG: f32 = 3.0e38;

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> red: array<f32, WG>;

fn finite(x: f32) -> bool { return abs(x) <= BIG; }     // false for NaN and for infinities

@compute @workgroup_size(WG)
fn pick(@builtin(local_invocation_index) lid: u32) {
    var m = -BIG;
    for (var i = lid; i < p.n; i += WG) {
        let x = logits[p.row + i];
        if (finite(x)) { m = max(m, x); }
    }
    red[lid] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
        workgroupBarrier();
    }
    let top = red[0];
    workgroupBarrier();
    var acc = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let x = logits[p.row + i];
        if (finite(x)) { acc += exp(x - top); }
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
        workgroupBarrier();
    }
    if (lid == 0u) { out[p.out] = top + log(red[0]); }
    for (var k = lid; k < p.n_pick; k += WG) {
        out[p.out + 1u + k] = logits[p.row + ids[k]];
    }
}
