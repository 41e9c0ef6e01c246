"""Embedding pooling and cosine scores (wgsl/retrieval.wgsl), the retrieval index's two kernels
(lab/instruments/retrieval.py strings them after the engine's plan up to its final norm).

- `pool`: row `slot` of a table = the sum of a step's rows from position `first` on (added to the row when the window
  continues an earlier step), L2-normalised after the window's last step: the mean's direction (1/n cancels).
- `score`: scores[r, i] = queries[r] . table[i] for the step's t query rows, -inf past the rows the table holds.

Both read their per-call values (slot, first, flags; the table's filled rows) from a CONVERSATION uniform the caller
rewrites with each run: `POOL` and `SCORES` pack them.
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.gpu.shaders import subgroup_consts
from lab.ops import Op

WG = 64
POOL = struct.Struct("<4I")      # Pool { n_embd, first, slot, flags }
SCORES = struct.Struct("<4I")    # Scores { n, n_embd, ready, neg_inf }
NEG_INF = 0xFF800000             # -inf as bits: WGSL refuses an infinite constant
ADD = 1                          # flags: add to the row (a window's later step) instead of overwriting it
NORMALIZE = 2                    # flags: L2-normalise the row after adding (the window's last step)


def pool(device: gpu.Device, kernels, xn: gpu.Buffer, table: gpu.Buffer, step: gpu.Buffer, params: gpu.Buffer,
         label: str) -> Op:
    """One workgroup pools the step's rows of xn ([t, n_embd]) into a row of `table`, as `params` (POOL) says."""
    k = kernels.get("retrieval", "pool", WG=WG, **subgroup_consts(device))
    return Op(k, device.bind(k, [xn, table, step, params], label), lambda t: (1, 1, 1))


def score(device: gpu.Device, kernels, table: gpu.Buffer, queries: gpu.Buffer, scores: gpu.Buffer,
          step: gpu.Buffer, params: gpu.Buffer, n: int, label: str) -> Op:
    """scores [t, n] of the step's t query rows against the n rows of table; `params` is SCORES."""
    k = kernels.get("retrieval", "score", WG=WG, **subgroup_consts(device))
    return Op(k, device.bind(k, [table, queries, scores, step, params], label),
              lambda t, g=-(-n // WG): (g, max(1, t), 1))
