// The optimizer's step over flat f32 buffers of n floats (lab/ops/optimizer.py; issue #43, training in the tab): the
// gradient norm and its clip scale, AdamW (PyTorch's torch.optim.AdamW), plain SGD. Four entries, each with its own
// layout from binding 0 up (variables of different entries share binding numbers on purpose, as elementwise.wgsl's:
// WGSL forbids two variables at one binding only within the SAME entry point):
//   norm_partials: 0 g (read: gradients)  1 part (read_write: scratch)  2 p (uniform Norm)
//   norm_finish:   0 part_in (read: scratch)  1 st_rw (read_write State)  2 f (uniform Finish)
//   adamw:         0 w (read_write: parameters)  1 grad (read)  2 m (read_write)  3 v (read_write)  4 st (read State)
//                  5 a (uniform Adam)
//   sgd:           0 w (read_write)  1 grad (read)  2 st (read State)  3 s (uniform Sgd)
//
// State { lr, t, sumsq, clip } (storage, 16 bytes): lr and t (the 1-based step number, as f32) written by the host
//   before each step (lab.ops.optimizer.state_bytes, which also sets sumsq = 0 and clip = 1), sumsq and clip by
//   norm_finish. A step's plan is fixed; only this buffer changes between steps.
//
// norm_partials: part[p.part_base + k] = sum of g[i]^2 over the k-th slice of SLICE = WG * PER gradients. Invocation
//   li sums i = k * SLICE + j * WG + li, j = 0 .. PER-1, in that order, then the workgroup adds the WG sums as a tree
//   in workgroup memory (WG a power of two). Grid: ceil(n / SLICE) workgroups, folded into y past 65535: slice k =
//   wid.x + wid.y * num_workgroups.x (the fold's spare workgroups write nothing). A buffer past the storage binding
//   limit is bound in chunks of whole slices, one dispatch each, each writing its slices from p.part_base on.
// norm_finish: one workgroup. Invocation li sums part[li], part[li + WG], ... in order, then the tree as above:
//   st.sumsq = the sum of every square, in an order fixed by n alone (bit-reproducible, however the buffer is
//   chunked); st.clip = min(1, max_norm / (sqrt(sumsq) + 1e-6)), torch.nn.utils.clip_grad_norm_'s rule, or 1 where
//   f.max_norm <= 0 (no clipping). A non-finite sumsq gives a clip of 0 or NaN: the host reads st.sumsq to see it.
// adamw, i < a.n (the step's gradient g = grad[i] * st.clip; lr = st.lr, t = st.t):
//   w -= lr * wd * w                       (decoupled weight decay, from the weight before the step)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w -= lr * (m / bc1) / (sqrt(v / bc2) + eps),  bc1 = 1 - b1^t,  bc2 = 1 - b2^t
//   The bias corrections are f32 in the kernel, as -expm1(t ln b) (one_minus_pow) from ln b computed on the host in
//   float64: within ~10 ulp for every t (lavapipe: the step's direction within 3 to 7 x 2^-24 of float64's at
//   t = 1 .. 1e5). Dead end, measured: 1 - pow(b, t), 891 x 2^-24 off at t = 1, 245 at t = 1000, 17 at t = 5000.
//   At t = 1, 1 - f32(0.999) = 0.00099998713 is 1.3e-5 off 1 - 0.999 (b2's f32 rounding, cancelled), and Vulkan lets
//   pow err by 2^-21 absolute in its log2 near 1 (3.3e-4 relative on 1 - b2^t at t = 1 on a conforming GPU).
//   t ln b keeps t's and ln b's 2^-24 each; below t ln b = -0.5 the cancellation is gone and 1 - exp is good to a
//   few ulp; at large t, b^t underflows and the correction is exactly 1. t itself is exact in f32 up to 2^24 steps
//   (state_bytes refuses more).
// sgd, i < s.n: w -= st.lr * grad[i] (no momentum, no decay, no clipping).
// Grid of adamw and sgd: 1-D over elements, folded into y past 65535 groups: i = gid.x + gid.y * (nwg.x * WG).
// Norm { n, part_base, _p0, _p1: u32 }   Finish { parts: u32, max_norm: f32, _p0, _p1: u32 }
// Adam { n: u32, b1, b2, c1 (= 1 - b1), c2 (= 1 - b2), ln_b1, ln_b2, eps, wd: f32, _p0, _p1, _p2: u32 }
// Sgd { n, _p0, _p1, _p2: u32 }
// Constants (lab.ops.optimizer): WG (a power of two), PER.

