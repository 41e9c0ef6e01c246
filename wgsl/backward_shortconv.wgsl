// The short conv's backward, both of shortconv.wgsl's modes: LFM2's gated one (llama.cpp src/models/lfm2.cpp
// build_shortconv_block), gradients of y = C * conv(B * x) over a training window's t tokens, given dy, through the
// in_proj rows [B | C | x] the forward read, and of the conv kernel w; and Qwen3.5's silu one (src/models/qwen35.cpp
// build_layer_attn_linear), y = silu(conv(x)) over the first n floats of rows of `stride` (the delta-net's
// in-projection row, its q k v), the gradient written into those floats of a row of the same stride.
// The window starts at position 0 from a zero conv state (training's windows always do: lab.instruments.training
// writes pos 0), so u before the window's first token is 0 and no state is read or written here.
// Four entries, each with its own layout at bindings 0..k-1 (binding 4 is w in three, dw in shortconv_dw, on purpose:
// WGSL only forbids two variables at one binding within the SAME entry point):
//   shortconv_dx: 0 bcx (read: [t, 3n] the forward's in_proj rows)  1 dy (read: [t, n] the gradient at y)
//                 2 p (uniform Params)  3 step (uniform Step)  4 w (read: [n, LC] the conv kernel)
//                 5 dbcx (read_write: [t, 3n], written: [dB | dC | dx] in bcx's layout)
//   shortconv_dw: 0 bcx  1 dy  2 p  3 step as above  4 dw (read_write: [n, LC], added into)
//   silu_dx:      0 bcx (read: [t, stride] rows, x the first n)  1 dy  2 p  3 step  4 w
//                 5 dbcx (read_write: [t, stride], the first n of each row written)
//   silu_dw:      0 bcx  1 dy  2 p  3 step  4 w  5 dw_silu (read_write: [n, LC], added into)
// Math (lab/host/reference/grads_shortconv.py shortconv_grad is the float64 oracle), channel c, token j, taps i < LC:
//   u_j = B_j x_j (0 for j < 0);  conv_j = sum_i w[c, i] u_{j - (LC-1) + i};  y_j = C_j conv_j
//   dconv_j = dy_j C_j                   dC_j = dy_j conv_j     (conv_j recomputed, in the forward's tap order)
//   du_j = sum_i w[c, i] dconv_{j + (LC-1) - i}    (token j is tap i of output j + LC-1 - i; outputs past t: none)
//   dB_j = du_j x_j    dx_j = du_j B_j
//   dw[c, i] += sum_j dconv_j u_{j - (LC-1) + i}   (added: training sums a weight's gradient over its windows)
// The silu mode (lab/host/reference/grads_deltanet.py conv_silu_grad): u_j = x_j, a_j = conv_j, y_j = silu(a_j):
//   da_j = dy_j silu'(a_j)   (a_k recomputed in the forward's tap order for each output k the token feeds)
//   dx_j = sum_i w[c, i] da_{j + (LC-1) - i};   dw[c, i] += sum_j da_j x_{j - (LC-1) + i}
// Params { n, stride, _p0, _p1: u32 }   n: channels (n_embd; the delta-net's 2K + V); stride: floats a row of the
//   silu mode's input and its gradient (the gated mode's rows are 3n). Constants: WG threads a workgroup, LC taps.
// Grid: shortconv_dx and silu_dx (ceil(n / WG), t, 1), one invocation a (channel, token), each reading the LC tokens
//   around its own (silu_dx recomputes the LC outputs' pre-activations it feeds: LC^2 products); shortconv_dw and
//   silu_dw (ceil(n / WG), 1, 1), one invocation a channel walking the tokens in order with the last LC inputs in
//   registers, its LC sums in token order (no float atomics in WGSL: the same bits every run). Rows >= t are
//   neither read nor written. On lavapipe an invocation's loops stop silently past 32,768 iterations
//   (tests/kernels/test_loop_budget.py): the dw walks' 2 LC t + LC (gated) and 3 LC t + LC (silu) iterations stay
//   under that there (lab/ops/backward_shortconv.py refuses a longer window on such an adapter).
// Not measured on a GPU yet: the dw pass has only n invocations (2,048 for LFM2-1.2B), each walking t tokens; beside
//   the projections' GEMMs of t x 3n x n it should be small (partial sums over token chunks would be the upgrade).

