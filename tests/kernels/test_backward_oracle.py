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

from lab.host.reference import grads, grads_deltanet, grads_shortconv, ops, quant
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


def _delta_case(t: int, nk: int, nv: int, S: int, seed: int, past_20: bool = False):
    """A delta-net window's inputs: proj rows [q k v | z | beta | alpha] (q k v unread here), the conv's output, the
    gates' parameters and dy; `past_20`: some alpha + dt_bias past softplus's threshold (its identity branch)."""
    rng = np.random.default_rng(seed)
    K, V = nk * S, nv * S
    C = 2 * K + V
    sh = grads_deltanet.Shape(nk, nv, S, C, C + V, C + V + nv, 1e-6)
    proj = rng.standard_normal((t, C + V + 2 * nv))
    conv = ops.silu(rng.standard_normal((t, C)) * 1.5)
    dt, a = rng.standard_normal(nv), -np.exp(0.5 * rng.standard_normal(nv))
    if past_20:
        proj[::2, sh.alpha_offset] = 24.0 + rng.standard_normal(len(proj[::2]))
    return sh, proj, conv, dt, a, rng.uniform(0.5, 1.5, S), rng.standard_normal((t, V))


@pytest.mark.parametrize("t,nk,nv,S,past_20", [(5, 2, 4, 4, False), (3, 1, 3, 4, True), (6, 1, 1, 3, False)])
def test_deltanet(t, nk, nv, S, past_20):
    """Every gradient of the gated delta-net layer between its conv and ssm_out, over a window from a zero state: the
    z, beta and alpha columns of the projection row, the conv's q, k (L2-normed, shared by nv / nk value heads) and
    v, dt's bias, A, the gated norm's weight; past_20: softplus's identity branch."""
    sh, proj, conv, dt, a, w, dy = _delta_case(t, nk, nv, S, t * 100 + nv, past_20)
    got = grads_deltanet.deltanet_grad(proj, conv, dt, a, w, dy, sh)
    f = grads_deltanet.deltanet
    what = f"deltanet t={t} nk={nk} nv={nv} S={S}"
    _agree(f"{what} dproj", got.dproj, lambda v: np.sum(dy * f(v, conv, dt, a, w, sh)), proj)
    _agree(f"{what} dconv", got.dconv, lambda v: np.sum(dy * f(proj, v, dt, a, w, sh)), conv)
    _agree(f"{what} ddt", got.ddt, lambda v: np.sum(dy * f(proj, conv, v, a, w, sh)), dt)
    _agree(f"{what} dA", got.da, lambda v: np.sum(dy * f(proj, conv, dt, v, w, sh)), a)
    _agree(f"{what} dnorm_w", got.dnorm_w, lambda v: np.sum(dy * f(proj, conv, dt, a, v, sh)), w)


def test_a_wrong_deltanet_derivation_fails():
    """And for the delta-net: the state's gradient not carried back to the tokens before (each token's dS from its own
    read-out alone) is far from central differences at the conv's inputs."""
    sh, proj, conv, dt, a, w, dy = _delta_case(5, 2, 4, 4, 15)
    right = grads_deltanet.deltanet_grad(proj, conv, dt, a, w, dy, sh).dconv
    last = grads_deltanet.deltanet_grad(proj[-1:], conv[-1:], dt, a, w, dy[-1:], sh).dconv
    wrong = right.copy()
    wrong[-1] = last[0]                 # the last token alone is right without the carry: a one-token window's
    wrong[:-1] = np.stack([grads_deltanet.deltanet_grad(proj[j:j + 1], conv[j:j + 1], dt, a, w, dy[j:j + 1],
                                                        sh).dconv[0] for j in range(4)])
    e = rel_err(wrong, grads.numeric_grad(lambda v: np.sum(dy * grads_deltanet.deltanet(proj, v, dt, a, w, sh)),
                                          conv, H))
    assert e > 1e3 * ORACLE_TOL


@pytest.mark.parametrize("t,n,taps", [(6, 4, 4), (2, 3, 4), (5, 2, 3)])
def test_conv_silu(t, n, taps):
    """dx and dw of Qwen3.5's conv y = silu(conv(x)) over a window from a zero state (t = 2: every output reaches back
    into the zero rows)."""
    rng = np.random.default_rng(t * 100 + n * 10 + taps + 7)
    x, w, dy = rng.standard_normal((t, n)), rng.standard_normal((n, taps)), rng.standard_normal((t, n))
    dx, dw = grads_deltanet.conv_silu_grad(x, w, dy)
    _agree(f"conv_silu dx t={t} n={n} taps={taps}", dx, lambda v: np.sum(dy * grads_deltanet.conv_silu(v, w)), x)
    _agree(f"conv_silu dw t={t} n={n} taps={taps}", dw, lambda v: np.sum(dy * grads_deltanet.conv_silu(x, v)), w)


def test_sigmoid_gate():
    """dx and dg of qwen35's attention output gate y = x sigmoid(g)."""
    rng = np.random.default_rng(16)
    x, g, dy = rng.standard_normal((3, 7)) * 2.0, rng.standard_normal((3, 7)) * 3.0, rng.standard_normal((3, 7))
    dx, dg = grads.sigmoid_gate_grad(x, g, dy)
    _agree("sigmoid_gate dx", dx, lambda v: np.sum(dy * grads.sigmoid_gate(v, g)), x)
    _agree("sigmoid_gate dg", dg, lambda v: np.sum(dy * grads.sigmoid_gate(x, v)), g)
