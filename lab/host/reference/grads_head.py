"""float64 oracle of the output head fused with the cross-entropy (lab/ops/backward_head.py, wgsl/backward_head.wgsl)
and the kernels' error bounds (CPython only).

The forward is the definition: z = xn W^T (W dequantized by lab/host/reference/quant.py, gguf.quants), the final
soft-cap l = c tanh(z / c), log-softmax, nll = lse - l[target], the mean over the rows with a target (a target
>= n_vocab has none). The gradient is reverse mode through those intermediates from the formula;
tests/kernels/test_backward_head_oracle.py holds it to central differences of `head_loss`.

The bounds (`head_bounds`) follow grads.py's projections: counts of f32 roundings u = 2^-24, each against the
magnitude of what it rounds, computed element by element from the float64 intermediates, so that a tolerance
tracks each value's own conditioning instead of a tensor's largest entry. Their reasons sit at each term.
"""

from __future__ import annotations

import numpy as np

from lab.host.reference.grads import U32, dx_back_tol, gemm_tol

NO_TARGET = 0xFFFFFFFF
# The forward's soft-cap (elementwise.wgsl softcap_to's tanh in f32) is held by tests/kernels/test_softcap.py to
# 2e-6 of the cap: ~34 roundings of c.
CAP_ULPS = 34
# exp: Vulkan allows 3 + 2|x| ulp; log: 3 ulp, or 2^-21 absolute (8 u) near 1 (the sum of exps is >= 1 here).
EXP_ULPS, LOG_ABS_ULPS = 3, 8


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


