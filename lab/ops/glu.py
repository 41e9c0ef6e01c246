"""Gated-linear-unit builder (wgsl/glu.wgsl): SwiGLU (llama, Qwen, SmolLM) and GeGLU with tanh GELU (Gemma)."""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op

WG = 64
PARAMS = struct.Struct("<8I")   # n, gate_stride, gate_offset, up_stride, up_offset, out_stride, _p0, _p1
ACTS = ("swiglu", "geglu")


def glu(device: gpu.Device, kernels, gate: gpu.Buffer, up: gpu.Buffer | None, out: gpu.Buffer,
        step: gpu.Buffer, n: int, act: str = "swiglu", up_stride: int | None = None, up_offset: int = 0) -> list[Op]:
    """out[t, n] = act(gate) * up, act = silu ("swiglu") or tanh-approximated gelu ("geglu").

    up=None: `gate` is one fused [t, 2n] buffer whose rows are [gate (n) | up (n)], as a single matvec over
    the concatenated gate and up weights writes it. Otherwise gate and up are separate [t, n] buffers.
    `out` is compact [t, n] and must be a buffer other than the inputs. up_stride / up_offset (floats): a separate
    `up` read as a slice of wider rows (gemma4's per-layer input: layer il's slice of [t, n_layer x n])."""
    if act not in ACTS:
        raise ValueError(f"glu: unknown activation {act!r} ({', '.join(ACTS)})")
    if out is gate or out is up:
        raise ValueError("glu: out must not be an input buffer")
    if up is None:
        up, strides = gate, (2 * n, 0, 2 * n, n)
    else:
        strides = (n, 0, n if up_stride is None else int(up_stride), int(up_offset))
    params = device.uniform(PARAMS.pack(n, *strides, n, 0, 0), f"{act}.params")
    k = kernels.get("glu", act, WG=WG)
    bound = device.bind(k, [gate, up, out, params, step], act)
    gx = -(-n // WG)
    return [Op(k, bound, lambda t: (gx, max(1, t), 1))]
