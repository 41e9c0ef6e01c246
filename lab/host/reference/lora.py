"""LoRA adapters on the numpy reference (CPython only): an adapter GGUF read with gguf-py (`load`, independently of
lab.format.adapter, which the engine uses), and a `Reference` made to compute with W + s B A for every adapted tensor
(`apply`), s = alpha / r as llama.cpp scales it (src/llama-adapter.h, llama_adapter_lora_weight::get_scale: rank = B's
ne0).

    ref = Reference(model_path, dtype=np.float64)
    lora.apply(ref, adapter_path)            # or apply(ref, {base: (A, B)}, alpha)
    logits = ref.forward(ids)                # the adapted model
    lora.remove(ref)                         # the plain model again

Layout: A is (r, n_in) and B (n_out, r) as numpy arrays (ggml's [n_in, r] and [r, n_out] reversed, as Weights gives
every tensor), so B @ A is (n_out, n_in), the shape Weights gives W, and y = x @ (W + s B A).T.

How: Reference reads every matrix through `ref.w.get` (its _mm, _linear and maybe) and the embedding through
`ref.w.rows`. `apply` puts a `LoraWeights` in ref.w's place: it hands out the model's own Weights for every tensor
but the adapted ones, and for those the merged W + s B A, summed in float64 and then cast to the reference's dtype,
made on first use and cached in the wrapper (the model's Weights keep the plain W in their _cache, so `remove` is
free and nothing is dequantized twice). The merge is the same function as llama.cpp's graph, W x + s B (A x) (it
never merges), up to rounding: in float64 the two orders differ by ~1e-16 relative. Every other attribute (meta,
shape, tensors, ...) is the model's Weights'. The token embedding is refused: llama.cpp adapts it through a flipped
layout of its own (build_inp_embd), which lab.format.adapter refuses too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from lab.host.reference.weights import Weights

Pairs = dict[str, tuple[np.ndarray, np.ndarray]]


def llama_scale(alpha: float, rank: int) -> float:
    """llama.cpp's scale of a pair (get_scale with the adapter's scale 1): alpha / rank, or 1 where alpha is 0."""
    return alpha / rank if alpha else 1.0


def load(path: str | Path) -> tuple[float, Pairs]:
    """(alpha, {base tensor name: (A (r, n_in), B (n_out, r))}) of an adapter file, float64, read with gguf-py."""
    r = GGUFReader(str(path))
    field = r.fields.get("adapter.lora.alpha")
    alpha = float(field.contents()) if field is not None else 0.0
    halves: dict[str, dict[str, np.ndarray]] = {}
    for t in r.tensors:
        base, _, half = t.name.rpartition(".")
        if half not in ("lora_a", "lora_b"):
            continue        # llama.cpp skips *_norm.weight (lab.format.adapter refuses anything else)
        shape = tuple(int(n) for n in reversed(t.shape))
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(shape)
        halves.setdefault(base, {})[half] = a
    return alpha, {base: (h["lora_a"], h["lora_b"]) for base, h in halves.items()}


class LoraWeights:
    """A model's Weights with `deltas` (name -> s B A, float64, the shape of W) added to those tensors."""

    def __init__(self, base: Weights, deltas: dict[str, np.ndarray]):
        self.base = base
        self.deltas = deltas
        self._merged: dict[str, np.ndarray] = {}

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def __contains__(self, name: str) -> bool:
        return name in self.base

    def get(self, name: str) -> np.ndarray:
        if name not in self.deltas:
            return self.base.get(name)
        m = self._merged.get(name)
        if m is None:
            m = (np.asarray(self.base.get(name), dtype=np.float64) + self.deltas[name]).astype(self.base.dtype)
            m.flags.writeable = False
            self._merged[name] = m
        return m

    def rows(self, name: str, idx) -> np.ndarray:
        return self.get(name)[np.asarray(idx, dtype=np.int64)] if name in self.deltas else self.base.rows(name, idx)

    def maybe(self, name: str) -> np.ndarray | None:
        return self.get(name) if name in self.base else None

    def drop(self, name: str | None = None) -> None:
        self.base.drop(name)
        if name is None:
            self._merged.clear()
        else:
            self._merged.pop(name, None)


def deltas(w: Weights, pairs: Pairs, alpha: float,
           scale: Callable[[float, int], float] = llama_scale) -> dict[str, np.ndarray]:
    """{name: scale(alpha, r) * B @ A} in float64, each checked against its base tensor's shape."""
    out = {}
    for name, (a, b) in pairs.items():
        if name not in w:
            raise ValueError(f"lora: the model has no tensor {name}")
        if name == "token_embd.weight":
            raise ValueError("lora: the token embedding's adapter (llama.cpp's flipped layout) is not implemented")
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        rank = b.shape[1]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != rank or (b.shape[0], a.shape[1]) != w.shape(name):
            raise ValueError(f"lora: {name}: A {a.shape} and B {b.shape} do not make B @ A of {w.shape(name)}")
        out[name] = scale(alpha, rank) * (b @ a)
    return out


def apply(ref, adapter: str | Path | Pairs, alpha: float | None = None,
          scale: Callable[[float, int], float] = llama_scale) -> LoraWeights:
    """Make `ref` (a lab.host.reference.Reference) compute with the adapter: a path (alpha from the file unless
    given) or {name: (A, B)} with alpha. Replaces an adapter applied before. scale: (alpha, rank) -> the pair's
    factor (llama.cpp's by default; the tests pass wrong ones to see the fixture catch them). Returns the new ref.w."""
    if isinstance(adapter, (str, Path)):
        file_alpha, pairs = load(adapter)
        alpha = file_alpha if alpha is None else alpha
    else:
        if alpha is None:
            raise ValueError("lora.apply: alpha is needed with pairs given as arrays")
        pairs = adapter
    base = ref.w.base if isinstance(ref.w, LoraWeights) else ref.w
    ref.w = LoraWeights(base, deltas(base, pairs, float(alpha), scale))
    ref.reset()
    return ref.w


def remove(ref) -> None:
    """`ref` back to the plain model."""
    if isinstance(ref.w, LoraWeights):
        ref.w = ref.w.base
        ref.reset()
