"""The float64 gradient oracle (lab/host/reference/grads.py) against central differences of the ops.py forward, so
the kernels' reference is itself held to the forward's definition and not to a derivation that could share a
kernel's mistake. No device.

Each case draws a random upstream gradient dy and differentiates loss(x) = sum(dy * forward(x)) numerically with
step h = 1e-5: for inputs of order 1 the truncation error is ~h^2 |f'''| ~ 1e-10 and the rounding ~1e-16 |loss| / h
~ 1e-10, far inside the 1e-6 the oracle must meet relative to the gradient's magnitude (measured 1e-11 to 3e-11). The
RMSNorm cases' small row (values ~0.015, so h is 1e-3 of them) measures 3e-8, still 30x inside. The projections'
losses are linear in each input (no truncation error) but sum thousands of products, whose rounding, ~1e-16 of their
magnitudes' sum over 2h, measures up to 2.5e-9 (a Q4_K weight's dW).
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.host.reference import grads, grads_shortconv, ops, quant
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


@pytest.mark.parametrize("name", ["Q4_K", "IQ2_XS", "F32"])
def test_linear(name):
    """dx and dW of y = x W^T, W a quantized tensor dequantized by gguf.quants (quant.dequant): the gradient the
    kernels take through the dequantized values."""
    rng = np.random.default_rng(11)
    W = quant.dequant(quant.random_tensor(name, 5, 256, seed=3), name).astype(np.float64)
    x = rng.standard_normal((3, 256))
    dy = rng.standard_normal((3, 5))
    dx, dw = grads.linear_grad(W, x, dy)
    _agree(f"linear {name} dx", dx, lambda v: np.sum(dy * grads.linear(W, v)), x)
    _agree(f"linear {name} dW", dw, lambda v: np.sum(dy * grads.linear(v, x)), W)


def test_lora():
    """dx, dA, dB of y = x W^T + s (x A^T) B^T, rank 3, a scale other than 1."""
    rng = np.random.default_rng(12)
    n_in, n_out, r, t, s = 8, 5, 3, 4, 0.75
    W, A, B = rng.standard_normal((n_out, n_in)), rng.standard_normal((r, n_in)), rng.standard_normal((n_out, r))
    x, dy = rng.standard_normal((t, n_in)), rng.standard_normal((t, n_out))
    dx, da, db = grads.lora_grad(W, A, B, x, dy, s)
    _agree("lora dx", dx, lambda v: np.sum(dy * grads.lora(W, A, B, v, s)), x)
    _agree("lora dA", da, lambda v: np.sum(dy * grads.lora(W, v, B, x, s)), A)
    _agree("lora dB", db, lambda v: np.sum(dy * grads.lora(W, A, v, x, s)), B)


def test_a_wrong_derivation_fails():
    """The check has teeth: dx without r's own dependence on x (dy w r alone, the 'normalisation is a constant'
    mistake) is far from central differences."""
    rng = np.random.default_rng(10)
    x, w, dy = rng.standard_normal((2, 6)), rng.uniform(0.5, 2.0, 6), rng.standard_normal((2, 6))
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    wrong = dy * w * r
    e = rel_err(wrong, grads.numeric_grad(lambda v: np.sum(dy * ops.rms_norm(v, w, 1e-5)), x, H))
    assert e > 1e3 * ORACLE_TOL


def test_a_wrong_lora_derivation_fails():
    """And for the adapter: dA with the scale left out (dy B where s dy B belongs) is far from central differences."""
    rng = np.random.default_rng(13)
    W, A, B = rng.standard_normal((5, 8)), rng.standard_normal((3, 8)), rng.standard_normal((5, 3))
    x, dy, s = rng.standard_normal((4, 8)), rng.standard_normal((4, 5)), 0.75
    wrong = (dy @ B).T @ x
    e = rel_err(wrong, grads.numeric_grad(lambda v: np.sum(dy * grads.lora(W, v, B, x, s)), A, H))
    assert e > 1e3 * ORACLE_TOL


@pytest.mark.parametrize("t,n,taps", [(6, 4, 3), (2, 3, 3), (5, 2, 4)])
def test_shortconv(t, n, taps):
    """dbcx and dw of LFM2's short conv y = C * conv(B * x) over a window from a zero state (t = 2: every output reaches
    back into the zero rows; taps = 4: Qwen3.5's conv length)."""
    rng = np.random.default_rng(t * 100 + n * 10 + taps)
    bcx, w, dy = rng.standard_normal((t, 3 * n)), rng.standard_normal((n, taps)), rng.standard_normal((t, n))
    dbcx, dw = grads_shortconv.shortconv_grad(bcx, w, dy)
    _agree(f"shortconv dbcx t={t} n={n} taps={taps}", dbcx,
           lambda v: np.sum(dy * grads_shortconv.shortconv(v, w)), bcx)
    _agree(f"shortconv dw t={t} n={n} taps={taps}", dw, lambda v: np.sum(dy * grads_shortconv.shortconv(bcx, v)), w)


def test_a_wrong_shortconv_derivation_fails():
    """And for the short conv: dB taken as if the conv were the identity (du = dy C, the taps forgotten) is far from
    central differences."""
    rng = np.random.default_rng(14)
    bcx, w, dy = rng.standard_normal((5, 9)), rng.standard_normal((3, 3)), rng.standard_normal((5, 3))
    b, c, x = grads_shortconv.split(bcx)
    right, _ = grads_shortconv.shortconv_grad(bcx, w, dy)
    wrong = right.copy()
    wrong[:, :3] = dy * c * x
    e = rel_err(wrong, grads.numeric_grad(lambda v: np.sum(dy * grads_shortconv.shortconv(v, w)), bcx, H))
    assert e > 1e3 * ORACLE_TOL
