// The depthwise causal conv over a state ring, in two modes (MODE, fixed at pipeline creation):
//   gated (LFM2's short-conv block between its projections, llama.cpp src/models/lfm2.cpp build_shortconv_block):
//         y = C * conv(B * x) from in_proj rows [B | C | x];
//   silu  (Qwen3.5's delta-net layer, src/models/qwen35.cpp build_layer_attn_linear): y = silu(conv(x)) over the first
//         n floats of each row (the [q | k | v] channels of the fused in-projection row), no B or C.
// Both with ggml_ssm_conv: output j = sum_i w[c, i] * seq[j + i] over seq = [the state's l_cache - 1 rows; this
// step's input rows], the last tap on the token itself, summed in tap order as ggml's CPU loop sums; the conv state
// is written in the same pass.
// Bindings: 0 src (storage, read)        [t, stride] rows: gated [B | C | x], n floats each; silu x then other floats
//           1 w (storage, read)          [n, LC] the conv kernel (GGUF shortconv.conv.weight / ssm_conv1d.weight)
//           2 state (storage, read_write) [RING, n] the conv input u of position q in row q % RING (a ring: see below)
//           3 y (storage, read_write)    [t, n] the output: out_proj's input (gated), the recurrence's (silu)
//           4 p (uniform Params)         5 step (uniform Step)
// Math: for token j at position q = pos + j: u_q = B[j] * x[j] (gated) or x[j] (silu);
//       conv_q = sum_{i < LC} w[c, i] * u_{q - (LC-1) + i}; y[j] = C[j] * conv_q (gated) or silu(conv_q) (silu).
//       u of a position before 0 is 0 (a new conversation starts from a zero state).
// The state is a ring of RING >= LC - 1 rows: a step reads the LC - 1 rows before `pos` and writes the rows of its
// last min(t, RING) positions. RING - (LC - 1) extra rows let the engine step again from up to that many positions
// back (lab/engine/scratch.py: the greedy steps run ahead past a turn's end) without a copy of the state.
// Params { n, stride, _p0, _p1: u32 }   n: channels; stride: floats per src row (gated 3 n; silu >= n).
// Constants: WG threads a workgroup, LC taps (l_cache), RING state rows, MODE 0u gated or 1u silu (a constant, so
//       each pipeline keeps only its own branch).
// Grid: (ceil(n / WG), 1, 1): one thread a channel walks the step's tokens in order (the window in registers, the
//       state read before any write: no other thread touches the channel, so no barrier), for prefill and decode alike.

//!include common.wgsl
//!include act.wgsl

struct Params { n: u32, stride: u32, _p0: u32, _p1: u32 };

const WG: u32 = {{WG}}u;
const LC: u32 = {{LC}}u;
const RING: u32 = {{RING}}u;
const MODE: u32 = {{MODE}}u;
const GATED: u32 = 0u;

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.n) { return; }
    let pos = step.pos;
    let t = step.n_tokens;
    // win[i]: u of position q - (LC - 1) + i for the token q being computed; first the state's rows before pos
    var win: array<f32, LC>;
    for (var i = 0u; i + 1u < LC; i++) {
        let back = LC - 1u - i;
        win[i] = 0.0;
        if (pos >= back) { win[i] = state[((pos - back) % RING) * p.n + c]; }
    }
    var taps: array<f32, LC>;
    for (var i = 0u; i < LC; i++) { taps[i] = w[c * LC + i]; }
    for (var j = 0u; j < t; j++) {
        let row = j * p.stride;
        var u = src[row + c];
        if (MODE == GATED) { u *= src[row + 2u * p.n + c]; }
        win[LC - 1u] = u;
        var acc = 0.0;
        for (var i = 0u; i < LC; i++) { acc += taps[i] * win[i]; }
        if (MODE == GATED) { y[j * p.n + c] = src[row + p.n + c] * acc; } else { y[j * p.n + c] = silu(acc); }
        for (var i = 0u; i + 1u < LC; i++) { win[i] = win[i + 1u]; }
        if (j + RING >= t) { state[((pos + j) % RING) * p.n + c] = u; }
    }
}
