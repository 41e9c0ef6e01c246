"""The depthwise causal conv over a state ring (wgsl/shortconv.wgsl), in two modes, with the layer's conv state read
and written in the same dispatch, for a whole prefill chunk or one decode token alike:
  "gated" (LFM2's short-conv block): y = C * conv(B * x) from the in_proj rows [B | C | x];
  "silu" (Qwen3.5's delta-net layer): y = silu(conv(x)) over the first n floats of each row (its q, k, v channels).

What it does not know: which layer it serves or how far back the engine may step (the caller sizes the ring,
lab/engine/scratch.py), or the projections around it (lab.engine.plans).
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op

WG = 64
PARAMS = struct.Struct("<4I")   # n, stride, _p0, _p1
MODES = {"gated": 0, "silu": 1}  # the shader's MODE constant


def row_stride(mode: str, n: int, stride: int | None, label: str) -> int:
    """The floats between two tokens' conv input rows, checked: mode "gated" reads rows [B | C | x] of 3n, mode
    "silu" rows of `stride` >= n floats whose first n are x (default n). The forward's and the backward's alike."""
    if mode not in MODES:
        raise ValueError(f"{label}: mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "gated" and stride not in (None, 3 * n):
        raise ValueError(f"{label}: the gated mode reads rows [B | C | x] of 3n = {3 * n} floats, not {stride}")
    stride = 3 * n if mode == "gated" else n if stride is None else stride
    if stride < n:
        raise ValueError(f"{label}: rows of {stride} floats cannot hold the {n} channels")
    return stride


def state_bytes(n: int, ring: int) -> int:
    """The conv state of one layer: `ring` rows of n f32 (the conv input of the latest positions, row q % ring)."""
    return 4 * ring * n


def shortconv(device: gpu.Device, kernels, src: gpu.Buffer, weight: gpu.Buffer, state: gpu.Buffer, out: gpu.Buffer,
              step: gpu.Buffer, *, n: int, l_cache: int, ring: int, label: str = "shortconv", mode: str = "gated",
              stride: int | None = None) -> list[Op]:
    """out[t, n] for the step's t tokens at step.pos: mode "gated" C * conv(B * x), src [t, 3n] rows [B | C | x];
    mode "silu" silu(conv(x)), src rows of `stride` >= n floats, x the first n of each. weight [n, l_cache] f32;
    state [ring, n], ring >= l_cache - 1: read for the positions before pos (zero before position 0), then the step's
    last min(t, ring) conv inputs (B*x, or x) written into it."""
    stride = row_stride(mode, n, stride, label)
    if l_cache < 2 or ring < l_cache - 1:
        raise ValueError(f"{label}: l_cache {l_cache} must be at least 2 and the ring {ring} at least l_cache - 1")
    if weight.size < 4 * n * l_cache:
        raise ValueError(f"{label}: the conv weight holds {weight.size} bytes, [{n}, {l_cache}] f32 needs {4 * n * l_cache}")
    if state.size < state_bytes(n, ring):
        raise ValueError(f"{label}: the state holds {state.size} bytes, [{ring}, {n}] f32 needs {state_bytes(n, ring)}")
    if src.size < 4 * stride:
        raise ValueError(f"{label}: src holds {src.size} bytes, less than one row of {stride} f32")
    if out.size < 4 * n:
        raise ValueError(f"{label}: out holds {out.size} bytes, less than one row of {n} f32")
    if out is src or out is state:
        raise ValueError(f"{label}: out must be a buffer of its own")
    k = kernels.get("shortconv", WG=WG, LC=l_cache, RING=ring, MODE=MODES[mode])
    params = device.uniform(PARAMS.pack(n, stride, 0, 0), f"{label}.params")
    bound = device.bind(k, [src, weight, state, out, params, step], label)
    gx = -(-n // WG)
    return [Op(k, bound, lambda t: (gx, 1, 1))]
