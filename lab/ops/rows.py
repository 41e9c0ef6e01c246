"""Row selection of the row-wise ops that take a `rows` argument (softmax, argmax, top-k): which rows of a
[t, n] input a step covers, as one value, `Rows`, that the builders pack into their uniforms and grids.

Python owns the mode numbers: wgsl/rows.wgsl declares them as `{{ROWS_FIXED}}` etc. and the builders fill
them from `WGSL`, so the kernels and `Rows.at` cannot disagree. This module knows nothing about what a row
holds (logits, probabilities) or how a kernel reduces it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The modes as the kernels compare them (Params.mode).
ROWS_FIXED = 0      # rows 0..count-1, whatever the step
ROWS_TOKENS = 1     # one row per token of the step, at most count
ROWS_LAST = 2       # one row: the step's last token's (read from row n_tokens-1)
UNCAPPED = 0xFFFFFFFF   # ROWS_TOKENS count without a cap
WGSL = {"ROWS_FIXED": ROWS_FIXED, "ROWS_TOKENS": ROWS_TOKENS, "ROWS_LAST": ROWS_LAST}   # for wgsl/rows.wgsl


@dataclass(frozen=True)
class Rows:
    """Which rows an op handles in a step. Make one with `fixed`, `per_token` or `last`."""
    mode: int       # ROWS_FIXED | ROWS_TOKENS | ROWS_LAST
    count: int      # FIXED: the rows; TOKENS: the most rows a step may have (UNCAPPED: no cap); LAST: 1

    @classmethod
    def fixed(cls, n: int) -> Rows:
        """Rows 0..n-1, whatever the step (e.g. decode's one row of logits)."""
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"Rows.fixed: n must be a positive int, not {n!r}")
        return cls(ROWS_FIXED, n)

    @classmethod
    def per_token(cls, max_rows: int | None = None) -> Rows:
        """One row per token of the step, at most max_rows (the capacity of a scratch sized for them)."""
        if max_rows is None:
            return cls(ROWS_TOKENS, UNCAPPED)
        if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows <= 0:
            raise ValueError(f"Rows.per_token: max_rows must be a positive int or None, not {max_rows!r}")
        return cls(ROWS_TOKENS, max_rows)

    @classmethod
    def last(cls) -> Rows:
        """Only the step's last token's row (row n_tokens-1), handled as row 0."""
        return cls(ROWS_LAST, 1)

    @property
    def capped(self) -> bool:
        """Whether the count bounds the rows of every step (false only for an uncapped per_token)."""
        return self.count != UNCAPPED

    def at(self, t: int) -> int:
        """How many rows the op handles in a step of t tokens."""
        if self.mode == ROWS_TOKENS:
            return max(0, min(t, self.count))
        if self.mode == ROWS_LAST:
            return 1 if t > 0 else 0
        return self.count



def check(rows) -> None:
    if not isinstance(rows, Rows):
        raise ValueError(f"rows must be a Rows (Rows.fixed(n), Rows.per_token(max_rows), Rows.last()), not {rows!r}")
