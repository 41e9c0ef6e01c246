// Embedding backward (the forward is get_rows.wgsl, out[i, :] = scale * W[ids[i], :]): a scatter-add of the step's
// rows of dx into an f32 gradient table, dE[ids[i], :] += scale * dx[i, :].
// Bindings: 0 dE (storage, read_write: f32 rows first_row .. first_row + n_rows of the table's gradient, cols each)
//           1 ids (storage, read: u32, one per token of the step)  2 dx (storage, read: f32, token i's row at
//           x_off + i * cols)  3 p (uniform Params)  4 step (uniform Step)
// Math (lab/host/reference/grads.py embed_grad is the float64 oracle): for each token i < t in order, when
//   first_row <= ids[i] < first_row + n_rows: dE[ids[i] - first_row, c] += scale * dx[i, c]. Only the rows of ids
//   seen are written; the others keep their bytes (the caller clears the table at the start of a step; the sum
//   over micro-batches accumulates in place). A table over several bindings: one dispatch per part, as get_rows.
// Params { first_row, n_rows, cols, x_off: u32, scale: f32, _p0, _p1, _p2: u32 }.
// Determinism: a repeated id means several tokens add into one row, and WGSL has no float atomics (u32 compare-and-
//   swap loops would add in a scheduling-dependent order), so each invocation owns one column c and walks the tokens
//   in order i = 0, 1, ...: every row's sum comes out in token order, the same bits every run, no two invocations
//   touching one element.
// Cost: `cols` invocations, each t reads of ids and dx and t read-modify-writes of dE, in sequence: the forward's
//   bytes, but only cols-wide parallelism (576 to a few thousand invocations), so on a big GPU a long sequence runs
//   latency-bound. The upgrade when that matters: the host sorts the tokens by id (the ids are the host's), one
//   workgroup per distinct id sums its tokens in order. On lavapipe one invocation's loop stops silently past
//   32,768 iterations (tests/kernels/test_loop_budget.py): t stays under that there.
// Grid: 1-D over columns, folded into y past 65535 groups: column = gid.x + gid.y * (num_workgroups.x * {{WG}}).

//!include common.wgsl

struct Params { first_row: u32, n_rows: u32, cols: u32, x_off: u32, scale: f32, _p0: u32, _p1: u32, _p2: u32 };

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> dE: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> dx: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(WG)
fn embed_back(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c = gid.x + gid.y * (nwg.x * WG);
    if (c >= p.cols) { return; }
    for (var i = 0u; i < step.n_tokens; i++) {
        let id = ids[i];
        if (id < p.first_row || id - p.first_row >= p.n_rows) { continue; }
        let o = (id - p.first_row) * p.cols + c;
        dE[o] = dE[o] + p.scale * dx[p.x_off + i * p.cols + c];
    }
}
