"""The intervention op (wgsl/intervene.wgsl): zero, set, add to or scale a block of columns of an activation's rows at
a range of positions, in place, right after the op that completes it (lab/instruments/interventions.py places it).

What it does not know: which activation it changes, or why (the experiments' code says).
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op, groups_1d

WG = 64
PARAMS = struct.Struct("<7If")      # Params { stride, c0, c1, r0, r1, op, vec, scale }
OPS = {"zero": 0, "set": 1, "add": 2, "scale": 3}
LOAD = 4                            # rows from a table, one per position (a resumed run's residual)


def intervene(device: gpu.Device, kernels, x: gpu.Buffer, vals: gpu.Buffer, step: gpu.Buffer, params: gpu.Buffer,
              stride: int, label: str) -> Op:
    """One op over the step's rows of x ([t, stride]); `params` (PARAMS) says the block, the positions and what to do."""
    k = kernels.get("intervene", "intervene", WG=WG)
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    return Op(k, device.bind(k, [x, vals, step, params], label),
              lambda t: groups_1d(max(1, t) * stride, WG, max_dim))
