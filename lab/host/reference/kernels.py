"""float64 references of the basic WGSL kernels (norm, rope, softmax, glu, argmax, top-k) in the kernels' buffer
layouts, with each kernel's tolerance and its reason, and the error measure the tolerances are stated in
(CPython only).

The arithmetic is ops.py's, on the f32 inputs cast to float64. Nothing here touches a device: tests/kernels/checks.py
runs the kernels natively against these, lab/host/reference/kernel_cases.py builds the cases the browser worker and the
verification card run, and scripts/make_kernel_fixtures.py writes those cases' expected values.
"""

from __future__ import annotations

import numpy as np

from lab.host.reference import ops


def f32(a) -> np.ndarray:
    """`a` as a contiguous float32 array: a kernel's input, which the references then read in float64."""
    return np.ascontiguousarray(a, dtype=np.float32)


def rel_err(got, want, axis=None) -> float:
    """Largest |got - want| over the largest |want|, within each slice along `axis` (the worst slice)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if axis is None:
        return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
    err = np.max(np.abs(got - want), axis=axis)
    mag = np.maximum(np.max(np.abs(want), axis=axis), 1e-30)
    return float(np.max(err / mag))


# RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w. The sum of squares runs per invocation (<= n/WG terms) then
# through a subgroup/tree reduction, so its relative error is at most ~(n/WG + log2 WG) * 2^-24 ~ 1.2e-6 for
# n <= 3000 (halved by the square root); rsqrt (2 ulp) and the two products add ~2.5e-7. 2e-6 of each group's
# magnitude is that worst case with margin (lavapipe measures ~1.5e-7); the eps-outside-sqrt trap errs by a
# factor ~3 on the small-magnitude row.
NORM_TOL = 2e-6


def rms_norm_ref(x, w, eps, group):
    """x [rows, n] normalised per group of `group` values (per head for Gemma's q/k norms), float64."""
    x = np.asarray(x, np.float64)
    y = ops.rms_norm(x.reshape(x.shape[0], -1, group), np.asarray(w, np.float64), eps)
    return y.reshape(x.shape)


# RoPE: each output is x0*cos - x1*sin with theta = f32(pos) * f32(freq): theta carries up to ~1.5 ulp
# (freq and product roundings, 2^-24 relative each), i.e. |theta| * 1e-7 radians, which moves an output by
# that times the pair's magnitude; Cody-Waite reduction is exact to ~1e-7 rad for |theta| < 1e4, and
# lavapipe's sin/cos on [-pi, pi] are within ~1e-7. So tolerance = 1e-6 + 1.5e-7 * max|theta| of each head's
# magnitude (measured: 2.6e-7 at pos 7, 7.6e-5 against 2.3e-4 at theta 1500), far below the O(1) error of the
# other pairing. (Vulkan only promises sin/cos to 2^-11 absolute: a GPU using that freedom would need ~5e-4.)
def rope_tol(max_theta: float) -> float:
    return 1e-6 + 1.5e-7 * max_theta


def rope_ref(x, pos, n_head, head_dim, n_rot, base, scale, mode, factors=None):
    """x: [t, row_stride] float, n_head heads of head_dim from column 0, rows at positions pos, pos + 1, ...;
    returns a float64 copy with those heads rotated (mode "adjacent" or "neox", as lab.ops.rope)."""
    y = np.array(x, np.float64)
    t, width = y.shape[0], n_head * head_dim
    heads = y[:, :width].reshape(t, n_head, head_dim)
    y[:, :width] = ops.rope(heads, pos + np.arange(t), n_rot, base, mode, scale, factors).reshape(t, width)
    return y


# Softmax: each probability is exp(s*x - m) / S. s*x is rounded to f32 (0.5 ulp ~ 6e-8 * |s x| absolute),
# which exp turns into the same relative error; exp itself and the n-term sum of S (per-invocation then
# reduction, ~(n/WG + log2 WG) * 6e-8) add a few 1e-7. Tolerance 3e-6 + 2e-7 * max|s*x| of each row's largest
# probability (measured: 2e-7 to 4.4e-7). Without the max subtraction, logits of 100..1000 overflow exp to
# inf and the output is NaN.
def softmax_tol(max_abs: float) -> float:
    return 3e-6 + 2e-7 * max_abs


def softmax_ref(x, scale=1.0):
    """Row softmax of scale * x, float64."""
    return ops.softmax(np.asarray(x, np.float64) * scale)


# GLU: out = act(g) * u. silu's exp may carry 3 + 2|g| ulp (Vulkan's exp bound), ~2e-6 relative for the
# |g| <= ~16 drawn here, and silu passes at most that on; tanh in gelu, the cubic and the products add a few
# ulp. 3e-6 of the tensor's magnitude covers that bound (lavapipe measures ~6e-8); swapping gate and up
# (silu(u) * g) or clamping tanh's argument too tightly errs by O(1e-2..1).
GLU_TOL = 3e-6


def glu_ref(g, u, act):
    """act(g) * u in float64, act SiLU for "swiglu" and tanh-GELU for "geglu"."""
    g = np.asarray(g, np.float64)
    return (ops.silu(g) if act == "swiglu" else ops.gelu_tanh(g)) * np.asarray(u, np.float64)


# Argmax / top-k select and copy: indices and values must match the reference exactly (no arithmetic). The
# argmax reference is ops.argmax.
def topk_ref(row, k):
    """[(index, value)] of the k best, value descending then index ascending; NaN / +-inf never chosen."""
    v = np.asarray(row, np.float32)
    idx = np.flatnonzero(np.isfinite(v))
    order = idx[np.lexsort((idx, -v[idx].astype(np.float64)))][:k]
    pairs = [(int(i), float(v[i])) for i in order]
    return pairs + [(ops.NONE, float(np.float32(-3.4028234663852886e38)))] * (k - len(pairs))


# A routed layer's kernels (wgsl/moe.wgsl, matvec.wgsl's EXPERT variant). route: the choice is exact (a comparison of
# f32 values, the same order as float64's wherever two values are further apart than f32's rounding of them: the
# tests draw logits whose top k + 1 are apart by far more); each weight is an exp (2 ulp), a sum of n_expert terms
# and one or two divisions, so 2e-6 of the weight covers it (lavapipe measures a few 1e-8); combine: k products summed,
# then one add, 1e-6 of the largest output; the expert products are the matvec's own sums, held to quant.py's DOT_TOL
# per element against its sum |W||x|, as test_quant_types holds the matvec.
ROUTE_TOL = 2e-6
COMBINE_TOL = 1e-6


def route_ref(logits, gating: str, k: int, bias=None, norm: bool = True):
    """(ids [t, k], weights [t, k]) of route for logits [t, n_expert] in float64 (ops.route: llama.cpp's choice)."""
    ids, w, _ = ops.route(np.asarray(logits, np.float64), gating, k,
                          None if bias is None else np.asarray(bias, np.float64), norm)
    return ids, w


def route_margin(logits, gating: str, k: int, bias=None) -> float:
    """The smallest gap between a token's k-th and (k+1)-th selection value: how far the choice is from a tie."""
    lg = np.asarray(logits, np.float64)
    probs = ops.softmax(lg) if gating == "softmax" else ops.sigmoid(lg)
    sel = np.sort(probs + (0 if bias is None else np.asarray(bias, np.float64)), axis=-1)[:, ::-1]
    return float(np.min(sel[:, k - 1] - sel[:, k])) if sel.shape[1] > k else float("inf")


def expert_matvec_ref(W, x, ids, x_div: int, glu: str | None = None):
    """Each pair q's output [pairs, per]: W[ids[q]] (W: [n_expert, per, cols] float64) times its input row x[q //
    x_div] (x: [rows, cols], or [rows, 2 cols] [gate | up] with glu), in float64."""
    W, x = np.asarray(W, np.float64), np.asarray(x, np.float64)
    cols = W.shape[2]
    out = []
    for q, e in enumerate(np.ravel(ids)):
        row = x[q // x_div]
        if glu is not None:
            act = ops.silu if glu == "swiglu" else ops.gelu_tanh
            row = act(row[:cols]) * row[cols:2 * cols]
        out.append(W[e] @ row[:cols])
    return np.array(out)


def mute_ref(ids, weights, expert: int, r0: int, r1: int, pos: int = 0, scale: float = 0.0) -> np.ndarray:
    """weights [t, k] in float64 with those of the pairs that chose `expert` at a position pos + j in [r0, r1) times
    `scale` (0: zeroed, the expert left out of combine's sum); the other pairs' weights as they were, not
    renormalised. The op itself is exact in f32 (a zero, or one product), so mute then combine keeps COMBINE_TOL."""
    w = np.array(weights, np.float64)
    at = pos + np.arange(w.shape[0])[:, None]
    hit = (np.asarray(ids) == expert) & (at >= r0) & (at < r1)
    w[hit] *= scale
    return w


def combine_ref(down, weights, y0=None):
    """y [t, n] = (y0 or 0) + sum_s weights[t, s] * down[t k + s] in float64 (down: [t k, n], weights [t, k])."""
    w = np.asarray(weights, np.float64)
    t, k = w.shape
    d = np.asarray(down, np.float64).reshape(t, k, -1)
    out = np.einsum("ts,tsn->tn", w, d)
    return out if y0 is None else out + np.asarray(y0, np.float64)
