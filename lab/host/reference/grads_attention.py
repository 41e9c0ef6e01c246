"""float64 gradients of RoPE and causal attention (GQA, sliding window, logit soft-cap), the oracle the backward
kernels (wgsl/backward_rope.wgsl, wgsl/backward_attention.wgsl via lab.ops.backward_rope and
lab.ops.backward_attention) are checked against, with each kernel's tolerance and its reason (CPython only).

As in grads.py: each gradient is reverse mode through the forward's own formula, its intermediates named as the
forward computes them (ops.rope's rotation; attention's scores, cap, mask, softmax and weighted sum), not a copy of a
kernel's algebra (the kernels recompute the probabilities from row statistics, the oracle does not);
tests/kernels/test_backward_oracle_attention.py holds them to central differences of the forward references
(ops.rope, attention.attention), so a wrong derivation here cannot pass for the truth.

Layouts: heads as their own axis, x [t, n_head, head_dim] for RoPE and Q, O, dO; K and V [n_keys, n_kv_head, hd]
with row p the key (value) at position p, as the KV cache holds them. The step's queries sit at positions
pos .. pos + t - 1 and see keys 0 .. pos + t - 1 through ops.visible's mask (causal, llama.cpp's standard window).
"""

from __future__ import annotations

import numpy as np

from lab.host.reference import ops
from lab.host.reference.grads import U32
from lab.host.reference.kernels import rope_tol


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


# -- RoPE -----------------------------------------------------------------------------------------------------------
# The backward rotates each pair by the negative of the forward's angle, theta = f32(pos) * f32(freq) in both (the
# same frequency table, the same product, the same cos_sin of rotary.wgsl), so its rounding is the forward's: theta
# carries ~1.5 ulp (|theta| 1e-7 rad), cos_sin ~1e-7, each output two products and an add. The forward's tolerance
# (kernels.rope_tol: 1e-6 + 1.5e-7 max|theta| of each head's largest value) therefore holds for the gradient with the
# same reasons. A rotation by +theta (the forward again) errs by up to 2 sin(theta) of the head, the other pairing by
# O(1), one position off by ~freq_0 = 1 radian of the first pair.
def rope_back_tol(max_theta: float) -> float:
    return rope_tol(max_theta)


def rope_angles(pos, n_rot: int, base: float, scale: float = 1.0, factors=None) -> np.ndarray:
    """theta [t, n_rot / 2] = scale * pos * base^(-2i / n_rot) / factor_i, as ops.rope computes it."""
    half = n_rot // 2
    inv = scale * base ** (-2.0 * np.arange(half, dtype=np.float64) / n_rot)
    if factors is not None:
        inv = inv / _f64(factors)
    return _f64(pos)[:, None] * inv[None, :]


def _pairs(n_rot: int, mode: str) -> tuple[slice, slice]:
    """The two members of every rotated pair (as ops.rope slices them): adjacent (2i, 2i + 1), neox (i, i + n_rot/2)."""
    if mode in ("norm", "adjacent"):
        return slice(0, n_rot, 2), slice(1, n_rot, 2)
    if mode == "neox":
        return slice(0, n_rot // 2), slice(n_rot // 2, n_rot)
    raise ValueError(f"rope mode {mode!r}")


def rope_grad(dy, pos, n_rot: int, base: float, mode: str, scale: float = 1.0, factors=None) -> np.ndarray:
    """dx of y = ops.rope(x, pos, ...) for dy [t, heads, hd]: the forward is, per pair and angle theta,
    y0 = x0 cos - x1 sin, y1 = x0 sin + x1 cos (dims past n_rot copied), so dx0 = dy0 cos + dy1 sin,
    dx1 = -dy0 sin + dy1 cos (the transpose: the rotation by -theta), and dims past n_rot get dy as it is."""
    dy = _f64(dy)
    ang = rope_angles(pos, n_rot, base, scale, factors)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = _pairs(n_rot, mode)
    dx = dy.copy()
    dy0, dy1 = dy[..., a], dy[..., b]
    dx[..., a] = dy0 * cos + dy1 * sin        # y0 = x0 cos - x1 sin and y1 = x0 sin + x1 cos, differentiated in x0
    dx[..., b] = -dy0 * sin + dy1 * cos       # ... and in x1
    return dx


# -- attention ------------------------------------------------------------------------------------------------------

def _group(n_head: int, n_kv_head: int) -> int:
    if n_head % n_kv_head:
        raise ValueError(f"n_head {n_head} is not a multiple of n_kv_head {n_kv_head}")
    return n_head // n_kv_head


def _head_forward(qh, kg, vg, mask, scale: float, softcap: float) -> dict:
    """One query head's forward over its KV head, intermediates named: raw = scale q.k, s = cap(raw), P = softmax
    over the visible keys (0 elsewhere), out = P v."""
    raw = scale * (qh @ kg.T)                                   # [t, n_keys]
    s = ops.softcap(raw, softcap) if softcap > 0 else raw
    p = ops.softmax(np.where(mask, s, -np.inf))
    return dict(raw=raw, s=s, p=p, out=p @ vg)


def attention(q, k, v, pos: int, *, n_kv_head: int, scale: float, window: int = 0, softcap: float = 0.0):
    """out [t, n_head, hd] of causal attention: query head h reads KV head h // (n_head / n_kv_head)."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    t, n_head, _ = q.shape
    group = _group(n_head, n_kv_head)
    mask = ops.visible(pos + np.arange(t), k.shape[0], window)
    out = np.zeros_like(q)
    for h in range(n_head):
        out[:, h] = _head_forward(q[:, h], k[:, h // group], v[:, h // group], mask, scale, softcap)["out"]
    return out


def attention_grad(q, k, v, do, pos: int, *, n_kv_head: int, scale: float, window: int = 0,
                   softcap: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of `attention` given dO: reverse mode through each head's intermediates. A KV head's dk and dv
    sum over the query heads of its group; keys no query sees get 0."""
    q, k, v, do = _f64(q), _f64(k), _f64(v), _f64(do)
    t, n_head, _ = q.shape
    group = _group(n_head, n_kv_head)
    mask = ops.visible(pos + np.arange(t), k.shape[0], window)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(n_head):
        g = h // group
        f = _head_forward(q[:, h], k[:, g], v[:, g], mask, scale, softcap)
        p = f["p"]
        dv[:, g] += p.T @ do[:, h]                               # out = P v
        dp = do[:, h] @ v[:, g].T
        ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))  # P = softmax(s): dP -> ds (0 on masked keys)
        if softcap > 0:
            ds = ds * (1.0 - np.tanh(f["raw"] / softcap) ** 2)   # s = c tanh(raw / c)
        dq[:, h] = scale * ds @ k[:, g]                          # raw = scale q.k
        dk[:, g] += scale * ds.T @ q[:, h]
    return dq, dk, dv


