"""The float64 oracle of training's loss (issue #43): the loss of windows under a LoRA adapter, computed by the numpy
reference forward (lab/host/reference/forward.py) in float64 with each adapted matrix replaced by W + (alpha / r) B A,
and its central differences, which the gradient checker (lab/host/gradcheck.py) holds the GPU's gradients to.

    oracle = LoraLoss(path, {name: (A [r, n_in], B [n_out, r])}, alpha)
    oracle.loss(windows)                    mean over windows and positions t < T-1 of -log p(w[t+1] | w[..t])
    oracle.central(windows, name, "A", (i, j), h)     (loss(+h) - loss(-h)) / 2h at one entry
"""

from __future__ import annotations

import numpy as np

from lab.host.reference.forward import Reference


class LoraLoss:
    def __init__(self, path, adapter: dict, alpha: float) -> None:
        self.ref = Reference(path, dtype=np.float64)
        self.alpha = float(alpha)
        self.adapter = {n: (np.array(a, np.float64), np.array(b, np.float64)) for n, (a, b) in adapter.items()}
        self.base = {n: np.array(self.ref.w.get(n), np.float64) for n in self.adapter}
        for n in self.adapter:
            self._apply(n)

    def _apply(self, name: str) -> None:
        """The reference reads `name` from its cache of dequantized weights: put the adapted matrix there."""
        a, b = self.adapter[name]
        self.ref.w._cache[name] = self.base[name] + (self.alpha / a.shape[0]) * (b @ a)

    def loss(self, windows) -> float:
        total, count = 0.0, 0
        for w in windows:
            logits = self.ref.forward(w, keep_dtype=True)[:-1]
            m = logits.max(axis=1, keepdims=True)
            lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))[:, 0]
            total += float(np.sum(lse - logits[np.arange(len(w) - 1), np.asarray(w[1:])]))
            count += len(w) - 1
        return total / count

    def central(self, windows, name: str, which: str, index: tuple, h: float) -> float:
        """d loss / d (A or B)[index] by central differences with step h."""
        m = self.adapter[name][0 if which == "A" else 1]
        old = m[index]
        values = []
        for v in (old + h, old - h):
            m[index] = v
            self._apply(name)
            values.append(self.loss(windows))
        m[index] = old
        self._apply(name)
        return (values[0] - values[1]) / (2 * h)
