// Recurrent-state magnitudes for the memory card: the Frobenius norm of every value head's d_k x d_v state matrix of
// one delta-net layer (qwen35), so the card records a layer's memory over the conversation by reading n_delta x H
// floats per update instead of the whole state.
// Bindings: 0 state (storage, read)       f32 [H, d_k, d_v]  one layer's recurrent state, state[(h d_k + r) d_v + c]
//           1 out   (storage, read_write) f32 [n_delta, H]   out[slot * H + h]
//           2 p     (uniform Params)      slot, H, n = d_k * d_v (fixed per layer at build)
// Math: out[slot, h] = sqrt(sum_i state[h n + i]^2), summed in f32 (each invocation strides over the head's n floats,
//       then wg_sum of reduce.wgsl).
// Organisation: one workgroup of {{WG}} per head; a head is 16,384 floats at d_k = d_v = 128, too many for one thread
//   (kvview.wgsl's one-thread-a-row suits its rows of a few hundred).
// Grid: (H, 1, 1) per layer; one dispatch per layer in one pass (a layer's state is one binding; every layer at once
//   would pass the storage-binding limit).
{{SG_ENABLE}}

struct Params { slot: u32, H: u32, n: u32, _p: u32 };

//!include reduce.wgsl

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read> state: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) li: u32,
{{SG}}        @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
        @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let h = wid.x;
    let base = h * p.n;
    var acc = 0.0;
    for (var i = li; i < p.n; i += WG) {
        let v = state[base + i];
        acc += v * v;
    }
    let total = wg_sum(acc, li);
    if (li == 0u) { out[p.slot * p.H + h] = sqrt(total); }
}
