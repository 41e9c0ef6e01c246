"""The float64 gradient oracle (lab/host/reference/grads.py) against central differences of the ops.py forward, so
the kernels' reference is itself held to the forward's definition and not to a derivation that could share a
kernel's mistake. No device.

Each case draws a random upstream gradient dy and differentiates loss(x) = sum(dy * forward(x)) numerically with
step h = 1e-5: for inputs of order 1 the truncation error is ~h^2 |f'''| ~ 1e-10 and the rounding ~1e-16 |loss| / h
~ 1e-10, far inside the 1e-6 the oracle must meet relative to the gradient's magnitude (measured 1e-11 to 3e-11). The
RMSNorm cases' small row (values ~0.015, so h is 1e-3 of them) measures 3e-8, still 30x inside.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.host.reference import grads, ops
from lab.host.reference.kernels import rel_err

H = 1e-5
ORACLE_TOL = 1e-6
MEASURED: dict[str, float] = {}      # case -> error, printed with -s (the report's numbers)


def _agree(name: str, analytic, loss, x) -> None:
    e = rel_err(analytic, grads.numeric_grad(loss, x, H))
    MEASURED[name] = e
    print(f"oracle {name}: {e:.2e}")
    assert e < ORACLE_TOL, f"{name}: oracle differs from central differences by {e:.3g}"


@pytest.mark.parametrize("rows,n,group", [(3, 7, 7), (2, 12, 4), (1, 5, 5)])
def test_rms_norm(rows, n, group):
    rng = np.random.default_rng(rows * 100 + n)
    x = rng.standard_normal((rows, n)) * 1.5
    x[0] *= 0.01                  # a row whose mean square (~2e-4) is near eps: eps's place matters
    w = rng.uniform(0.2, 2.0, group)
    dy = rng.standard_normal((rows, n))
    eps = 1e-4

    def forward(x_, w_):
        return ops.rms_norm(x_.reshape(rows, -1, group), w_, eps).reshape(rows, n)

    dx, dw = grads.rms_norm_grad(x, w, dy, eps, group)
    _agree(f"rms_norm dx {rows}x{n}/{group}", dx, lambda v: np.sum(dy * forward(v, w)), x)
    _agree(f"rms_norm dw {rows}x{n}/{group}", dw, lambda v: np.sum(dy * forward(x, v)), w)


@pytest.mark.parametrize("act", ["swiglu", "geglu"])
def test_glu(act):
    rng = np.random.default_rng(7)
    rows, n = 3, 6
    gu = rng.standard_normal((rows, 2 * n)) * 2.5          # gates over silu's and gelu's curved range
    dh = rng.standard_normal((rows, n))
    fn = ops.silu if act == "swiglu" else ops.gelu_tanh

    def loss(v):
        return np.sum(dh * fn(v[:, :n]) * v[:, n:])

    _agree(f"{act} d[gate|up]", grads.glu_grad(gu, dh, act), loss, gu)


def test_softcap():
    rng = np.random.default_rng(8)
    cap = 3.0
    x = rng.standard_normal((3, 9)) * 4.0                  # across the cap: tanh from linear to saturating
    dy = rng.standard_normal((3, 9))
    _agree("softcap dx", grads.softcap_grad(x, dy, cap), lambda v: np.sum(dy * ops.softcap(v, cap)), x)


def test_embedding_repeated_ids():
    rng = np.random.default_rng(9)
    n_rows, cols, scale = 6, 5, 2.5
    ids = [4, 1, 4, 0, 4, 1]                               # 4 three times, 1 twice; rows 2, 3, 5 never seen
    table = rng.standard_normal((n_rows, cols))
    dy = rng.standard_normal((len(ids), cols))
    de = grads.embed_grad(ids, dy, n_rows, scale)
    _agree("embedding dE", de, lambda v: np.sum(dy * grads.get_rows(v, ids, scale)), table)
    assert not np.any(de[[2, 3, 5]])


def test_a_wrong_derivation_fails():
    """The check has teeth: dx without r's own dependence on x (dy w r alone, the 'normalisation is a constant'
    mistake) is far from central differences."""
    rng = np.random.default_rng(10)
    x, w, dy = rng.standard_normal((2, 6)), rng.uniform(0.5, 2.0, 6), rng.standard_normal((2, 6))
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    wrong = dy * w * r
    e = rel_err(wrong, grads.numeric_grad(lambda v: np.sum(dy * ops.rms_norm(v, w, 1e-5)), x, H))
    assert e > 1e3 * ORACLE_TOL
