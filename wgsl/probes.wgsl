// Probe kernels for the lab's panels (lab/instruments/probes.py). They copy or reduce what the forward pass has just computed
// into small buffers the page reads; none of them writes anything the model reads.
// Four entries; each uses its own bindings (auto layouts), sharing binding numbers on purpose as in elementwise.wgsl.
//
// struct Step   { pos, n_tokens, n_ctx, _pad }    the engine's per-step uniform: first position of the step, t
// struct Window { w0, wn, l0, ln }                one inspection: window positions [w0, w0 + wn) (attention queries
//                                                  and keys, residual norms), lens positions [l0, l0 + ln), ending
//                                                  where the window ends (a CONVERSATION uniform: it holds positions)
// struct Params { a, b, c, d: u32 }                fixed at plan time; meaning per entry below
//
// attn_gather  0 src (read, f32 [t, n_head, n_ctx]: the attention kernel's probe, P(token j, head h, key k))
//              1 dst (read_write, f32 [n_layer, n_head, wn, wn + 1])   2 step   3 win   4 p {n_head, n_ctx, layer, cols}
//   for the step's tokens at query positions q = pos + j inside the window, qi = q - w0:
//   dst[layer, h, qi, 0]     = sum_{k < w0} P(j, h, k)                 (attention on keys before the window)
//   dst[layer, h, qi, 1 + c] = P(j, h, w0 + c)  (0 when w0 + c > q)    c < wn
//   Grid: groups_1d(t * n_head * cols, WG), cols = the largest window + 1; threads with c > wn return.
// lens_copy    0 src (read, f32 [t, E]: the residual after a layer)   1 dst (read_write, f32 [n_layer, rows, E])
//              2 step   3 win   4 p {E, layer, rows, _}
//   dst[layer, q - l0, :] = src[j, :]  for q = pos + j in [l0, l0 + ln).   Grid: groups_1d(t * E, WG).
// row_norm     0 src (read, f32 [t, E])   1 dst (read_write, f32 [slots, wn])   2 step   3 win   4 p {E, slot, _, _}
//   dst[slot, q - w0] = sqrt(sum_c src[j, c]^2)  for q = pos + j in [w0, w0 + wn) (a thread per row).
//   Grid: groups_1d(t, WG).
// cosine       0 sims (read_write, f32 [V]: dot products r . q in, cosines out)   1 norms (read, f32 [V])
//              2 ids (read, u32; ids[0] = the query token)   3 p {V, neg_inf, _, _}
//   sims[r] = sims[r] / max(norms[r] * norms[ids[0]], 1e-30);  sims[ids[0]] = -inf, so top_k leaves the token out
//   (-inf arrives as the bits 0xff800000 in the uniform: WGSL refuses an infinite constant).
//   Grid: groups_1d(V, WG).
// Constant: WG (threads per workgroup). Flat index = (wid.x + wid.y * num_workgroups.x) * WG + lid.

//!include common.wgsl

struct Window { w0: u32, wn: u32, l0: u32, ln: u32 };
struct Params { a: u32, b: u32, c: u32, d: u32 };

const WG: u32 = {{WG}}u;

// attn_gather, lens_copy, row_norm
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> step: Step;
@group(0) @binding(3) var<uniform> win: Window;
@group(0) @binding(4) var<uniform> p: Params;
// cosine
@group(0) @binding(0) var<storage, read_write> sims: array<f32>;
@group(0) @binding(1) var<storage, read> norms: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<uniform> pc: Params;

fn flat(lid: u32, wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn attn_gather(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let n_head = p.a;
    let n_ctx = p.b;
    let cols = p.d;
    let e = flat(lid, wid, nwg);
    let c = e % cols;
    let h = (e / cols) % n_head;
    let j = e / (cols * n_head);
    if (j >= step.n_tokens || c > win.wn) { return; }
    let q = step.pos + j;
    if (q < win.w0 || q >= win.w0 + win.wn) { return; }
    let row = (j * n_head + h) * n_ctx;
    var v = 0.0;
    if (c == 0u) {
        for (var k = 0u; k < win.w0; k++) { v += src[row + k]; }
    } else {
        let k = win.w0 + c - 1u;
        if (k <= q) { v = src[row + k]; }
    }
    dst[((p.c * n_head + h) * win.wn + (q - win.w0)) * (win.wn + 1u) + c] = v;
}

@compute @workgroup_size(WG)
fn lens_copy(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let E = p.a;
    let e = flat(lid, wid, nwg);
    let j = e / E;
    if (j >= step.n_tokens) { return; }
    let q = step.pos + j;
    if (q < win.l0 || q >= win.l0 + win.ln) { return; }
    dst[(p.b * p.c + q - win.l0) * E + e % E] = src[e];
}

@compute @workgroup_size(WG)
fn row_norm(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let E = p.a;
    let j = flat(lid, wid, nwg);
    if (j >= step.n_tokens) { return; }
    let q = step.pos + j;
    if (q < win.w0 || q >= win.w0 + win.wn) { return; }
    var acc = 0.0;
    for (var c = 0u; c < E; c++) {
        let v = src[j * E + c];
        acc += v * v;
    }
    dst[p.b * win.wn + q - win.w0] = sqrt(acc);
}

@compute @workgroup_size(WG)
fn cosine(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat(lid, wid, nwg);
    if (r >= pc.a) { return; }
    let q = ids[0];
    if (r == q) {
        sims[r] = bitcast<f32>(pc.b);
    } else {
        sims[r] = sims[r] / max(norms[r] * norms[q], 1e-30);
    }
}
