"""The float64 oracle of the contrastive loss (issue #44 part 3, lab/instruments/contrastive.py): each window's
embedding by the numpy reference forward (lab/host/reference/forward.py, its final norm's rows, BOS left out,
summed and L2-normalised) under a LoRA adapter applied as llama.cpp applies it, the symmetric InfoNCE over a batch
of pairs, and its central differences, which lab/host/gradcheck.py `check_contrastive` holds the GPU's gradients to.

    oracle = ContrastiveLoss(path, {name: (A, B)}, alpha, bos=1 or None, temperature=0.05)
    oracle.loss(pairs)                        the batch's loss
    oracle.central(pairs, name, "A", (i, j), h)
"""

from __future__ import annotations

import numpy as np

from lab.host.reference.training import LoraLoss


def info_nce(a: np.ndarray, b: np.ndarray, temperature: float) -> float:
    """(mean_i [logsumexp_j S_ij - S_ii] + mean_j [logsumexp_i S_ij - S_jj]) / 2, S = a b^T / temperature."""
    s = a @ b.T / temperature
    def lse(m, axis):
        top = m.max(axis=axis, keepdims=True)
        return (top + np.log(np.exp(m - top).sum(axis=axis, keepdims=True))).squeeze(axis)
    d = np.diag(s)
    return float((np.mean(lse(s, 1) - d) + np.mean(lse(s, 0) - d)) / 2)


class ContrastiveLoss(LoraLoss):
    def __init__(self, path, adapter: dict, alpha: float, bos: int | None, temperature: float) -> None:
        super().__init__(path, adapter, alpha)
        self.bos, self.temperature = bos, temperature

    def embedding(self, ids) -> np.ndarray:
        run = ([self.bos] if self.bos is not None else []) + list(ids)
        rows = self.ref.forward(run, normed=True)[1 if self.bos is not None else 0:]
        p = rows.sum(axis=0)
        return p / np.linalg.norm(p)

    def loss(self, pairs) -> float:
        a = np.stack([self.embedding(x) for x, _ in pairs])
        b = np.stack([self.embedding(y) for _, y in pairs])
        return info_nce(a, b, self.temperature)
