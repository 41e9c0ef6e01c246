"""float64 numpy reference for wgsl/attention.wgsl and wgsl/kv.wgsl, written from the math, not from the kernels
(CPython only). The mask, softcap and softmax are ops.py's, the forward pass's own."""

from __future__ import annotations

import numpy as np

from lab.host.reference import ops


def kv_write(k_cache, v_cache, src, pos, *, n_kv_head, head_dim, k_offset, v_offset):
    """Caches [n_ctx, n_kv*hd] after writing the step's rows of `src` [t, stride] at rows pos .. pos+t-1."""
    kvd = n_kv_head * head_dim
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    t = src.shape[0]
    k_cache[pos:pos + t] = src[:, k_offset:k_offset + kvd]
    v_cache[pos:pos + t] = src[:, v_offset:v_offset + kvd]
    return k_cache, v_cache


def attention(q, k_cache, v_cache, pos, *, n_head, n_kv_head, head_dim, scale, window=0, softcap=0.0):
    """q [t, n_head*hd] (already sliced out of its source); caches [n_ctx, n_kv*hd].
    Returns (out [t, n_head*hd], probs [t, n_head, n_ctx], raw scaled scores [t, n_head, n_ctx] before the cap)."""
    q = np.asarray(q, np.float64)
    kc = np.asarray(k_cache, np.float64)
    vc = np.asarray(v_cache, np.float64)
    t, n_ctx = q.shape[0], kc.shape[0]
    group = n_head // n_kv_head
    mask = ops.visible(pos + np.arange(t), n_ctx, window)
    out = np.zeros((t, n_head * head_dim))
    probs = np.zeros((t, n_head, n_ctx))
    raw = np.zeros((t, n_head, n_ctx))
    for j in range(t):
        keys = np.flatnonzero(mask[j])
        for h in range(n_head):
            g = h // group
            qh = q[j, h * head_dim:(h + 1) * head_dim]
            K = kc[keys, g * head_dim:(g + 1) * head_dim]
            V = vc[keys, g * head_dim:(g + 1) * head_dim]
            s = scale * (K @ qh)
            raw[j, h, keys] = s
            if softcap > 0:
                s = ops.softcap(s, softcap)
            p = ops.softmax(s)
            probs[j, h, keys] = p
            out[j, h * head_dim:(h + 1) * head_dim] = p @ V
    return out, probs, raw
