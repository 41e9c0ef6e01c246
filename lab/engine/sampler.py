"""Token sampling from the candidates the GPU's top-k kernel read back (at most `MAX_CANDIDATES`).

Greedy never gets here: the GPU's argmax gives the token. Otherwise the chain is llama.cpp's default
order: top-k, top-p, min-p, temperature, then a draw. The random numbers come from our own PCG32,
so the same seed gives the same tokens on CPython and in Pyodide.

What it does not know: logits outside the candidate list. With top-k off, sampling still sees only
the `MAX_CANDIDATES` most likely tokens; their tail mass is what it leaves out.
"""

from __future__ import annotations

import math

from lab.ops.sample import NONE  # "no token", the kernels' empty slot
from lab.settings import Settings

_MASK64 = (1 << 64) - 1


class Pcg32:
    """PCG-XSH-RR 32 (O'Neill); integers only, so identical on every Python."""

    def __init__(self, seed: int) -> None:
        self.state = 0
        self.inc = ((seed * 2) | 1) & _MASK64
        self.next_u32()
        self.state = (self.state + (seed & _MASK64)) & _MASK64
        self.next_u32()

    def next_u32(self) -> int:
        old = self.state
        self.state = (old * 6364136223846793005 + self.inc) & _MASK64
        xorshifted = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xorshifted >> rot) | (xorshifted << ((-rot) & 31))) & 0xFFFFFFFF

    def uniform(self) -> float:
        """A float in [0, 1) with 53 random bits."""
        hi, lo = self.next_u32() >> 5, self.next_u32() >> 6
        return (hi * 67108864 + lo) / 9007199254740992.0


class Sampler:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings.check()
        self.rng = Pcg32(settings.seed)

    def pick(self, candidates: list[tuple[int, float]]) -> int:
        """candidates: (token id, logit), sorted by logit descending (ties by lower id). Returns NONE (the kernels'
        empty slot, 0xFFFFFFFF) when no candidate has a finite logit: a NaN or infinity never becomes a token."""
        s = self.settings
        candidates = [(i, v) for i, v in candidates if math.isfinite(v)]
        if not candidates:
            return NONE
        if s.greedy or s.temperature == 0:
            return candidates[0][0]
        cands = candidates[: s.candidates]
        # top-p and min-p on the untempered distribution, as llama.cpp's chain orders them.
        probs = _softmax([lg for _, lg in cands])
        if s.top_p < 1:
            acc, keep = 0.0, 0
            for p in probs:
                acc += p
                keep += 1
                if acc >= s.top_p:
                    break
            cands, probs = cands[:keep], probs[:keep]
        if s.min_p > 0:
            floor = probs[0] * s.min_p
            keep = max(1, sum(1 for p in probs if p >= floor))
            cands = cands[:keep]
        probs = _softmax([lg / s.temperature for _, lg in cands])
        r = self.rng.uniform()
        acc = 0.0
        for (tok, _), p in zip(cands, probs):
            acc += p
            if r < acc:
                return tok
        return cands[-1][0]


def _softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    z = sum(e)
    return [v / z for v in e]
