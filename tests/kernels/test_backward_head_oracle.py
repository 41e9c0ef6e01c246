"""The fused head's float64 oracle (lab/host/reference/grads_head.py) against central differences of its own forward
(`head_loss`), so that the kernels' reference is held to the loss's definition, not to a derivation that could share
a kernel's mistake. No device.

loss(xn) and loss(W) are smooth (a log-sum-exp of linear or tanh-capped logits), so with h = 1e-5 and values of
order 1 the truncation error is ~h^2 |f'''| ~ 1e-10 and the rounding ~1e-16 |loss| / h ~ 1e-11; the oracle must
agree within 1e-6 of the gradient's largest value (grads.py's ORACLE_TOL). Cases: with and without the soft-cap
(logits across it), rows without a target, rows_total (the step's divisor), a target in the first and last rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.host.reference.grads import numeric_grad
from lab.host.reference.grads_head import NO_TARGET, head_grad, head_loss
from lab.host.reference.kernels import rel_err

H = 1e-5
ORACLE_TOL = 1e-6
MEASURED: dict[str, float] = {}


def _agree(name: str, analytic, loss, x) -> None:
    e = rel_err(analytic, numeric_grad(loss, x, H))
    MEASURED[name] = e
    print(f"oracle {name}: {e:.2e}")
    assert e < ORACLE_TOL, f"{name}: oracle differs from central differences by {e:.3g}"


@pytest.mark.parametrize("cap,rows_total", [(0.0, None), (2.5, None), (0.0, 9), (2.5, 7)])
def test_head_ce(cap, rows_total):
    rng = np.random.default_rng(int(cap * 10) + (rows_total or 0))
    vocab, cols = 11, 5
    w = rng.standard_normal((vocab, cols))
    xn = rng.standard_normal((4, cols)) * 1.5              # logits ~ +-4: across the cap of 2.5
    targets = [10, NO_TARGET, 0, 3]
    g = head_grad(w, xn, targets, cap, rows_total)

    def by_x(v):
        return head_loss(w, v, targets, cap, rows_total)["loss"]

    def by_w(v):
        return head_loss(v, xn, targets, cap, rows_total)["loss"]

    what = f"cap={cap} rows_total={rows_total}"
    _agree(f"head dxn {what}", g["dxn"], by_x, xn)
    _agree(f"head dW {what}", g["dw"], by_w, w)
    assert not np.any(g["dxn"][1]) and not np.any(g["dz"][1])     # the row without a target has no gradient


def test_loss_values():
    """The loss itself against a direct sum: nll = -log softmax(l)[target], the mean over the rows with a target."""
    rng = np.random.default_rng(3)
    w, xn = rng.standard_normal((7, 3)), rng.standard_normal((3, 3))
    targets = [6, 2, 7]                                    # 7 >= n_vocab: no target
    f = head_loss(w, xn, targets)
    logits = xn @ w.T
    prob = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    want = [-np.log(prob[0, 6]), -np.log(prob[1, 2])]
    assert np.allclose(f["nll"], want + [0.0], rtol=1e-13, atol=0)
    assert f["n"] == 2 and abs(f["loss"] - np.mean(want)) < 1e-13
