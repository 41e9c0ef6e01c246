"""float64 optimizer steps, the oracle wgsl/optimizer.wgsl (via lab.ops.optimizer) is checked against, with each
kernel's tolerance and its reason (CPython only): the global gradient norm and its clip scale
(torch.nn.utils.clip_grad_norm_), AdamW (torch.optim.AdamW), plain SGD, and the learning-rate schedule.

Written from the formulas, not from the kernels: float64 throughout, the betas as given (not rounded to f32), the bias
corrections as 1 - beta ** t (what PyTorch computes, in Python floats). tests/kernels/test_optimizer.py holds the
AdamW and clip steps to numbers worked out by hand, so a wrong formula here cannot pass for the truth.
Tolerances are per element, in units of U32 = 2^-24 (f32's unit roundoff), against a scale named with each: the
sum of the magnitudes the element's roundings are relative to.
"""

from __future__ import annotations

import math

import numpy as np

from lab.host.reference.grads import U32


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


def grad_sumsq(grads) -> float:
    """The sum of the gradients' squares (the squared global norm over every trainable parameter)."""
    g = _f64(grads).ravel()
    return float(np.dot(g, g))


def clip_scale(sumsq: float, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)); 1 where max_norm <= 0 (no clip)."""
    if max_norm <= 0:
        return 1.0
    return min(1.0, max_norm / (math.sqrt(sumsq) + 1e-6))


def adamw_step(p, g, m, v, *, lr: float, t: int, clip: float = 1.0, beta1: float = 0.9, beta2: float = 0.999,
               eps: float = 1e-8, weight_decay: float = 0.0):
    """One torch.optim.AdamW step (amsgrad off, maximize off) on the gradient g * clip. Returns (p, m, v, update):
    the new parameters and moments and the step's direction mhat / (sqrt(vhat) + eps) (the test's error scale)."""
    p, g, m, v = _f64(p), _f64(g) * clip, _f64(m), _f64(v)
    p = p - lr * weight_decay * p                    # decoupled: the decay never enters m or v
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    mhat = m / (1.0 - beta1 ** t)
    vhat = v / (1.0 - beta2 ** t)
    update = mhat / (np.sqrt(vhat) + eps)
    return p - lr * update, m, v, update


def sgd_step(p, g, *, lr: float):
    """p - lr g."""
    return _f64(p) - lr * _f64(g)


def schedule(steps, *, lr: float, warmup: int, total: int, min_ratio: float = 0.0) -> np.ndarray:
    """The learning rate at each of `steps` (1-based): lr * s / warmup while s <= warmup; then
    lr_min + (lr - lr_min) * (1 + cos(pi * (s - warmup) / (total - warmup))) / 2, lr_min = lr * min_ratio, reaching
    lr_min at s = total and staying there."""
    s = _f64(steps)
    low = lr * min_ratio
    span = max(total - warmup, 1)
    frac = np.clip((s - warmup) / span, 0.0, 1.0)
    cosine = low + (lr - low) * 0.5 * (1.0 + np.cos(np.pi * frac))
    ramp = lr * s / max(warmup, 1)
    return np.where(s <= warmup, ramp, np.where(s >= total, low, cosine))


# -- tolerances ------------------------------------------------------------------------------------------------------
# Vulkan's f32 precision, which the counts below take: +, -, * correctly rounded (1 rounding); x / y 2.5 ulp (3);
# sqrt inherited from 1 / inverseSqrt (2 + 2.5 ulp: 5); exp 3 + 2|x| ulp. A kernel's constant written from float64
# (0.9, 1 - 0.999, ln 0.999) carries one rounding of its own.

def sumsq_tol(depth: int) -> float:
    """sumsq against itself (every term positive, so the sum is its own scale): a square goes through at most `depth`
    roundings (lab.ops.optimizer.reduction_depth: its own, the in-order adds, two trees, norm_finish's adds), each
    at most U32 of a partial sum no larger than the total. One more for margin: 33 U32 (2.0e-6) up to n = 2^20, 71
    (4.2e-6) at n = 4e7; lavapipe measures 1.7 U32 at most. A reduction that drops its last partial loses that slice's
    share of the sum: 0.11 of it at n = 9,192 (1,000 squares past two whole slices), all of it at n = 255."""
    return (depth + 1) * U32


def clip_tol(depth: int) -> float:
    """The clip scale, relative: sumsq's error halved by the root, the root (5), + 1e-6 (1), the division (3), and the
    host's max_norm is already f32. 2 more for margin."""
    return (depth / 2 + 11) * U32


def adamw_tols(steps: int, clip_err: float) -> dict[str, float]:
    """AdamW after `steps` steps from the same f32 state, per element, given the clip scale's relative error clip_err
    (0 without clipping: the kernel's clip is then exactly 1):
      g = grad * clip: 1 rounding + clip_err.
      m (scale: the same recurrence on |g|, M = b1 M + (1 - b1)|g|, since m's two terms may cancel): b1 m and
        (1 - b1) g each 2 roundings (the f32 constant and the product), g's own, the add: 5 U32 + clip_err of M per
        step, and an earlier step's error only shrinks (times b1 < 1): steps * (5 U32 + clip_err).
      v (scale: v itself, every term positive): g^2 doubles g's error, then as m: steps * (6 U32 + 2 clip_err).
      the bias corrections: -expm1(t ln b) from ln b (1) and t ln b (1), the series or 1 - exp (<= 7 at
        x = -0.5, where exp(x) / (1 - exp(x)) = 1.5 weighs exp's 4 ulp), the subtraction: 10 U32 each.
      the direction u = mhat / (sqrt(vhat) + eps) (scale: U = Mhat / (sqrt(vhat) + eps) >= |u|): m's error and
        bc1's (10) and the division (3); half of v's error and bc2's and the division's, the root (5), + eps (1); the
        last division (3): steps * (8 U32 + 2 clip_err) + 29 U32 of U.
      p (scale: the sum over the steps of |p| + lr U): each step rounds p twice (the decay, the update), the decay
        term lr wd |p| <= |p| three times (wd's constant, lr wd, the product: 1 U32 of |p| is ample at lr wd <= 1/3),
        and lr u once, and adds lr times u's error; an earlier error only shrinks (times 1 - lr wd), so the errors of
        the steps add against the sum: steps * (8 U32 + 2 clip_err) + 33 U32 (u's count at the last step bounds
        every step's).
    Lavapipe measures 7 U32 at most (v; the test prints them with -s). The traps err by 1 or more of the scale: no bias
    correction (a step of 3.16 lr where AdamW's first is lr), L2 coupled into g (m off by wd |p| / |g|), the clip
    ignored (m and v off by 1 / clip)."""
    return {"m": steps * (5 * U32 + clip_err), "v": steps * (6 * U32 + 2 * clip_err),
            "p": steps * (8 * U32 + 2 * clip_err) + 33 * U32}


def sgd_tol(steps: int) -> float:
    """SGD after `steps` steps, per element against the sum over the steps of |p| + lr |g|: lr g (1 rounding), the
    subtraction (1), or one rounding where the compiler fuses them; an earlier error carries over unchanged."""
    return 2 * steps * U32
