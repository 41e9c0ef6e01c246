"""float64 gradients of the dense path's elementwise and normalization ops, the oracle the backward kernels
(wgsl/backward_*.wgsl via lab.ops.backward) are checked against, with each kernel's tolerance and its reason
(CPython only).

Each gradient is reverse mode through the forward's own formula (ops.py's, the intermediates named as the forward
computes them), not a copy of a kernel's algebra; tests/kernels/test_backward_oracle.py holds every one of them to
central differences of the ops.py forward (`numeric_grad`), so a wrong derivation here cannot pass for the truth.
Conventions: `dy` is the gradient of the loss with respect to the op's output; input gradients come back in the
inputs' layout; a weight's gradient is summed over every row that used it.
"""

from __future__ import annotations

import numpy as np

from lab.host.reference import ops


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


# RMSNorm backward, dx = r dy w - x r^3 mean(dy w x), held per group to the group's largest |dx|. r comes from the
# same per-invocation-then-reduction sum of squares as the forward's (NORM_TOL in kernels.py: <= 1.2e-6 relative for
# groups <= 3000, halved by the root), and r^3 triples that (~1.8e-6); mean(dy w x) is a sum of mixed signs whose
# rounding, (group/WG + log2 WG) 2^-24 ~ 7e-7 of sum |dy w x|, reaches dx at most at the first term's scale; the
# products add a few ulp. 4e-6 is that worst case with margin; lavapipe measures 0.6e-7 to 1.9e-7 on both reduction
# paths (tests/kernels/test_backward_norm.py prints them with -s). Dropping r's dependence on x (the r^3 term) or
# putting eps outside the root errs by O(1).
NORM_BACK_DX_TOL = 4e-6
# dw = sum over the step's tokens and groups of dy x r, summed in order by one invocation per column: N terms (39 at
# most in the tests) carry N 2^-24 ~ 2.3e-6 of their absolute sum at worst, which is about twice the largest |dw| for
# random signs, plus r's ~1e-6 and the final add into the earlier value. 8e-6 of the largest |dw| covers that;
# lavapipe measures 3.6e-8 to 9.3e-8. A dw without the 1/rms factor, missing one token of 13 or one group of 3 errs
# by more than 1e-2.
NORM_BACK_DW_TOL = 8e-6


def rms_norm_grad(x, w, dy, eps: float, group: int) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dw) of y = x / sqrt(mean(x^2) + eps) * w over each `group` values of the rows of x [rows, n]."""
    x, w, dy = _f64(x), _f64(w), _f64(dy)
    shape = x.shape
    x, dy = x.reshape(shape[0], -1, group), dy.reshape(shape[0], -1, group)
    # forward: ms = mean(x^2); r = (ms + eps)^-1/2; xhat = x r; y = xhat w
    ms = np.mean(x * x, axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(ms + eps)
    xhat = x * r
    dw = np.sum(dy * xhat, axis=(0, 1))                   # y = xhat w: w is shared by every row and group
    dxhat = dy * w
    dr = np.sum(dxhat * x, axis=-1, keepdims=True)        # xhat = x r: r is one value per group
    dx = dxhat * r
    dms = dr * -0.5 * (ms + eps) ** -1.5                  # r = (ms + eps)^-1/2
    dx = dx + dms * 2.0 * x / group                       # ms = sum(x^2) / group
    return dx.reshape(shape), dw


# GLU backward, held per half ([d gate | d up]) to that half's largest value. d up = dh act(g) is the forward's f32
# act (GLU_TOL in kernels.py: 3e-6) times one more product. d gate = dh u act'(g): silu' takes two exps, each allowed
# 3 + 2|g| ulp by Vulkan (~2e-6 relative at the |g| <= ~16 drawn here), and gelu' a tanh and an exp of similar
# bounds, the products a few ulp more; act' is O(1) (at most 1.1 for silu, 1.13 for gelu), so the error stays at that
# scale of the half's magnitude. 5e-6 covers it; lavapipe measures 2e-8 to 1.7e-7 (1e-7 for |g| up to 400). A silu'
# without its g s (1 - s) term, dz/dg without the cubic's 3, or d up without the activation err by 1e-2 or more.
GLU_BACK_TOL = 5e-6


def silu_grad(g) -> np.ndarray:
    """d silu / dg, silu(g) = g * sigmoid(g): sigmoid + g * sigmoid' (sigmoid' = sigmoid (1 - sigmoid))."""
    g = _f64(g)
    s = ops.sigmoid(g)
    return s + g * s * (1.0 - s)


def gelu_tanh_grad(g) -> np.ndarray:
    """d gelu_tanh / dg, gelu_tanh(g) = 0.5 g (1 + tanh(z)), z = sqrt(2/pi) g (1 + a g^2) (ops.gelu_tanh)."""
    g = _f64(g)
    z = ops.SQRT_2_OVER_PI * g * (1.0 + ops.GELU_COEF_A * g * g)
    th = np.tanh(z)
    dz = ops.SQRT_2_OVER_PI * (1.0 + 3.0 * ops.GELU_COEF_A * g * g)
    return 0.5 * (1.0 + th) + 0.5 * g * (1.0 - th * th) * dz


def glu_grad(gu, dh, act: str) -> np.ndarray:
    """d[gate | up] of h = act(gate) * up over fused rows gu [rows, 2n] = [gate | up], dh [rows, n]; the result
    has gu's fused layout."""
    gu, dh = _f64(gu), _f64(dh)
    n = dh.shape[-1]
    g, u = gu[..., :n], gu[..., n:]
    a, da = (ops.silu(g), silu_grad(g)) if act == "swiglu" else (ops.gelu_tanh(g), gelu_tanh_grad(g))
    return np.concatenate([dh * u * da, dh * a], axis=-1)


