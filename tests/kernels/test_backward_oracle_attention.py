"""The float64 RoPE and attention gradients (lab/host/reference/grads_attention.py) against central differences of
the forward references (ops.rope; attention.attention, the forward kernels' oracle, whose mask, cap and softmax are
ops.py's), so the backward kernels' reference is held to the forward's definition. No device.

Step h = 1e-5 as test_backward_oracle.py: the truncation error ~h^2 |f'''| and the rounding ~1e-16 |loss| / h are
both ~1e-10 for inputs of order 1, far inside the 1e-6 the oracle must meet relative to the gradient's largest value.
RoPE is linear in x (no truncation error). Attention's cases are small (head_dim 4 or 8, up to 7 keys) so that every
element can be differenced, and cover GQA, a window, the cap, pos > 0 and keys past the step that no query sees.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.host.reference import attention as attn_ref
from lab.host.reference import grads_attention as ga
from lab.host.reference import ops
from lab.host.reference.grads import numeric_grad
from lab.host.reference.kernels import rel_err

H = 1e-5
ORACLE_TOL = 1e-6


def _agree(name: str, analytic, loss, x) -> float:
    e = rel_err(analytic, numeric_grad(loss, x, H))
    print(f"oracle {name}: {e:.2e}")
    assert e < ORACLE_TOL, f"{name}: oracle differs from central differences by {e:.3g}"
    return e


@pytest.mark.parametrize("mode,n_rot,factors", [("norm", 6, None), ("neox", 6, [1.0, 2.5, 0.5]),
                                                ("neox", 8, None), ("norm", 8, [1.0, 4.0, 1.5, 8.0])])
def test_rope(mode, n_rot, factors):
    rng = np.random.default_rng(n_rot)
    t, heads, hd, pos0 = 3, 2, 8, 5
    x, dy = rng.standard_normal((t, heads, hd)), rng.standard_normal((t, heads, hd))
    pos = pos0 + np.arange(t)

    def loss(v):
        return np.sum(dy * ops.rope(v, pos, n_rot, 10000.0, mode, 0.5, factors))

    _agree(f"rope {mode} n_rot={n_rot} factors={factors is not None}",
           ga.rope_grad(dy, pos, n_rot, 10000.0, mode, 0.5, factors), loss, x)


def _forward(q, k, v, pos, n_kv, scale, window, softcap):
    """attention.attention (the forward kernels' oracle) on the grads' layouts: q [t, nh, hd], caches [keys, kvd]."""
    t, nh, hd = q.shape
    out, _, _ = attn_ref.attention(q.reshape(t, nh * hd), k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1), pos,
                                   n_head=nh, n_kv_head=n_kv, head_dim=hd, scale=scale, window=window,
                                   softcap=softcap)
    return out.reshape(t, nh, hd)


CASES = [  # t, pos, n_head, n_kv, hd, window, softcap, spare keys past the step
    (3, 0, 2, 2, 4, 0, 0.0, 0),
    (3, 2, 6, 2, 4, 0, 0.0, 1),          # GQA 3, earlier keys
    (4, 3, 4, 2, 8, 3, 0.0, 0),          # window: early keys seen by no query
    (3, 2, 3, 1, 4, 2, 1.5, 1),          # window and cap
]


@pytest.mark.parametrize("t,pos,nh,nkv,hd,window,softcap,spare", CASES)
def test_attention(t, pos, nh, nkv, hd, window, softcap, spare):
    rng = np.random.default_rng(t * 100 + pos * 10 + nh)
    keys = pos + t + spare
    q = rng.standard_normal((t, nh, hd)) * 1.5           # scores of a few units: the cap's curve, not its line
    k, v = rng.standard_normal((keys, nkv, hd)) * 1.5, rng.standard_normal((keys, nkv, hd))
    do = rng.standard_normal((t, nh, hd))
    sc = 0.7
    want = _forward(q, k, v, pos, nkv, sc, window, softcap)
    np.testing.assert_allclose(ga.attention(q, k, v, pos, n_kv_head=nkv, scale=sc, window=window, softcap=softcap),
                               want, rtol=0, atol=1e-12)
    dq, dk, dv = ga.attention_grad(q, k, v, do, pos, n_kv_head=nkv, scale=sc, window=window, softcap=softcap)
    what = f"attention t={t} pos={pos} {nh}/{nkv} hd={hd} W={window} cap={softcap}"
    _agree(what + " dq", dq, lambda x: np.sum(do * _forward(x, k, v, pos, nkv, sc, window, softcap)), q)
    _agree(what + " dk", dk, lambda x: np.sum(do * _forward(q, x, v, pos, nkv, sc, window, softcap)), k)
    _agree(what + " dv", dv, lambda x: np.sum(do * _forward(q, k, x, pos, nkv, sc, window, softcap)), v)
    assert not np.any(dk[pos + t:]) and not np.any(dv[pos + t:])       # keys past the step: seen by none


def test_a_wrong_derivation_fails():
    """The check has teeth: the softmax backward without D_i (dS = P dP, the 'softmax is elementwise' mistake) and
    dk summed over one query head of a GQA group are far from central differences."""
    rng = np.random.default_rng(3)
    t, pos, nh, nkv, hd, sc = 3, 2, 4, 2, 4, 0.7
    q = rng.standard_normal((t, nh, hd))
    k, v = rng.standard_normal((pos + t, nkv, hd)), rng.standard_normal((pos + t, nkv, hd))
    do = rng.standard_normal((t, nh, hd))
    num_q = numeric_grad(lambda x: np.sum(do * _forward(x, k, v, pos, nkv, sc, 0, 0.0)), q, H)
    wrong_q = np.zeros_like(q)
    mask = ops.visible(pos + np.arange(t), pos + t)
    for h in range(nh):
        s = np.where(mask, sc * q[:, h] @ k[:, h // 2].T, -np.inf)
        p = ops.softmax(s)
        wrong_q[:, h] = sc * (p * (do[:, h] @ v[:, h // 2].T)) @ k[:, h // 2]
    assert rel_err(wrong_q, num_q) > 1e3 * ORACLE_TOL
    num_k = numeric_grad(lambda x: np.sum(do * _forward(q, x, v, pos, nkv, sc, 0, 0.0)), k, H)
    q_one = q.copy()
    q_one[:, 1::2] = 0.0                                  # the second head of each group contributes nothing to dk
    do_one = do.copy()
    do_one[:, 1::2] = 0.0
    _, wrong_k, _ = ga.attention_grad(q_one, k, v, do_one, pos, n_kv_head=nkv, scale=sc)
    assert rel_err(wrong_k, num_k) > 1e3 * ORACLE_TOL
