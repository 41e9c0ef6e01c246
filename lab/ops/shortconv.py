"""LFM2's short-conv op (wgsl/shortconv.wgsl): y = C * conv(B * x) from the in_proj rows [B | C | x], with the
layer's conv state read and written in the same dispatch, for a whole prefill chunk or one decode token alike.

What it does not know: which layer it serves or how far back the engine may step (the caller sizes the ring,
lab/engine/scratch.py), or the projections around it (lab.engine.plans).
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op

WG = 64
PARAMS = struct.Struct("<4I")   # n, stride, _p0, _p1


def state_bytes(n: int, ring: int) -> int:
    """The conv state of one layer: `ring` rows of n f32 (B*x of the latest positions, row q % ring)."""
    return 4 * ring * n


def shortconv(device: gpu.Device, kernels, bcx: gpu.Buffer, weight: gpu.Buffer, state: gpu.Buffer, out: gpu.Buffer,
              step: gpu.Buffer, *, n: int, l_cache: int, ring: int, label: str = "shortconv") -> list[Op]:
    """out[t, n] = C * conv(B * x) for the step's t tokens at step.pos; bcx [t, 3n] rows [B | C | x]; weight [n,
    l_cache] f32; state [ring, n], ring >= l_cache - 1: read for the positions before pos (zero before position 0),
    then the step's last min(t, ring) B*x rows written into it."""
    if l_cache < 2 or ring < l_cache - 1:
        raise ValueError(f"{label}: l_cache {l_cache} must be at least 2 and the ring {ring} at least l_cache - 1")
    if weight.size < 4 * n * l_cache:
        raise ValueError(f"{label}: the conv weight holds {weight.size} bytes, [{n}, {l_cache}] f32 needs {4 * n * l_cache}")
    if state.size < state_bytes(n, ring):
        raise ValueError(f"{label}: the state holds {state.size} bytes, [{ring}, {n}] f32 needs {state_bytes(n, ring)}")
    if out is bcx or out is state:
        raise ValueError(f"{label}: out must be a buffer of its own")
    k = kernels.get("shortconv", WG=WG, LC=l_cache, RING=ring)
    params = device.uniform(PARAMS.pack(n, 3 * n, 0, 0), f"{label}.params")
    bound = device.bind(k, [bcx, weight, state, out, params, step], label)
    gx = -(-n // WG)
    return [Op(k, bound, lambda t: (gx, 1, 1))]