# -- attention's tolerances -------------------------------------------------------------------------------------------
# As the projections' (grads.py): per element, against the sum of the magnitudes of the terms that make the gradient,
# with a count of f32 roundings (u = 2^-24 each) a term passes through; the counts follow the kernels' arithmetic
# (wgsl/backward_attention.wgsl) and are worst cases to first order. With d = head_dim, for query row i, key k:
#   score  s = cap(scale q.k): a d-term dot and the scale, (d + 1) u a_ik, a_ik = scale |q_i|.|k_k| (the dot's terms'
#          magnitudes, |s| <= a); the cap's divide and product add 2 u |s|, its tanh, whose precision Vulkan inherits
#          from sinh / cosh (exp's 3 + 2|x| ulp each), ~(24 + 16 |raw / c|) u absolute, times c:
#          sigma = (d + 3) A + c (24 + 16 W), A = max a, W = max |raw / c| (at most the forward's clamp of 15).
#   P      recomputed as exp(s - m) / l from the row's max m and sum l (the stats pass's online softmax). log P is
#          s - lse(s) and lse moves by at most the largest score error, so the scores' errors move log P by at most
#          2 sigma, whichever pass recomputes s. Vulkan allows exp 3 + 2|x| ulp (ulp <= 2u relative): with the
#          subtraction's rounding (6 + 5|x|) u a term, x = s - m within the row's range X; the online rescales (at most
#          one a key, 7 + 5|x| u each, their arguments summing to at most X), the n_k adds, and the final exp,
#          reciprocal and product; a GPU's lanes (up to 64 a row; the tiles: 16 invocations a row, 4 levels) merge
#          their (max, sum) pairs in up to 6 levels, two exps of arguments within X, two products and an add a level,
#          6 (15 + 8 X) u more:
#          eps_P = (2 sigma + 63 X + 8 n_k + 105) u relative.
#   dS     = P (dO.v - D), D = dO.O: two d-term dots (and O's own f32 rounding), the subtraction and product, against
#          B_ik = P (|dO_i|.|v_k| + |dO_i|.|O_i|) >= |dS|: (eps_P + d + 3) u B. With a cap, times its derivative
#          1 - tanh^2(raw / c) = 4e / (1 + e)^2, e = exp(-2|raw / c|): the argument's error (d + 2) u a / c doubles in
#          the derivative's log, exp adds 6 + 8|raw / c| ulp-terms and the quotient 4: eps_c = (2 (d + 2) A / c + 10
#          + 8 W) u, and the product one more.
#   dQ_i   = scale sum over the n_k visible keys of dS k: n_k adds, a product, the scale: against scale sum c' B |k|.
#   dK_k   = scale sum over the n_q (query, head) terms of its group that see key k of dS q: the same with n_q.
#   dV_k   = sum P dO over the same n_q terms: (eps_P + n_q + 1) u against sum P |dO|.
# Past the forward's clamp (|raw / c| >= 15) the kernels' derivative is 0 where the oracle's is below 4e-13: such a
# term may be missing whole, so it enters B at 1 / (count of dS) u times its size (the error allowed is the term).
# An O given with an error beyond its f32 rounding (the forward kernel's output, not the oracle's) adds |dO_i|.err_i
# to D's error; `o_err` folds it into B at the count dS carries. The counts are worst cases, the scores' error taken at
# the largest a everywhere: 1,200 to 9,400 u at the tests' shapes, where lavapipe measures at most 47 u (-s prints
# both); raw scores of tens against a cap of 2 count 55,000 u and measure 2,800 u (the cap's derivative far out on its
# shoulder, ~1e-9, carries the raw score's absolute error over c / 2). A wrong mask, a missing D, scale or cap
# derivative, or a query head left out of dK errs by 1e-2 to 1 of these magnitudes, 1e6 u or more.

