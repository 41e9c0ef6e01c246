"""float64 gradients of LFM2's short conv (y = C * conv(B * x) over the in_proj rows [B | C | x]), the oracle the
backward kernels (wgsl/backward_shortconv.wgsl via lab.ops.backward_shortconv) are checked against, with their
tolerances and the reasons (CPython only).

As in grads.py: reverse mode through the forward's own formula (`shortconv`: ops.causal_conv, the forward reference's
conv, over [zero state; B*x]), its intermediates named as the forward computes them, not a copy of a kernel's algebra;
tests/kernels/test_backward_oracle.py holds it to central differences of `shortconv`, so a wrong derivation here
cannot pass for the truth.

A training window starts at position 0 from a zero conv state, so the conv's sequence is l_cache - 1 zero rows then
the window's B*x, and no gradient flows into a state. Layouts: bcx [t, 3n] rows [B | C | x] as in_proj writes them,
w [n, l_cache] (the conv kernel, GGUF ne [l_cache, n]: tap i of channel c at c * l_cache + i), y and dy [t, n].
"""

from __future__ import annotations

import numpy as np

from lab.host.reference import ops
from lab.host.reference.grads import U32


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


# The kernels' error, as grads.py's projections hold theirs: per element against the sum of its terms' magnitudes
# (`shortconv_grad` on the inputs' absolute values, plus |dw0| for the weight), counted in f32 roundings of 2^-24.
# dC_j = dy_j conv_j: u = B x (1), each tap's product (1), l_cache - 1 adds (the first onto 0 is exact), the product
#   by dy (1): l_cache + 2 roundings (an fma contraction rounds fewer).
# dB_j = du_j x_j and dx_j = du_j B_j: dconv = dy C (1), each tap's product (1), l_cache - 1 adds, the product by x or
#   B (1): l_cache + 2 as well.
# dw[c, i] = dw0 + sum_j dconv_j u_{j - l_cache + 1 + i}: dconv (1), u (1), the product (1), t - 1 adds in token
#   order, the add onto dw0 (1): t + 3 roundings.
# One more each for margin, as gemm_tol. lavapipe measures well inside them (tests/kernels/test_backward_shortconv.py
# prints the errors in units of 2^-24 with -s); a tap reversed, one token off, dC from u instead of conv or the add
# into dw dropped err by a large fraction of the scale.
def dbcx_tol(l_cache: int) -> float:
    return (l_cache + 3) * U32


def dw_tol(t: int) -> float:
    return (t + 4) * U32


def split(bcx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, C, x) of rows [B | C | x] (each [t, n])."""
    bcx = _f64(bcx)
    n = bcx.shape[-1] // 3
    return bcx[:, :n], bcx[:, n:2 * n], bcx[:, 2 * n:]


def shortconv(bcx, w) -> np.ndarray:
    """The forward over a window from a zero state (lab.host.reference.forward `_shortconv` between its projections):
    y [t, n] = C * causal_conv([0 (l_cache - 1 rows); B * x], w)."""
    b, c, x = split(bcx)
    w = _f64(w)
    seq = np.concatenate([np.zeros((w.shape[1] - 1, b.shape[1])), b * x], axis=0)
    return c * ops.causal_conv(seq, w, len(b))


def shortconv_grad(bcx, w, dy) -> tuple[np.ndarray, np.ndarray]:
    """(dbcx [t, 3n] = [dB | dC | dx], dw [n, l_cache]) of y = shortconv(bcx, w), given dy [t, n]."""
    b, c, x = split(bcx)
    w, dy = _f64(w), _f64(dy)
    t, taps = len(b), w.shape[1]
    # forward: u = B x; seq = [0; u]; conv[j] = sum_i w[:, i] seq[j + i]; y = C conv
    u = b * x
    seq = np.concatenate([np.zeros((taps - 1, b.shape[1])), u], axis=0)
    conv = ops.causal_conv(seq, w, t)
    dc = dy * conv                                  # y = C conv
    dconv = dy * c
    dseq = np.zeros_like(seq)
    dw = np.zeros_like(w)
    for i in range(taps):                           # conv[j] takes seq[j + i] through tap i
        dseq[i:i + t] += dconv * w[:, i]
        dw[:, i] = np.sum(dconv * seq[i:i + t], axis=0)
    du = dseq[taps - 1:]                            # the zero state's rows are constants: their gradient goes nowhere
    return np.concatenate([du * x, dc, du * b], axis=1), dw
