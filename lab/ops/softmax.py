"""Row softmax builder (wgsl/softmax.wgsl), e.g. probabilities of the step's logits."""

from __future__ import annotations

import struct

from .. import gpu
from . import Op
from .elementwise import row_mode, rows_at, subgroup_consts

WG = 256
PARAMS = struct.Struct("<IIIf")   # n, rows, mode, scale


def softmax(device: gpu.Device, kernels, x: gpu.Buffer, y: gpu.Buffer, step: gpu.Buffer, n: int,
            rows=None, scale: float = 1.0) -> list[Op]:
    """y = softmax(scale * x) over rows of n floats; `y is x` runs in place.

    rows=None: one row per token of the step; an int: that many rows whatever the step; "last": only the
    step's last token's row (read from row n_tokens-1, written to row 0 of y, or in place)."""
    mode, count = row_mode(rows)
    inplace = y is x
    k = kernels.get("softmax", "softmax", WG=WG, SRC="y" if inplace else "x", INPLACE=inplace,
                    **subgroup_consts(device))
    params = device.uniform(PARAMS.pack(n, count, mode, float(scale)), "softmax.params")
    res = [y, params, step] + ([] if inplace else [x])
    bound = device.bind(k, res, "softmax" + (" in place" if inplace else ""))
    return [Op(k, bound, lambda t: (max(1, rows_at(mode, count, t)), 1, 1))]