# Soft-cap backward, held to the largest |dx| of the tensor (saturated elements' gradients are ~0, so they are held
# absolutely at that scale). From x: u = x / cap rounds once, then sech^2 u = 4e / (1 + e)^2 with e = exp(-2|u|); Vulkan
# allows exp 3 + 2|2u| ulp, ~10 ulp (6e-7) where sech^2 is above 0.1 and less than that of the magnitude elsewhere,
# the quotient and products a few ulp: 1.5e-6. From y: tanh u is read back as y / cap, and the forward's tanh is good
# to a few ulp of cap (test_softcap's 2e-6 of cap), so the factor (1 - th)(1 + th) carries up to 2 |th| 2e-6 ~ 4e-6 of
# dy: 5e-6. lavapipe measures 0.7e-7 to 1.2e-7 from x, 2.0e-7 to 3.3e-7 from y. A 1 - tanh for 1 - tanh^2 errs by
# 0.26, the cap left out of the argument by 0.6.
SOFTCAP_BACK_TOL = {"x": 1.5e-6, "y": 5e-6}


def softcap_grad(x, dy, cap: float) -> np.ndarray:
    """dx of y = cap * tanh(x / cap): dy * (1 - tanh(x / cap)^2) (the cap's factors cancel)."""
    th = np.tanh(_f64(x) / cap)
    return _f64(dy) * (1.0 - th * th)


# qwen35's attention output gate, y = x sigmoid(g) (elementwise.wgsl gate_to), backward: per element against the sum
# of its terms' magnitudes (`sigmoid_gate_grad(..., magnitudes=True)`: there is no sum, so the value's own), in f32
# roundings of 2^-24: s(g) takes an exp within 3 + 2 |g| ulp on Vulkan (|g| <= 12 in the tests: 27), an add and a
# quotient, 29; s(-g) the same with its own exp (so it keeps its precision where s(g) rounds to 1); dx = dy s(g) one
# product more, dg = dy x s(g) s(-g) three: 2 x 29 + 3, one more for margin. lavapipe measures <= 9.1. A gate whose
# derivative forgets s(-g), or an input gradient left ungated, errs by O(1).
GATE_BACK_TOL = 62 * 2.0 ** -24     # 62 u, u = 2^-24 (U32, below)


def sigmoid_gate(x, g) -> np.ndarray:
    """The forward: y = x sigmoid(g), elementwise (ops.sigmoid, as the reference's attention gate)."""
    return _f64(x) * ops.sigmoid(_f64(g))


def sigmoid_gate_grad(x, g, dy, magnitudes: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dg) of y = x sigmoid(g): dx = dy s(g), dg = dy x s(g) (1 - s(g)); magnitudes: their absolute values
    (each is one product of terms, no sum)."""
    x, g, dy = _f64(x), _f64(g), _f64(dy)
    s = ops.sigmoid(g)
    dx, dg = dy * s, dy * x * s * (1.0 - s)
    return (np.abs(dx), np.abs(dg)) if magnitudes else (dx, dg)


# Embedding backward, held over the rows of the ids seen to their largest value: each element is the earlier value
# plus, per token of its id in order, one rounded product scale * dx and one rounded add, 2k + 1 roundings of 2^-24
# for an id seen k times (4 at most in the tests), each relative to a running sum no larger than the sum of the terms'
# magnitudes (~k + 1 times the result's at worst): (2k + 1)(k + 1) 2^-24 ~ 2.7e-6, taken as 3e-6; lavapipe measures
# 0.6e-7 to 1.1e-7. With scale 1 there is no product and the table must equal numpy's float32 adds in token order bit
# for bit (test_backward_embed.py). An overwrite for the add, a missing scale or a dropped token errs by 1e-1 or more.
EMBED_BACK_TOL = 3e-6


def get_rows(table, ids, scale: float = 1.0) -> np.ndarray:
    """The embedding lookup's forward (lab.ops.embed.get_rows on a dequantized table): scale * table[ids]."""
    return scale * _f64(table)[np.asarray(ids, np.int64)]


def embed_grad(ids, dx, n_rows: int, scale: float = 1.0) -> np.ndarray:
    """dE [n_rows, cols] of out = scale * E[ids]: every token adds scale * its row of dx into its id's row (a
    repeated id gets the sum); rows of ids never seen stay 0."""
    dx = _f64(dx)
    de = np.zeros((n_rows, dx.shape[-1]))
    np.add.at(de, np.asarray(ids, np.int64), scale * dx)
    return de


