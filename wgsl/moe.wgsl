// A routed layer's kernels of its own (lab/ops/moe.py): `route`, `combine`, and the experiments' `mute`; the experts'
// products are matvec.wgsl's EXPERT variant.
//
// Entry `route`: the router's gating and choice, one invocation a token (n_expert values walked in order: small).
// Bindings: 0 logits (read: [t, n_expert] router logits)  1 bias (read: [n_expert] selection bias; any buffer when
//           p.bias is 0)  2 ids (read_write: array<u32> [t, k] chosen experts)  3 w (read_write: [t, k] their
//           weights)  4 p (uniform Route)  5 step (uniform Step)
// Math, as llama.cpp's build_moe_ffn (src/llama-graph.cpp):
//   prob_e = softmax(logits)_e = exp(l_e - max l) * (1 / sum_j exp(l_j - max l))   (p.gating 0)
//          | sigmoid(l_e) = 1 / (1 + exp(-l_e))                                   (p.gating 1)
//   sel_e  = prob_e + (p.bias ? bias[e] : 0)      the bias chooses; it never weighs
//   ids    = the k experts of largest sel, in descending order of sel; equal values: the lower expert first
//   w_s    = prob_{ids_s} / (p.norm ? sum_s prob_{ids_s} : 1)
//   Ties: ggml's CPU top_k (std::partial_sort over the indices in order, comparing values by >) keeps the earlier of
//   two equal values, so the lower expert index wins a tie at the k-th place; the order within the k does not enter
//   the sum but through float rounding (ggml swaps its first two on purpose). Pick s is the largest sel strictly after
//   pick s - 1 in the order (sel descending, index ascending): no list of the chosen is kept. A NaN sel is never
//   picked; where every value is NaN the last expert is taken with a NaN weight, so the NaN reaches the output.
// Route { n_expert, k, gating (0 softmax, 1 sigmoid), bias (0/1), norm (0/1), _p0, _p1, _p2: u32 }
// Grid: (ceil(t / {{WG}}), 1, 1).
//
// Entry `combine`: the weighted sum of the chosen experts' outputs, added to y.
// Bindings: 0 down (read: [t * k, n] the experts' outputs, pair-major)  1 w (read: [t, k])  2 y (read_write)
//           3 c (uniform Combine)  4 step (uniform Step)
// Math: y[t * n + c] = (c.acc ? y[t * n + c] : 0) + sum_{s < k} w[t k + s] * down[(t k + s) n + c], the sum in slot
//   order from slot 0 (llama.cpp adds the weighted experts' views one by one, then the sum to the residual).
// Combine { n, k, acc, _p0: u32 }
// Grid: (ceil(n / {{WG}}), t, 1).
//
// Entry `mute`: one expert left out of the weighted sum, or its share scaled (the experiments' "expert" site,
//   lab/instruments/interventions.py), run right after `route` in a copy of a step's ops: the weight of every (token,
//   slot) pair of the step that chose expert m.expert at a position in [m.r0, m.r1) is zeroed (m.op 0) or scaled by
//   m.scale (m.op 3); the other pairs' weights stay as `route` left them, so `combine` then adds the other experts
//   with their own weights, not renormalised.
// Bindings: 0 idm (read: array<u32> [t, k] the chosen experts)  1 wm (read_write: [t, k] their weights)
//           2 step (uniform Step)  3 m (uniform Mute)
// Math, pair q = j k + s, row j at position step.pos + j:
//   wm[q] = (m.op == 0 ? 0 : wm[q] * m.scale)   where idm[q] == m.expert and m.r0 <= step.pos + j < m.r1
// Mute { k, expert, _c1, r0, r1, op, _vec: u32, scale: f32 }: lab/ops/intervene.py's Params, one intervention slot's
//   uniform, read with stride = k and c0 = the expert.
// Grid: (ceil(t k / {{WG}}), 1, 1).

//!include common.wgsl

const WG: u32 = {{WG}}u;

struct Route { n_expert: u32, k: u32, gating: u32, bias: u32, norm: u32, _p0: u32, _p1: u32, _p2: u32 };
struct Combine { n: u32, k: u32, acc: u32, _p0: u32 };
struct Mute { k: u32, expert: u32, _c1: u32, r0: u32, r1: u32, op: u32, _vec: u32, scale: f32 };

{{ROUTE}}@group(0) @binding(0) var<storage, read> logits: array<f32>;
{{ROUTE}}@group(0) @binding(1) var<storage, read> bias: array<f32>;
{{ROUTE}}@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
{{ROUTE}}@group(0) @binding(3) var<storage, read_write> w: array<f32>;
{{ROUTE}}@group(0) @binding(4) var<uniform> p: Route;
{{COMBINE}}@group(0) @binding(0) var<storage, read> down: array<f32>;
{{COMBINE}}@group(0) @binding(1) var<storage, read> wc: array<f32>;
{{COMBINE}}@group(0) @binding(2) var<storage, read_write> y: array<f32>;
{{COMBINE}}@group(0) @binding(3) var<uniform> c: Combine;
{{MUTE}}@group(0) @binding(0) var<storage, read> idm: array<u32>;
{{MUTE}}@group(0) @binding(1) var<storage, read_write> wm: array<f32>;
{{MUTE}}@group(0) @binding(3) var<uniform> m: Mute;
@group(0) @binding({{B_STEP}}) var<uniform> step: Step;

