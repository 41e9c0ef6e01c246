// Negative log-likelihood of each scored row's next token, from a step's rows of logits (lab/instruments/perplexity.py).
// Reading back only these floats, not the rows, is the point: a 128-token window of Gemma 3 has 64 x 262,144
// logits (64 MB); its scores are 256 bytes.
// Bindings: 0 logits (read, f32 [t, V]: row j is the head's output for the step's token j)
//           1 targets (read, u32 [n_ctx]: the window's token ids; the target of position q is targets[q + 1])
//           2 nll (read_write, f32 [n_ctx]: by position; positions outside [first, last) are left as they are)
//           3 step (uniform Step)   4 p (uniform Params)
// Math: for token j of the step at position q = step.pos + j, when first <= q < last:
//   nll[q] = m + log(sum_v exp(x_v - m)) - x[targets[q + 1]],   m = max_v x_v,   x = logits row j
//   (llama.cpp's log_softmax, negated: max-subtracted, so any finite logits are safe)
// Params { n_vocab, first, last, _ }: last = the window's n_ctx - 1 (its final position has no target), first =
//   n_ctx / 2 (llama-perplexity scores the second half only, so every scored token has context behind it).
//   A CONVERSATION uniform: rewritten per run.
// Grid: (t, 1, 1), one workgroup of {{WG}} per row; workgroups of rows outside [first, last) return at once.
// Reduction: wg_max and wg_sum of reduce.wgsl (subgroups, or shared-memory trees without them).
{{SG_ENABLE}}

struct Params { n_vocab: u32, first: u32, last: u32, _p: u32 };

//!include common.wgsl
//!include reduce.wgsl

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<u32>;
@group(0) @binding(2) var<storage, read_write> nll: array<f32>;
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn nll_rows(@builtin(local_invocation_index) li: u32,
{{SG}}            @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
            @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let j = wid.x;
    let q = step.pos + j;
    if (j >= step.n_tokens || q < p.first || q >= p.last) { return; }
    let row = j * p.n_vocab;
    var lm = -3.4028234663852886e38;
    for (var i = li; i < p.n_vocab; i += WG) { lm = max(lm, logits[row + i]); }
    let m = wg_max(lm, li);
    var ls = 0.0;
    for (var i = li; i < p.n_vocab; i += WG) { ls += exp(logits[row + i] - m); }
    let s = wg_sum(ls, li);
    if (li == 0u) { nll[q] = m + log(s) - logits[row + targets[q + 1u]]; }
}