# -- projections and LoRA -------------------------------------------------------------------------------------------
# The projections' kernels (wgsl/backward_matmul.wgsl, backward_gemm.wgsl) are sums of products in f32, so their
# tolerances are the classic bound of a sum computed in order (Higham, Accuracy and Stability, 3.1): each rounding a
# term passes through scales its error by at most u = 2^-24, so an output whose terms pass through at most n
# roundings is within ~n u of the sum of its terms' magnitudes. The error is therefore measured per element against
# that magnitude (`bound_err`: |got - want| / scale, the scale being the same gradient computed from the inputs'
# absolute values, plus the magnitude of the value added into), never against the tensor's largest value, and the
# tolerance is the count of roundings, each stated where it is computed. A wrong index, a scale skipped or a part's
# rows taken from the wrong place errs by a large fraction of the scale; the worst-case bound is ~n u, the measured
# errors sqrt(n) u or less (random signs).
U32 = 2.0 ** -24


def dx_back_tol(chunk_rows: int, chunks: int) -> float:
    """The tolerance of dx = W^T dy through a quantized weight (dx_back), per element against |dy| |W| + |dx0|:
    a term dy * W is one product (0 roundings where fused), at most chunk_rows - 1 adds within its chunk (the first
    onto 0 is exact), chunks - 1 adds of the chunk sums, one more onto dx0 (accumulate); the dequantized W is the
    f32 arithmetic gguf.quants does, where an fma contraction moves up to 2 ulp of its terms (quant.py DEQUANT_TOL's
    note): chunk_rows + chunks + 3 roundings, one more for margin."""
    return (chunk_rows + chunks + 4) * U32


def gemm_tol(k: int) -> float:
    """The tolerance of the f32 GEMM C (+)= s sum_k A B (backward_gemm.wgsl), per element against |s| |A| |B| + |C0|:
    a product, at most k - 1 adds (the first onto 0 is exact), the scale, the add onto C0: k + 2 roundings, one more
    for margin. A GEMM whose operand is itself a GEMM's output adds that one's count (lora_back's chains)."""
    return (k + 3) * U32


def bound_err(got, want, scale) -> float:
    """Largest |got - want| / scale, element by element (scale: the sum of the terms' magnitudes, bounds' unit)."""
    got, want, scale = _f64(got), _f64(want), _f64(scale)
    return float(np.max(np.abs(got - want) / np.maximum(scale, 1e-30)))


def linear(w, x) -> np.ndarray:
    """The projection's forward, y[t, r] = sum_c w[r, c] x[t, c] (lab.ops.matmul.matmul on a dequantized weight)."""
    return _f64(x) @ _f64(w).T


def linear_grad(w, x, dy) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dw) of y = x w^T: dx [t, cols] = dy w, dw [rows, cols] = dy^T x summed over the tokens. A quantized
    weight enters dequantized (quant.dequant, gguf.quants): the gradient is taken through its values."""
    w, x, dy = _f64(w), _f64(x), _f64(dy)
    return dy @ w, dy.T @ x


def bias_grad(dy) -> np.ndarray:
    """db of y = x w^T + b: dy's column sums over the tokens, [t, n] -> [n] (full fine-tuning's Q/K/V biases). The
    GPU takes it as gemm's dy^T 1 (lab.ops.backward_matmul bias_back): gemm_tol(t) of |db0| + sum |dy|."""
    return _f64(dy).sum(axis=0)


def lora(w, a, b, x, scale: float) -> np.ndarray:
    """A projection with a LoRA adapter: y = x w^T + scale * (x a^T) b^T, a [rank, cols], b [rows, rank]."""
    x = _f64(x)
    return x @ _f64(w).T + scale * (x @ _f64(a).T) @ _f64(b).T


def lora_grad(w, a, b, x, dy, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, da, db) of `lora`: reverse mode through its intermediates u = x a^T, v = u b^T, y = x w^T + scale v."""
    w, a, b, x, dy = _f64(w), _f64(a), _f64(b), _f64(x), _f64(dy)
    u = x @ a.T
    dv = scale * dy                   # y = x w^T + scale v
    du = dv @ b                       # v = u b^T
    db = dv.T @ u
    da = du.T @ x                     # u = x a^T
    dx = dy @ w + du @ a              # x reaches y through w and through u
    return dx, da, db


def numeric_grad(loss, x, h: float) -> np.ndarray:
    """Central differences of the scalar `loss(x)` with respect to every element of x (float64):
    (loss(x + h e_i) - loss(x - h e_i)) / 2h, error O(h^2) from the third derivative plus ~1e-16 |loss| / h."""
    x = np.array(x, np.float64)
    out = np.zeros_like(x)
    flat, grad = x.reshape(-1), out.reshape(-1)
    for i in range(flat.size):
        v = flat[i]
        flat[i] = v + h
        up = loss(x)
        flat[i] = v - h
        down = loss(x)
        flat[i] = v
        grad[i] = (up - down) / (2.0 * h)
    return out