//!include common.wgsl
//!include act.wgsl

struct Params { n: u32, stride: u32, _p0: u32, _p1: u32 };

const WG: u32 = {{WG}}u;
const LC: u32 = {{LC}}u;

@group(0) @binding(0) var<storage, read> bcx: array<f32>;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<storage, read> w: array<f32>;
@group(0) @binding(5) var<storage, read_write> dbcx: array<f32>;
@group(0) @binding(4) var<storage, read_write> dw: array<f32>;
@group(0) @binding(5) var<storage, read_write> dw_silu: array<f32>;

@compute @workgroup_size(WG)
fn shortconv_dx(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let j = gid.y;
    let t = step.n_tokens;
    if (c >= p.n || j >= t) { return; }
    let n = p.n;
    let width = 3u * n;
    // conv_j, summed in the forward's tap order (a tap before the window adds 0 there: the same value)
    var conv = 0.0;
    for (var i = 0u; i < LC; i++) {
        if (j + i >= LC - 1u) {
            let k = (j + i - (LC - 1u)) * width;
            conv += w[c * LC + i] * (bcx[k + c] * bcx[k + 2u * n + c]);
        }
    }
    // du_j: token j feeds output k = j + LC - 1 - i through tap i
    var du = 0.0;
    for (var i = 0u; i < LC; i++) {
        let k = j + (LC - 1u) - i;
        if (k < t) { du += w[c * LC + i] * (dy[k * n + c] * bcx[k * width + n + c]); }
    }
    let row = j * width;
    dbcx[row + c] = du * bcx[row + 2u * n + c];
    dbcx[row + n + c] = dy[j * n + c] * conv;
    dbcx[row + 2u * n + c] = du * bcx[row + c];
}

@compute @workgroup_size(WG)
fn shortconv_dw(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.n) { return; }
    let n = p.n;
    let width = 3u * n;
    let t = step.n_tokens;
    var win = array<f32, LC>();     // u of tokens j - (LC - 1) .. j (0 before the window)
    var acc = array<f32, LC>();     // each tap's sum over the tokens so far
    for (var j = 0u; j < t; j++) {
        for (var i = 0u; i + 1u < LC; i++) { win[i] = win[i + 1u]; }
        let row = j * width;
        win[LC - 1u] = bcx[row + c] * bcx[row + 2u * n + c];
        let d = dy[j * n + c] * bcx[row + n + c];
        for (var i = 0u; i < LC; i++) { acc[i] += d * win[i]; }
    }
    for (var i = 0u; i < LC; i++) { dw[c * LC + i] += acc[i]; }
}

// The pre-activation a_k = conv_k of channel c at output k, in the forward's tap order (taps before the window: 0).
fn silu_pre(c: u32, k: u32) -> f32 {
    var a = 0.0;
    for (var i = 0u; i < LC; i++) {
        if (k + i >= LC - 1u) { a += w[c * LC + i] * bcx[(k + i - (LC - 1u)) * p.stride + c]; }
    }
    return a;
}

@compute @workgroup_size(WG)
fn silu_dx(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let j = gid.y;
    let t = step.n_tokens;
    if (c >= p.n || j >= t) { return; }
    // token j feeds output k = j + LC - 1 - i through tap i
    var dx = 0.0;
    for (var i = 0u; i < LC; i++) {
        let k = j + (LC - 1u) - i;
        if (k < t) { dx += w[c * LC + i] * (dy[k * p.n + c] * silu_grad(silu_pre(c, k))); }
    }
    dbcx[j * p.stride + c] = dx;
}

@compute @workgroup_size(WG)
fn silu_dw(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.n) { return; }
    var win = array<f32, LC>();     // x of tokens j - (LC - 1) .. j (0 before the window)
    var acc = array<f32, LC>();
    for (var j = 0u; j < step.n_tokens; j++) {
        for (var i = 0u; i + 1u < LC; i++) { win[i] = win[i + 1u]; }
        win[LC - 1u] = bcx[j * p.stride + c];
        var a = 0.0;
        for (var i = 0u; i < LC; i++) { a += w[c * LC + i] * win[i]; }
        let d = dy[j * p.n + c] * silu_grad(a);
        for (var i = 0u; i < LC; i++) { acc[i] += d * win[i]; }
    }
    for (var i = 0u; i < LC; i++) { dw_silu[c * LC + i] += acc[i]; }
}