def _row_facts(q, k, mask, scale: float, softcap: float, group: int) -> dict:
    """The magnitudes the counts take, over every visible (query, head, key): A, the range X of a row's scores, W."""
    t, n_head, _ = q.shape
    a_max = x_rng = w_max = 0.0
    for h in range(n_head):
        kg = k[:, h // group]
        a = scale * (np.abs(q[:, h]) @ np.abs(kg).T)
        raw = scale * (q[:, h] @ kg.T)
        s = ops.softcap(raw, softcap) if softcap > 0 else raw
        a_max = max(a_max, float(np.max(np.where(mask, a, 0.0))))
        hi, lo = np.max(np.where(mask, s, -np.inf), axis=1), np.min(np.where(mask, s, np.inf), axis=1)
        x_rng = max(x_rng, float(np.max(hi - lo)))
        if softcap > 0:
            w_max = max(w_max, float(np.max(np.where(mask, np.minimum(np.abs(raw) / softcap, 15.0), 0.0))))
    return dict(A=a_max, X=x_rng, W=w_max)


def attention_tols(q, k, v, do, pos: int, *, n_kv_head: int, scale: float, window: int = 0,
                   softcap: float = 0.0, o_err=0.0) -> dict[str, tuple[np.ndarray, float]]:
    """{"dq": (scale array, tol), "dk": ..., "dv": ...}: each gradient's per-element magnitude of its terms and the
    tolerance relative to it (the header's counts times u), for grads.bound_err. `o_err`: an absolute error bound of
    each element of the O the kernel is given, beyond its f32 rounding (a scalar or O's shape)."""
    q, k, v, do = _f64(q), _f64(k), _f64(v), _f64(do)
    t, n_head, d = q.shape
    group = _group(n_head, n_kv_head)
    mask = ops.visible(pos + np.arange(t), k.shape[0], window)
    o = attention(q, k, v, pos, n_kv_head=n_kv_head, scale=scale, window=window, softcap=softcap)
    f = _row_facts(q, k, mask, scale, softcap, group)
    n_k = int(mask.sum(axis=1).max())
    n_q = int(mask.sum(axis=0).max()) * group
    sigma = (d + 3) * f["A"] + (softcap * (24 + 16 * f["W"]) if softcap > 0 else 0.0)
    eps_p = 2 * sigma + 63 * f["X"] + 8 * n_k + 105
    eps_c = (2 * (d + 2) * f["A"] / softcap + 10 + 8 * f["W"]) if softcap > 0 else 0.0
    count_ds = eps_p + d + 3 + eps_c + 1
    err_d = np.sum(np.abs(do) * np.broadcast_to(_f64(o_err), o.shape), axis=-1) / (count_ds * U32)  # [t, n_head]
    sq, sk, sv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(n_head):
        g = h // group
        p = _head_forward(q[:, h], k[:, g], v[:, g], mask, scale, softcap)["p"]
        mag_d = np.sum(np.abs(do[:, h]) * np.abs(o[:, h]), axis=-1) + err_d[:, h]
        b = p * (np.abs(do[:, h]) @ np.abs(v[:, g]).T + mag_d[:, None])
        if softcap > 0:
            w = scale * (q[:, h] @ k[:, g].T) / softcap
            b = b * (1.0 - np.tanh(w) ** 2) * np.where(np.abs(w) >= 15.0, 1.0 + 1.0 / (count_ds * U32), 1.0)
        sq[:, h] = scale * b @ np.abs(k[:, g])
        sk[:, g] += scale * b.T @ np.abs(q[:, h])
        sv[:, g] += p.T @ np.abs(do[:, h])
    return {"dq": (sq, (count_ds + n_k + 2) * U32), "dk": (sk, (count_ds + n_q + 2) * U32),
            "dv": (sv, (eps_p + n_q + 1) * U32)}
