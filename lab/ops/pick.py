"""The pick op (wgsl/pick.wgsl): a row of logits reduced to its log-normaliser and a few picked logits, written into
one slot of a results table, so that a sweep of runs is read back once (lab/instruments/experiments.py).

What it does not know: which runs fill the table, or what the picked ids mean.
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op

WG = 256
PARAMS = struct.Struct("<4I")      # Params { n, row, n_pick, out }


def pick(device: gpu.Device, kernels, logits: gpu.Buffer, ids: gpu.Buffer, out: gpu.Buffer, params: gpu.Buffer,
         label: str) -> Op:
    """One workgroup: out[p.out] = logsumexp(logits[p.row .. p.row + n]), out[p.out + 1 + k] = logits[p.row + ids[k]]."""
    k = kernels.get("pick", "pick", WG=WG)
    return Op(k, device.bind(k, [logits, ids, out, params], label), lambda t: (1, 1, 1))
