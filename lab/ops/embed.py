"""Embedding lookup: out[i, :] = scale * W[ids[i], :] dequantized (wgsl/get_rows.wgsl).

One Op per weight part; each handles the ids in its row range and skips the others, so a table
split over several bindings still fills every token's row exactly once.
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.gpu.shaders import KernelCache
from lab.ops import Op, Weight
from lab.ops.weights import dequant_consts

WG = 64
_PARAMS = struct.Struct("<6IfI")   # first_row, n_rows, cols, gpr, row_bytes, out_off, scale, pad


def get_rows(device: gpu.Device, kernels: KernelCache, w: Weight, ids: gpu.Buffer, out: gpu.Buffer,
             step: gpu.Buffer, *, scale: float = 1.0, out_offset: int = 0) -> list[Op]:
    """For the step's t token ids (u32 in `ids`): out[out_offset + i * cols + c] = scale * W[ids[i], c]."""
    k = kernels.get("get_rows", WG=WG, **dequant_consts(w.type))
    gpr = w.cols // 8
    ops = []
    for part in w.parts:
        params = device.uniform(_PARAMS.pack(part.first_row, part.n_rows, w.cols, gpr, w.row_bytes,
                                             out_offset, scale, 0), f"{part.buffer.label}.get_rows")
        bound = device.bind(k, [part.buffer, ids, out, params, step], f"{part.buffer.label}.get_rows")
        gx = -(-gpr // WG)
        ops.append(Op(k, bound, lambda t, gx=gx: (gx, max(1, t), 1)))
    return ops
