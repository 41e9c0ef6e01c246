"""float64 gradients of Qwen3.5's gated delta-net layer between its projections (the L2 norms of q and k, the beta
gate, the decay, the delta-rule recurrence and the gated RMS norm; lab.host.reference.forward `_delta`), and of the
SiLU conv in front of it, the oracle the backward kernels (wgsl/backward_deltanet.wgsl via lab.ops.backward_deltanet,
wgsl/backward_shortconv.wgsl's silu entries via lab.ops.backward_shortconv) are checked against, with their
tolerances and the reasons (CPython only).

As in grads.py: reverse mode through the forward's own formulas (`deltanet` calls ops.l2_norm, ops.sigmoid,
ops.softplus, ops.gated_delta_rule, ops.rms_norm and ops.silu, as forward.py's `_delta` does), the intermediates
named as the forward computes them; tests/kernels/test_backward_oracle.py holds it to central differences of
`deltanet` and `conv_silu`, so a wrong derivation here cannot pass for the truth.

A training window starts at position 0 from a zero recurrent state and a zero conv state, so no gradient reaches a
state. Layouts as the engine's: proj [t, W] the in-projection rows [q k v | z | beta | alpha] (only z, beta and alpha
are read here: the conv reads q k v), conv [t, 2K + V] the conv's output silu(conv(q k v)), K = n_k_heads S,
V = n_v_heads S; y and dy [t, V] (the gated norm's output, ssm_out's input).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lab.host.reference import ops
from lab.host.reference.grads import U32


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


# The kernels' error, as grads.py's projections hold theirs: per element against the sum of its terms' magnitudes
# (`deltanet_grad(..., magnitudes=True)`: the same reverse mode with every value taken by its magnitude and every
# difference as a sum, the forward's states, e and o included, so a value that is itself a cancellation carries the
# magnitude of its terms), counted in f32 roundings of 2^-24. A gradient here is no single sum: dS is carried back
# through every token, and the longest chain of roundings an element passes through is a state entry's (per token
# the decay's product, S'^T k's S - 1 adds and product, e's and d's, the update's product and add: S + 5) over every
# token of the window, then the backward's own per token (dS's two products and add, dd's S, the decay: S + 5 again),
# then the read-off's sum of S (S + 2) and the L2 norm's or the gated norm's few: (2 t + 1) (S + 5) + 8 roundings,
# `delta_tol`. That is the worst case; random signs measure far inside it (tests/kernels/test_backward_deltanet.py
# prints the errors in units of 2^-24 with -s). Against each tensor's largest value instead, a one-token window's dq,
# dk and dbeta would fail: there o is parallel to d, the gated norm takes its scale away, and those gradients are a
# cancellation's residue (1e-4 of their largest, measured), exact to 2^-24 of their terms as every other. A decay's
# gradient left out, beta's sigmoid derivative wrong, dS not carried back or read a token late err by a large
# fraction of the terms' magnitude.
def delta_tol(t: int, head_dim: int) -> float:
    return ((2 * t + 1) * (head_dim + 5) + 8) * U32


@dataclass(frozen=True)
class Shape:
    """The sizes the layer's kernels take: key heads, value heads, head size S, and where z, beta and alpha lie in a
    projection row."""
    n_k_heads: int
    n_v_heads: int
    head_dim: int
    z_offset: int
    beta_offset: int
    alpha_offset: int
    eps: float

    @property
    def K(self) -> int:
        return self.n_k_heads * self.head_dim

    @property
    def V(self) -> int:
        return self.n_v_heads * self.head_dim


def deltanet(proj, conv, dt_bias, ssm_a, norm_w, sh: Shape) -> np.ndarray:
    """The forward over a window from a zero state (forward.py `_delta` between the conv and ssm_out): y [t, V]."""
    proj, conv = _f64(proj), _f64(conv)
    t, S, nk, nv, K = len(conv), sh.head_dim, sh.n_k_heads, sh.n_v_heads, sh.K
    z = proj[:, sh.z_offset:sh.z_offset + sh.V]
    beta = ops.sigmoid(proj[:, sh.beta_offset:sh.beta_offset + nv])
    g = ops.softplus(proj[:, sh.alpha_offset:sh.alpha_offset + nv] + _f64(dt_bias)) * _f64(ssm_a)
    q = ops.l2_norm(conv[:, :K].reshape(t, nk, S), sh.eps)
    k = ops.l2_norm(conv[:, K:2 * K].reshape(t, nk, S), sh.eps)
    v = conv[:, 2 * K:].reshape(t, nv, S)
    o, _ = ops.gated_delta_rule(q, k, v, g, beta, np.zeros((nv, S, S)))
    out = ops.rms_norm(o, _f64(norm_w), sh.eps) * ops.silu(z.reshape(t, nv, S))
    return out.reshape(t, sh.V)


def _dsilu(x, magnitudes: bool = False):
    """silu'(x) = s (1 + x s(-x)), s = sigmoid; magnitudes: s (1 + |x| s(-x)), its terms' (silu' crosses 0 near
    x = -1.28, where its value is a cancellation)."""
    s = ops.sigmoid(x)
    return s * (1.0 + (np.abs(x) if magnitudes else x) * (1.0 - s))


@dataclass
class Grads:
    """The layer's gradients: dproj [t, W] (z, beta and alpha columns; the q k v columns are the conv's, zero here),
    dconv [t, 2K + V], ddt [n_v_heads], da [n_v_heads] (ssm_a's), dnorm_w [S]."""
    dproj: np.ndarray
    dconv: np.ndarray
    ddt: np.ndarray
    da: np.ndarray
    dnorm_w: np.ndarray


def deltanet_grad(proj, conv, dt_bias, ssm_a, norm_w, dy, sh: Shape, magnitudes: bool = False) -> Grads:
    """The gradients of y = deltanet(...) given dy [t, V]: reverse mode through each intermediate. magnitudes: instead,
    each gradient's sum of its terms' magnitudes (the kernels' error bound's unit, `delta_tol`): every value by its
    magnitude, every difference a sum, the forward's states and read-outs as the sums of their terms' magnitudes."""
    proj, conv, dy = _f64(proj), _f64(conv), _f64(dy)
    dt_bias, ssm_a, norm_w = _f64(dt_bias), _f64(ssm_a), _f64(norm_w)
    t, S, nk, nv, K, eps = len(conv), sh.head_dim, sh.n_k_heads, sh.n_v_heads, sh.K, sh.eps
    m = np.abs if magnitudes else (lambda x: x)           # a value, or its magnitude
    pm = 1.0 if magnitudes else -1.0                      # a difference, or the sum of its terms' magnitudes
    # -- forward, every intermediate kept
    z = proj[:, sh.z_offset:sh.z_offset + sh.V].reshape(t, nv, S)
    b_raw = proj[:, sh.beta_offset:sh.beta_offset + nv]
    a_in = proj[:, sh.alpha_offset:sh.alpha_offset + nv] + dt_bias
    beta = ops.sigmoid(b_raw)
    sp = ops.softplus(a_in)
    g = sp * ssm_a
    decay = np.exp(g)
    q_raw, k_raw = conv[:, :K].reshape(t, nk, S), conv[:, K:2 * K].reshape(t, nk, S)
    nq = np.sqrt(np.sum(q_raw * q_raw, axis=-1, keepdims=True) + eps)
    nkk = np.sqrt(np.sum(k_raw * k_raw, axis=-1, keepdims=True) + eps)
    q, k = m(q_raw / nq), m(k_raw / nkk)
    v = m(conv[:, 2 * K:].reshape(t, nv, S))
    scale = 1.0 / np.sqrt(S)
    states = np.zeros((t + 1, nv, S, S))      # states[j] = S before token j (S_{j-1}); states[0] = 0
    e = np.zeros((t, nv, S))                   # v - S'^T k
    o = np.zeros((t, nv, S))
    for j in range(t):
        for h in range(nv):
            kh, qh = k[j, h % nk], q[j, h % nk]
            sp_ = decay[j, h] * states[j, h]                # S' = exp(g) S
            e[j, h] = v[j, h] + pm * (kh @ sp_)             # v - S'^T k
            s_new = sp_ + np.outer(kh, beta[j, h] * e[j, h])
            states[j + 1, h] = s_new
            o[j, h] = (qh @ s_new) * scale
    o_true = o if not magnitudes else deltanet_o(proj, conv, dt_bias, ssm_a, sh)
    ms = np.mean(o_true * o_true, axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(ms + eps)
    n = o * r
    sz = m(ops.silu(z))
    # -- the gated norm: y = n w silu(z)
    dy, w = m(dy.reshape(t, nv, S)), m(norm_w)
    dz = dy * n * w * _dsilu(z, magnitudes)
    dnorm_w = np.sum(dy * n * sz, axis=(0, 1))
    dn = dy * w * sz
    do = r * (dn + pm * n * np.mean(dn * n, axis=-1, keepdims=True))
    # -- the recurrence, last token first, dS the gradient at the state after the token
    dq, dk = np.zeros((t, nk, S)), np.zeros((t, nk, S))
    dv = np.zeros((t, nv, S))
    dbeta, dg = np.zeros((t, nv)), np.zeros((t, nv))
    ds = np.zeros((nv, S, S))
    for j in reversed(range(t)):
        for h in range(nv):
            kh, qh, hk = k[j, h % nk], q[j, h % nk], h % nk
            s_new = states[j + 1, h]
            sp_ = decay[j, h] * states[j, h]
            d = beta[j, h] * e[j, h]
            # o = scale S^T q
            ds[h] += scale * np.outer(qh, do[j, h])
            dq[j, hk] += scale * s_new @ do[j, h]
            # S = S' + k d^T
            dd = kh @ ds[h]
            dk[j, hk] += ds[h] @ d
            # d = beta e, e = v - S'^T k
            dbeta[j, h] = dd @ e[j, h]
            de = beta[j, h] * dd
            dv[j, h] = de
            dsp = ds[h] + pm * np.outer(kh, de)     # S' reaches S directly and through S'^T k
            dk[j, hk] += pm * (sp_ @ de)
            # S' = exp(g) S_{j-1}
            dg[j, h] = np.sum(dsp * sp_)
            ds[h] = decay[j, h] * dsp
    # -- the gates and the L2 norms
    db_raw = dbeta * beta * (1.0 - beta)
    dsp_da = np.where(a_in > 20.0, 1.0, ops.sigmoid(a_in))     # softplus is the identity past 20 (ops.softplus)
    da_in = dg * m(ssm_a) * dsp_da
    da = np.sum(dg * sp, axis=0)
    ddt = np.sum(da_in, axis=0)
    dq_raw = (dq + pm * q * np.sum(q * dq, axis=-1, keepdims=True)) / nq
    dk_raw = (dk + pm * k * np.sum(k * dk, axis=-1, keepdims=True)) / nkk
    dconv = np.concatenate([dq_raw.reshape(t, K), dk_raw.reshape(t, K), dv.reshape(t, sh.V)], axis=1)
    dproj = np.zeros_like(proj)
    dproj[:, sh.z_offset:sh.z_offset + sh.V] = dz.reshape(t, sh.V)
    dproj[:, sh.beta_offset:sh.beta_offset + nv] = db_raw
    dproj[:, sh.alpha_offset:sh.alpha_offset + nv] = da_in
    return Grads(dproj, dconv, ddt, da, dnorm_w)


def deltanet_o(proj, conv, dt_bias, ssm_a, sh: Shape) -> np.ndarray:
    """The recurrence's read-out o [t, n_v_heads, S] before the gated norm (its 1/rms: the magnitudes' scale)."""
    proj, conv = _f64(proj), _f64(conv)
    t, S, nk, nv, K = len(conv), sh.head_dim, sh.n_k_heads, sh.n_v_heads, sh.K
    beta = ops.sigmoid(proj[:, sh.beta_offset:sh.beta_offset + nv])
    g = ops.softplus(proj[:, sh.alpha_offset:sh.alpha_offset + nv] + _f64(dt_bias)) * _f64(ssm_a)
    q = ops.l2_norm(conv[:, :K].reshape(t, nk, S), sh.eps)
    k = ops.l2_norm(conv[:, K:2 * K].reshape(t, nk, S), sh.eps)
    o, _ = ops.gated_delta_rule(q, k, conv[:, 2 * K:].reshape(t, nv, S), g, beta, np.zeros((nv, S, S)))
    return o


# -- the SiLU conv in front of it (lab.ops.shortconv mode "silu") ----------------------------------------------------
# Its kernels' error (wgsl/backward_shortconv.wgsl silu_dx, silu_dw), per element against the sum of its terms'
# magnitudes (`conv_silu_grad(..., magnitudes=True)`: silu'(a) by its terms, s (1 + |a| s(-a)), plus the reach of a's
# own rounding through silu'' (|silu''| <= 0.5) as 0.5 sum |w| |x|), in f32 roundings of 2^-24:
# a = sum_i w_i x_i: l_cache products and l_cache - 1 adds; silu'(a): two exps, each within 3 + 2 |a| ulp on Vulkan
# (|a| <= 16 in the tests: 35 each, as the GLU's backward counts them) and four operations; da = dy silu' (1);
# dx_j = sum_i w_i da (l_cache products, l_cache - 1 adds); dw adds t - 1 sums in token order and the add into dw0.
SILU_ROUNDINGS = 74     # silu'(a): 2 x 35 for its exps, 4 for its operations


def conv_dx_tol(l_cache: int) -> float:
    return (4 * l_cache + SILU_ROUNDINGS + 2) * U32


def conv_dw_tol(t: int, l_cache: int) -> float:
    return (2 * l_cache + SILU_ROUNDINGS + t + 3) * U32


def conv_silu(x, w) -> np.ndarray:
    """y [t, n] = silu(causal_conv([0 (l_cache - 1 rows); x], w)) over a window from a zero state; x [t, n] (the
    first n floats of each in-projection row), w [n, l_cache]."""
    x, w = _f64(x), _f64(w)
    seq = np.concatenate([np.zeros((w.shape[1] - 1, x.shape[1])), x], axis=0)
    return ops.silu(ops.causal_conv(seq, w, len(x)))


def conv_silu_grad(x, w, dy, magnitudes: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(dx [t, n], dw [n, l_cache]) of y = conv_silu(x, w), given dy [t, n]; magnitudes: their terms' magnitudes
    (the kernels' error bound's unit)."""
    x, w, dy = _f64(x), _f64(w), _f64(dy)
    t, taps = len(x), w.shape[1]
    seq = np.concatenate([np.zeros((taps - 1, x.shape[1])), x], axis=0)
    a = ops.causal_conv(seq, w, t)                  # y = silu(a)
    if magnitudes:
        seq, w, dy = np.abs(seq), np.abs(w), np.abs(dy)
        da = dy * (_dsilu(a, True) + 0.5 * ops.causal_conv(seq, w, t))
    else:
        da = dy * _dsilu(a)
    dseq = np.zeros_like(seq)
    dw = np.zeros_like(w)
    for i in range(taps):                           # a[j] takes seq[j + i] through tap i
        dseq[i:i + t] += da * w[:, i]
        dw[:, i] = np.sum(da * seq[i:i + t], axis=0)
    return dseq[taps - 1:], dw