{{ROUTE}}// Expert e's probability of token row `base` (mx, inv: the softmax's max and 1 / sum).
{{ROUTE}}fn prob(base: u32, e: u32, mx: f32, inv: f32) -> f32 {
{{ROUTE}}    let l = logits[base + e];
{{ROUTE}}    if (p.gating == 1u) { return 1.0 / (1.0 + exp(-l)); }
{{ROUTE}}    return exp(l - mx) * inv;
{{ROUTE}}}
{{ROUTE}}
{{ROUTE}}fn sel(base: u32, e: u32, mx: f32, inv: f32) -> f32 {
{{ROUTE}}    var v = prob(base, e, mx, inv);
{{ROUTE}}    if (p.bias != 0u) { v += bias[e]; }
{{ROUTE}}    return v;
{{ROUTE}}}
{{ROUTE}}
{{ROUTE}}@compute @workgroup_size(WG)
{{ROUTE}}fn route(@builtin(global_invocation_id) gid: vec3<u32>) {
{{ROUTE}}    let t = gid.x;
{{ROUTE}}    if (t >= step.n_tokens) { return; }
{{ROUTE}}    let n = p.n_expert;
{{ROUTE}}    let base = t * n;
{{ROUTE}}    var mx = logits[base];
{{ROUTE}}    for (var e = 1u; e < n; e++) { mx = max(mx, logits[base + e]); }
{{ROUTE}}    var sum = 0.0;
{{ROUTE}}    for (var e = 0u; e < n; e++) { sum += exp(logits[base + e] - mx); }
{{ROUTE}}    let inv = 1.0 / sum;
{{ROUTE}}    var prev_v = 0.0;
{{ROUTE}}    var prev_i = 0u;
{{ROUTE}}    var total = 0.0;
{{ROUTE}}    for (var s = 0u; s < p.k; s++) {
{{ROUTE}}        var best = n;
{{ROUTE}}        var best_v = 0.0;
{{ROUTE}}        for (var e = 0u; e < n; e++) {
{{ROUTE}}            let v = sel(base, e, mx, inv);
{{ROUTE}}            let after = s == 0u || v < prev_v || (v == prev_v && e > prev_i);
{{ROUTE}}            if (after && v == v && (best == n || v > best_v)) { best = e; best_v = v; }
{{ROUTE}}        }
{{ROUTE}}        if (best == n) { best = n - 1u; best_v = sel(base, best, mx, inv); }
{{ROUTE}}        let pr = prob(base, best, mx, inv);
{{ROUTE}}        ids[t * p.k + s] = best;
{{ROUTE}}        w[t * p.k + s] = pr;
{{ROUTE}}        total += pr;
{{ROUTE}}        prev_v = best_v;
{{ROUTE}}        prev_i = best;
{{ROUTE}}    }
{{ROUTE}}    if (p.norm != 0u) {
{{ROUTE}}        for (var s = 0u; s < p.k; s++) { w[t * p.k + s] = w[t * p.k + s] / total; }
{{ROUTE}}    }
{{ROUTE}}}

{{COMBINE}}@compute @workgroup_size(WG)
{{COMBINE}}fn combine(@builtin(global_invocation_id) gid: vec3<u32>) {
{{COMBINE}}    let i = gid.x;
{{COMBINE}}    let t = gid.y;
{{COMBINE}}    if (i >= c.n || t >= step.n_tokens) { return; }
{{COMBINE}}    var acc = 0.0;
{{COMBINE}}    for (var s = 0u; s < c.k; s++) {
{{COMBINE}}        let q = t * c.k + s;
{{COMBINE}}        acc += wc[q] * down[q * c.n + i];
{{COMBINE}}    }
{{COMBINE}}    let o = t * c.n + i;
{{COMBINE}}    if (c.acc != 0u) { acc = y[o] + acc; }
{{COMBINE}}    y[o] = acc;
{{COMBINE}}}

{{MUTE}}@compute @workgroup_size(WG)
{{MUTE}}fn mute(@builtin(global_invocation_id) gid: vec3<u32>) {
{{MUTE}}    let q = gid.x;
{{MUTE}}    if (q >= step.n_tokens * m.k) { return; }
{{MUTE}}    let pos = step.pos + q / m.k;
{{MUTE}}    if (idm[q] != m.expert || pos < m.r0 || pos >= m.r1) { return; }
{{MUTE}}    if (m.op == 0u) { wm[q] = 0.0; } else { wm[q] = wm[q] * m.scale; }
{{MUTE}}}
