"""The float64 oracle of training's loss (issue #43): the loss of windows under a LoRA adapter, computed by the numpy
reference forward (lab/host/reference/forward.py) in float64 with the adapter applied as llama.cpp applies it
(lab/host/reference/lora.py: W + (alpha / r) B A), and its central differences, which the gradient checker
(lab/host/gradcheck.py) holds the GPU's gradients to.

    oracle = LoraLoss(path, {name: (A [r, n_in], B [n_out, r])}, alpha, masks=None)
    oracle.loss(windows)                    mean over windows and positions t < T-1 of -log p(w[t+1] | w[..t]),
                                            with masks over the t whose w[t+1] is trained (masks[j][t+1]) alone
    oracle.central(windows, name, "A", (i, j), h)     (loss(+h) - loss(-h)) / 2h at one entry

    oracle = ModelLoss(path)                full fine-tuning's: the loss of the model's own weights
    oracle.central(windows, name, index, h)           ... at one entry of a weight (numpy shape: rows first)
"""

from __future__ import annotations

import numpy as np

from lab.host.reference import lora
from lab.host.reference.forward import Reference


def window_loss(ref, windows, masks=None) -> float:
    """The mean over the windows and positions t < T-1 of -log p(w[t+1] | w[..t]) under `ref`'s weights; with masks
    (one flag a token of each window), over the positions whose next token is flagged: the one divisor of all the
    windows' trained tokens, as the GPU's step divides."""
    total, count = 0.0, 0
    for j, w in enumerate(windows):
        # float64 logits: a float32 rounding of logits ~10 (1e-6) over 2h = 2e-4 would be 1e-2 of a gradient
        logits = ref.forward(w, keep_dtype=True)[:-1]
        m = logits.max(axis=1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))[:, 0]
        nll = lse - logits[np.arange(len(w) - 1), np.asarray(w[1:])]
        keep = np.ones(len(w) - 1, bool) if masks is None else np.asarray(masks[j][1:], bool)
        total += float(np.sum(nll[keep]))
        count += int(keep.sum())
    return total / count


class ModelLoss:
    """The loss of a model's own weights in float64, and its central differences at single entries."""

    def __init__(self, path, masks=None) -> None:
        self.ref = Reference(path, dtype=np.float64)
        self.masks = masks

    def loss(self, windows) -> float:
        return window_loss(self.ref, windows, self.masks)

    def central(self, windows, name: str, index: tuple, h: float) -> float:
        """d loss / d weight[index] by central differences with step h (the weight as numpy shapes it)."""
        cache = self.ref.w._cache
        old = self.ref.w.get(name)
        values = []
        for sign in (1.0, -1.0):
            moved = old.copy()
            moved[index] += sign * h
            cache[name] = moved
            values.append(self.loss(windows))
        cache[name] = old
        return (values[0] - values[1]) / (2 * h)


class LoraLoss:
    def __init__(self, path, adapter: dict, alpha: float, masks=None) -> None:
        self.ref = Reference(path, dtype=np.float64)
        self.alpha, self.masks = float(alpha), masks
        self.pairs = {n: (np.array(a, np.float64), np.array(b, np.float64)) for n, (a, b) in adapter.items()}
        lora.apply(self.ref, self.pairs, self.alpha)

    def loss(self, windows) -> float:
        return window_loss(self.ref, windows, self.masks)

    def _update(self, name: str) -> None:
        """The adapted matrix `name` made again from its (changed) factors."""
        w = self.ref.w
        w.deltas[name] = lora.deltas(w.base, {name: self.pairs[name]}, self.alpha)[name]
        w._merged.pop(name, None)

    def central(self, windows, name: str, which: str, index: tuple, h: float) -> float:
        """d loss / d (A or B)[index] by central differences with step h."""
        m = self.pairs[name][0 if which == "A" else 1]
        old = m[index]
        values = []
        for v in (old + h, old - h):
            m[index] = v
            self._update(name)
            values.append(self.loss(windows))
        m[index] = old
        self._update(name)
        return (values[0] - values[1]) / (2 * h)