def head_logits(w, xn, cap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(z, l) [t, n_vocab]: the head's logits z = xn W^T and the ones the model predicts with (soft-capped)."""
    z = _f64(xn) @ _f64(w).T
    return z, (cap * np.tanh(z / cap) if cap else z)


def target_mask(targets, n_vocab: int) -> np.ndarray:
    """True where a row has a target (an id < n_vocab)."""
    return np.asarray(targets, np.int64) < n_vocab


def _lse(l: np.ndarray) -> np.ndarray:
    m = l.max(axis=1)
    return m + np.log(np.sum(np.exp(l - m[:, None]), axis=1))


def head_loss(w, xn, targets, cap: float = 0.0, rows_total: int | None = None) -> dict:
    """The loss: {"loss": mean nll over the rows with a target (divided by rows_total when given), "nll" [t] (0
    without a target), "lse" [t], "mask" [t], "n": the divisor}."""
    _, l = head_logits(w, xn, cap)
    mask = target_mask(targets, l.shape[1])
    lse = _lse(l)
    tgt = np.where(mask, np.asarray(targets, np.int64), 0)
    nll = np.where(mask, lse - l[np.arange(len(tgt)), tgt], 0.0)
    n = int(mask.sum()) if rows_total is None else rows_total
    return {"loss": float(nll.sum() / n) if n else 0.0, "nll": nll, "lse": lse, "mask": mask, "n": n}


def head_grad(w, xn, targets, cap: float = 0.0, rows_total: int | None = None) -> dict:
    """Reverse mode of `head_loss`: {"dxn" [t, cols], "dw" [n_vocab, cols], "dz" [t, n_vocab] (the loss's gradient
    with respect to the head's output before the cap: the dlogits the kernels produce), "dl" (after the cap)}."""
    w, xn = _f64(w), _f64(xn)
    z, l = head_logits(w, xn, cap)
    f = head_loss(w, xn, targets, cap, rows_total)
    mask, n = f["mask"], f["n"]
    dnll = np.where(mask, 1.0 / n, 0.0) if n else np.zeros(len(mask))    # loss = sum(nll) / n
    p = np.exp(l - f["lse"][:, None])                                     # d lse / dl = softmax(l)
    onehot = np.zeros_like(l)
    rows = np.flatnonzero(mask)
    onehot[rows, np.asarray(targets, np.int64)[rows]] = 1.0               # d(-l[target]) / dl = -onehot
    dl = dnll[:, None] * (p - onehot)
    dz = dl * (1.0 - np.tanh(z / cap) ** 2) if cap else dl                # l = c tanh(z / c)
    return {"dxn": dz @ w, "dw": dz.T @ xn, "dz": dz, "dl": dl}             # z = xn W^T


def _logit_bound(w, xn, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """(E, Lb) [t, n_vocab]: bounds of the kernels' |z - z64| and |l - l64|. z is the forward's matmul, a sum of cols
    products, each through at most cols - 1 adds in any order, plus the f32 dequantization's up to 2 roundings
    (grads.dx_back_tol's note) and one for margin: (cols + 3) u of sum |W| |xn|. The cap's tanh moves l by at most
    the slope (<= 1) times that, plus its own CAP_ULPS of c."""
    cols = np.shape(w)[1]
    e = (cols + 3) * U32 * (np.abs(_f64(xn)) @ np.abs(_f64(w)).T)
    return e, (e + CAP_ULPS * U32 * cap if cap else e)


def _lse_bound(l, lse, lb, stats_rows: int, chunks: int) -> np.ndarray:
    """[t]: a bound of the kernels' |lse - lse64|. Through the logits: lse moves by the softmax-weighted mean of
    their errors, sum p Lb. Its own arithmetic, relative to the sum s of exp(l - m) (>= 1: the max's term): each
    term is exp of (l - m_k), then scaled by exp(m_k - m) and rounded once more, each exp 3 + 2|x| ulp and each
    subtraction |x| u of its value: 7 + 3|l - m| roundings of the term; the terms are positive and pass through at
    most stats_rows - 1 adds in a chunk and chunks - 1 in the merge. Then log (3 ulp of log s, or 8 u absolute) and
    the add m + log s (u of |lse|)."""
    m = l.max(axis=1, keepdims=True)
    p = np.exp(l - lse[:, None])
    terms = np.sum(p * (2 * EXP_ULPS + 1 + 3 * np.abs(l - m)), axis=1) + stats_rows + chunks
    own = U32 * (terms + LOG_ABS_ULPS + 3 * (lse - m[:, 0]) + np.abs(lse))
    return np.sum(p * lb, axis=1) + own


def _dz_bound(z, l, lse, lb, lam, e, mask, targets, cap: float, n: int) -> np.ndarray:
    """[t, n_vocab]: a bound of the kernels' |dlogits - dz64|, dlogits = (p - y) g / N with p = exp(l - lse), y the
    one-hot and g = dl/dz. p's exponent carries Lb + Lam and its subtraction's |l - lse| u, exp 3 + 2|l - lse| ulp;
    p - y, the two products and 1 / N round once each (4 u of |p - y| g). g = 4e / (1 + e)^2, e =
    exp(-2|z / c|): its argument carries E / c (g's slope is at most 2 g) and u |z / c|; the exp 3 + 4|z / c| ulp and
    the four operations after it: (10 + 8 |z / c|) u of g, a generous count."""
    p = np.exp(l - lse[:, None])
    y = np.zeros_like(p)
    rows = np.flatnonzero(mask)
    y[rows, np.asarray(targets, np.int64)[rows]] = 1.0
    dp = p * (lb + lam[:, None] + (EXP_ULPS + 3 * np.abs(l - lse[:, None])) * U32)
    if cap:
        u = np.abs(z / cap)
        g = 1.0 - np.tanh(u) ** 2
        dg = 2.0 * g * e / cap + g * (10 + 8 * u) * U32
    else:
        g, dg = np.ones_like(p), np.zeros_like(p)
    py = np.abs(p - y)
    per = g * dp + py * dg + 4 * U32 * py * g
    return np.where(mask[:, None], per / n, 0.0) if n else np.zeros_like(p)


def head_bounds(w, xn, targets, cap: float = 0.0, *, stats_rows: int, chunks: int, dx_rows: int, dx_chunks: int,
                rows_total: int | None = None, dx0=0.0, dw0=0.0) -> dict:
    """Per-value bounds of the kernels' errors against head_loss / head_grad: {"nll" [t], "loss", "dxn" [t, cols],
    "dw" [n_vocab, cols]}, for ce_stats chunks of stats_rows (chunks in all) and dx_back chunks of dx_rows
    (dx_chunks in all, slabs' sums included). dx0 / dw0: the values added into (accumulate)."""
    w, xn = _f64(w), _f64(xn)
    z, l = head_logits(w, xn, cap)
    f = head_loss(w, xn, targets, cap, rows_total)
    g = head_grad(w, xn, targets, cap, rows_total)
    mask, n, nll = f["mask"], f["n"], f["nll"]
    e, lb = _logit_bound(w, xn, cap)
    lam = _lse_bound(l, f["lse"], lb, stats_rows, chunks)
    tgt = np.where(mask, np.asarray(targets, np.int64), 0)
    # nll = lse - l[target]: both errors and one rounding; the kernel writes an exact 0 without a target
    nll_b = np.where(mask, lam + lb[np.arange(len(tgt)), tgt] + U32 * np.abs(nll), 0.0)
    # the mean: the rows' errors, at most rows - 1 adds in order and the division, one more for margin
    loss_b = (nll_b.sum() + (mask.sum() + 1) * U32 * np.abs(nll).sum()) / n if n else 0.0
    dz_b = _dz_bound(z, l, f["lse"], lb, lam, e, mask, targets, cap, n)
    # dxn = dlogits W by dx_back: its roundings against the terms' magnitudes, plus dlogits' own errors through |W|
    dx_b = dz_b @ np.abs(w) + dx_back_tol(dx_rows, dx_chunks) * (np.abs(g["dz"]) @ np.abs(w) + np.abs(dx0))
    # dW += dlogits^T xn by gemm over the t rows
    t = xn.shape[0]
    dw_b = dz_b.T @ np.abs(xn) + gemm_tol(t) * (np.abs(g["dz"]).T @ np.abs(xn) + np.abs(dw0))
    return {"nll": nll_b, "loss": float(loss_b), "dxn": dx_b, "dw": dw_b}
