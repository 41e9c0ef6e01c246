// RMSNorm over groups of each token's row: whole rows (group = n) or per head (Gemma 3 q/k norm: group = head_dim).
// Bindings: 0 y (storage, read_write)  1 w (storage, read: `group` floats)  2 p (uniform Params)
//           3 step (uniform Step)      4 x (storage, read; out-of-place only: {{SRC}} = x, in place {{SRC}} = y)
// Math: y[g] = x[g] * inverseSqrt(mean(x[g]^2) + eps) * w     for each group g of `group` floats
//       (Gemma's "1 + w" is already in the GGUF weights, so w is used as stored.)
// Params { group, n_groups, in_stride, in_offset, out_stride, out_offset: u32, eps: f32, split: u32 }
//   element i of group g of token row j is read at  j*in_stride  + in_offset  + g*group + i
//                                   and written at  j*out_stride + out_offset + g*group + i   (floats)
// Grid: (t, n_groups, 1), one workgroup of {{WG}} per (token, group); rows >= step.n_tokens do nothing.
// Reduction: wg_sum of reduce.wgsl (subgroups, or a shared-memory tree without them).
// Second weight ({{W2}} lines, binding {{B_W2}}): groups from p.split on use w2 (Gemma 3's q and k norms over the
//   adjacent Q and K heads of a fused QKV row: one dispatch instead of two).
// Residual ({{RES}} lines, binding {{B_RES}}): res[j*n + g*group + i] += the normed value as well (Gemma 3's norm
//   after a branch, then the add into the residual stream: one dispatch instead of two).
{{SG_ENABLE}}

struct Params { group: u32, n_groups: u32, in_stride: u32, in_offset: u32,
                out_stride: u32, out_offset: u32, eps: f32, split: u32 };

//!include common.wgsl
//!include reduce.wgsl

const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<storage, read> x: array<f32>;
{{RES}}@group(0) @binding({{B_RES}}) var<storage, read_write> res: array<f32>;
{{W2}}@group(0) @binding({{B_W2}}) var<storage, read> w2: array<f32>;

@compute @workgroup_size(WG)
fn rms_norm(@builtin(local_invocation_index) li: u32,
{{SG}}            @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
            @builtin(workgroup_id) wid: vec3<u32>) {
{{SG}}    sg_lane = sgi; sg_size = sgs;
    let row = wid.x;
    if (row >= step.n_tokens) { return; }
    let src = row * p.in_stride + p.in_offset + wid.y * p.group;
    let dst = row * p.out_stride + p.out_offset + wid.y * p.group;
    var ss = 0.0;
    for (var i = li; i < p.group; i += WG) {
        let v = {{SRC}}[src + i];
        ss += v * v;
    }
    let ms = wg_sum(ss, li) / f32(p.group);
    let r = inverseSqrt(ms + p.eps);
    for (var i = li; i < p.group; i += WG) {
        var wi = w[i];
{{W2}}        if (wid.y >= p.split) { wi = w2[i]; }
        let v = {{SRC}}[src + i] * r * wi;
        y[dst + i] = v;
{{RES}}        let o = row * p.n_groups * p.group + wid.y * p.group + i;
{{RES}}        res[o] += v;
    }
}