struct State { lr: f32, t: f32, sumsq: f32, clip: f32 };
struct Norm { n: u32, part_base: u32, _p0: u32, _p1: u32 };
struct Finish { parts: u32, max_norm: f32, _p0: u32, _p1: u32 };
struct Adam { n: u32, b1: f32, b2: f32, c1: f32, c2: f32, ln_b1: f32, ln_b2: f32, eps: f32, wd: f32,
              _p0: u32, _p1: u32, _p2: u32 };
struct Sgd { n: u32, _p0: u32, _p1: u32, _p2: u32 };

const WG: u32 = {{WG}}u;
const PER: u32 = {{PER}}u;
const SLICE: u32 = WG * PER;

// norm_partials
@group(0) @binding(0) var<storage, read> g: array<f32>;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<uniform> p: Norm;
// norm_finish
@group(0) @binding(0) var<storage, read> part_in: array<f32>;
@group(0) @binding(1) var<storage, read_write> st_rw: State;
@group(0) @binding(2) var<uniform> f: Finish;
// adamw and sgd
@group(0) @binding(0) var<storage, read_write> w: array<f32>;
@group(0) @binding(1) var<storage, read> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> m: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read> st: State;
@group(0) @binding(5) var<uniform> a: Adam;
// sgd's own (its 0 and 1 are adamw's w and grad)
@group(0) @binding(2) var<storage, read> st_sgd: State;
@group(0) @binding(3) var<uniform> s: Sgd;

var<workgroup> tree: array<f32, WG>;

// The sum of every invocation's `x`, added as a binary tree in workgroup memory: a fixed order. Uniform control flow.
fn tree_sum(x: f32, li: u32) -> f32 {
    tree[li] = x;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (li < half) { tree[li] += tree[li + half]; }
        workgroupBarrier();
    }
    return tree[0];
}

@compute @workgroup_size(WG)
fn norm_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let k = wid.x + wid.y * nwg.x;                 // this workgroup's slice
    let parts = (p.n + SLICE - 1u) / SLICE;
    var acc = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = k * SLICE + j * WG + li;
        if (i < p.n) {
            let x = g[i];
            acc += x * x;
        }
    }
    let total = tree_sum(acc, li);
    if (li == 0u && k < parts) { part[p.part_base + k] = total; }
}

@compute @workgroup_size(WG)
fn norm_finish(@builtin(local_invocation_index) li: u32) {
    var acc = 0.0;
    for (var i = li; i < f.parts; i += WG) { acc += part_in[i]; }
    let sumsq = tree_sum(acc, li);
    if (li == 0u) {
        st_rw.sumsq = sumsq;
        st_rw.clip = select(1.0, min(1.0, f.max_norm / (sqrt(sumsq) + 1e-6)), f.max_norm > 0.0);
    }
}

// 1 - b^t from x = t ln b <= 0, as -expm1(x): near 0 by expm1's Taylor series to x^9 (truncation < 1e-9 relative
// at |x| = 0.5), where 1 - exp(x) would cancel; below -0.5 as 1 - exp(x), which no longer cancels (exp(x) < 0.61).
fn one_minus_pow(t: f32, ln_b: f32) -> f32 {
    let x = t * ln_b;
    if (x < -0.5) { return 1.0 - exp(x); }
    var q = 1.0;                                   // expm1(x) = x (1 + x/2 (1 + x/3 (1 + ... (1 + x/9))))
    for (var k = 9.0; k >= 2.0; k -= 1.0) { q = 1.0 + x / k * q; }
    return -x * q;
}

@compute @workgroup_size(WG)
fn adamw(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * (nwg.x * WG);
    if (i >= a.n) { return; }
    let lr = st.lr;
    let gi = grad[i] * st.clip;
    let decayed = w[i] - lr * a.wd * w[i];
    let m1 = a.b1 * m[i] + a.c1 * gi;
    let v1 = a.b2 * v[i] + a.c2 * (gi * gi);
    let bc = vec2<f32>(one_minus_pow(st.t, a.ln_b1), one_minus_pow(st.t, a.ln_b2));
    let mhat = m1 / bc.x;
    let vhat = v1 / bc.y;
    m[i] = m1;
    v[i] = v1;
    w[i] = decayed - lr * (mhat / (sqrt(vhat) + a.eps));
}

@compute @workgroup_size(WG)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * (nwg.x * WG);
    if (i >= s.n) { return; }
    w[i] = w[i] - st_sgd.lr * grad[i];
}
