// Workgroup reductions of one f32 per invocation (included by norm, softmax, sample; no entry points).
// Bindings: none. Workgroup memory: `red`, one f32 slot per invocation (WG, the including kernel's workgroup
//   size, a constant Python fills in), also free for the includer's own reductions between calls (sample.wgsl).
// Math: wg_sum(v) = sum of v over the workgroup, wg_max(v) = max of v, both returned to every invocation.
//   Call them in uniform control flow. Each ends with a barrier, so `red` can be reused at once.
// Reduction: with subgroups ({{SG}} lines) subgroupAdd / subgroupMax, then one partial per subgroup in `red`
//   (subgroups assumed to be consecutive ranges of local_invocation_index); without ({{NOSG}} lines) a
//   shared-memory tree over all WG slots (WG a power of two).
// Requires of the includer: `const WG: u32`; on the subgroup path every entry sets sg_lane and sg_size from
//   its subgroup_invocation_id and subgroup_size builtins before the first call.
// Constants: SG / NOSG from lab.gpu.shaders.subgroup_consts; its SG_ENABLE goes on the including file's first line
//   (an enable directive must come before every declaration).

var<workgroup> red: array<f32, WG>;
var<private> sg_lane: u32;
var<private> sg_size: u32;

fn wg_sum(v: f32, li: u32) -> f32 {
{{SG}}    let s = subgroupAdd(v);
{{SG}}    if (sg_lane == 0u) { red[li / sg_size] = s; }
{{SG}}    workgroupBarrier();
{{SG}}    var total = 0.0;
{{SG}}    for (var j = 0u; j < (WG + sg_size - 1u) / sg_size; j++) { total += red[j]; }
{{NOSG}}    red[li] = v;
{{NOSG}}    workgroupBarrier();
{{NOSG}}    for (var s = WG / 2u; s > 0u; s >>= 1u) {
{{NOSG}}        if (li < s) { red[li] += red[li + s]; }
{{NOSG}}        workgroupBarrier();
{{NOSG}}    }
{{NOSG}}    let total = red[0];
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, li: u32) -> f32 {
{{SG}}    let s = subgroupMax(v);
{{SG}}    if (sg_lane == 0u) { red[li / sg_size] = s; }
{{SG}}    workgroupBarrier();
{{SG}}    var m = red[0];
{{SG}}    for (var j = 1u; j < (WG + sg_size - 1u) / sg_size; j++) { m = max(m, red[j]); }
{{NOSG}}    red[li] = v;
{{NOSG}}    workgroupBarrier();
{{NOSG}}    for (var s = WG / 2u; s > 0u; s >>= 1u) {
{{NOSG}}        if (li < s) { red[li] = max(red[li], red[li + s]); }
{{NOSG}}        workgroupBarrier();
{{NOSG}}    }
{{NOSG}}    let m = red[0];
    workgroupBarrier();
    return m;
}
