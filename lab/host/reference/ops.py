"""The numpy ops, one implementation each: the forward pass (forward.py) and the kernels' references (kernels.py,
attention.py) both call these (CPython only).

Each op computes in its input's dtype and knows nothing of who calls it: the forward pass hands it float32 (float64
on request), as ggml computes, and the kernel references cast their float32 inputs to float64 first. The formulas
are ggml's (ggml-cpu ops and vec.h), so that in float32 they round as llama.cpp does.
"""

from __future__ import annotations

import numpy as np

SQRT_2_OVER_PI = 0.7978845608028654
GELU_COEF_A = 0.044715
NONE = 0xFFFFFFFF                 # argmax of a row with no finite element (lab.ops.sample.NONE, the kernel's answer)


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """ggml_rms_norm over the last axis, then (build_norm) times the weight as stored in the GGUF. The mean square
    is summed in float64 whatever x's dtype."""
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    y = x * (1.0 / np.sqrt(ms + eps)).astype(x.dtype)
    return y * w if w is not None else y


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """ggml_gelu: the tanh approximation."""
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):          # exp(-x) -> inf for very negative x gives -0, right
        return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum: -inf entries (masked scores) come out exactly 0."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap) (gemma2's scores and logits), with cap in x's dtype."""
    c = x.dtype.type(cap)
    return np.tanh(x / c) * c


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, mode: str, scale: float = 1.0,
         factors: np.ndarray | None = None) -> np.ndarray:
    """ggml_rope_ext with linear scaling and frequency factors (no YaRN): x [t, heads, hd] at positions pos [t];
    rotates the first n_rot dims of each head, leaves the rest as they are.

    theta_i = scale * pos * base^(-2i/n_rot) / factors[i], i < n_rot/2.  mode "norm" (llama.cpp's name; "adjacent"
    in lab.ops.rope): pairs (x[2i], x[2i+1]); mode "neox": pairs (x[i], x[i + n_rot/2]).  Angles in float64, then
    cast to x's dtype.
    """
    half = n_rot // 2
    inv = scale * base ** (-2.0 * np.arange(half, dtype=np.float64) / n_rot)
    if factors is not None:
        inv = inv / np.asarray(factors, dtype=np.float64)
    ang = np.asarray(pos).astype(np.float64)[:, None] * inv[None, :]      # [t, half]
    cos = np.cos(ang).astype(x.dtype)[:, None, :]
    sin = np.sin(ang).astype(x.dtype)[:, None, :]
    out = x.copy()
    if mode in ("norm", "adjacent"):
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    elif mode == "neox":
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
    else:
        raise ValueError(f"rope mode {mode!r}")
    return out


def visible(pos_q: np.ndarray, n_kv: int, window: int = 0) -> np.ndarray:
    """[len(pos_q), n_kv] bool, True where the query at position pos_q[j] may attend key k: causal, plus llama.cpp's
    standard sliding window when window > 0 (llama_hparams::is_masked_swa: masked when p_q - p_k >= window)."""
    pk = np.arange(n_kv)[None, :]
    pq = np.asarray(pos_q)[:, None]
    ok = pk <= pq
    if window > 0:
        ok &= (pq - pk) < window
    return ok


def argmax(x) -> int | np.ndarray:
    """Index of the largest finite element along the last axis, the lowest among ties (llama.cpp's greedy sampling);
    NaN and +-inf never win, and a row with no finite element gives NONE. An int for one row, else an array."""
    v = np.asarray(x, np.float64)
    ok = np.isfinite(v)
    i = np.where(ok.any(axis=-1), np.where(ok, v, -np.inf).argmax(axis=-1), NONE)
    return int(i) if i.ndim == 0 else i


def sigmoid(x: np.ndarray) -> np.ndarray:
    """ggml's op_sigmoid: 1 / (1 + exp(-x))."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml's op_softplus: log(1 + exp(x)), and x itself past 20 (where the two agree in float32)."""
    with np.errstate(over="ignore"):
        return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """qwen35's build_gdn_l2_norm over the last axis: rms_norm(x, eps / n) / sqrt(n) = x / sqrt(sum(x^2) + eps)."""
    ss = np.sum(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return x * (1.0 / np.sqrt(ss + eps)).astype(x.dtype)


def causal_conv(seq: np.ndarray, w: np.ndarray, t: int) -> np.ndarray:
    """ggml_ssm_conv: out[j] = sum_i w[:, i] * seq[j + i] for the t outputs of seq [taps - 1 + t, channels] (the
    state's rows, then the step's); w [channels, taps], the last tap on the token itself; summed in tap order."""
    out = seq[0:t] * w[:, 0]
    for i in range(1, w.shape[1]):
        out = out + seq[i:i + t] * w[:, i]
    return out


def gated_delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                     state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml_gated_delta_net (llama.cpp's fused op, token by token as its CPU loop runs): for each token j and value
    head h (key head h % n_k_heads, ggml's broadcast of q and k over the value heads):
        S_h <- exp(g[j, h]) * S_h
        d   <- beta[j, h] * (v[j, h] - S_h^T k)          (S_h [d_k, d_v]: row r a key index, column c a value index)
        S_h <- S_h + k d^T
        o[j, h] = S_h^T q / sqrt(d_k)
    q, k [t, n_k_heads, d_k] (already L2-normed), v [t, n_v_heads, d_v], g and beta [t, n_v_heads], state
    [n_v_heads, d_k, d_v] (not modified). Returns (o [t, n_v_heads, d_v], the new state)."""
    s = state.copy()
    t, n_v = v.shape[0], v.shape[1]
    n_k, d_k = q.shape[1], q.shape[2]
    scale = q.dtype.type(1.0 / np.sqrt(d_k))
    o = np.empty_like(v)
    for j in range(t):
        for h in range(n_v):
            kh, qh = k[j, h % n_k], q[j, h % n_k]
            s[h] *= np.exp(g[j, h]).astype(s.dtype)
            d = (v[j, h] - kh @ s[h]) * beta[j, h]
            s[h] += np.outer(kh, d)
            o[j, h] = (qh @ s[h]) * scale
    return o, s


def route(logits: np.ndarray, gating: str, k: int, bias: np.ndarray | None = None,
          norm: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llm_graph_context::build_moe_ffn's choice (src/llama-graph.cpp) for each row of logits [t, n_expert]: probs by
    the gating function (softmax or sigmoid), the k experts of largest probs (+ bias: the selection bias chooses, it
    never weighs) in descending order, ties to the lower expert (ggml's CPU top_k, a std::partial_sort comparing by >,
    keeps the earlier of equal values), their probs divided by their sum where `norm`. Returns (ids [t, k] int64,
    weights [t, k], probs [t, n_expert]) in the logits' dtype."""
    probs = softmax(logits) if gating == "softmax" else sigmoid(logits)
    sel = probs + bias if bias is not None else probs
    ids = np.argsort(-sel, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, ids, axis=-1)
    if norm:
        w = w / w.sum(axis=-1, keepdims=True)
    return ids, w, probs
