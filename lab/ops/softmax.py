"""Row softmax builder (wgsl/softmax.wgsl), e.g. probabilities of the step's logits."""

from __future__ import annotations

import struct

from lab import gpu
from lab.gpu.shaders import subgroup_consts
from lab.ops import Op
from lab.ops.rows import WGSL as ROWS_WGSL
from lab.ops.rows import Rows
from lab.ops.rows import check as check_rows

WG = 256
PARAMS = struct.Struct("<IIIf")   # n, rows, mode, scale


def softmax(device: gpu.Device, kernels, x: gpu.Buffer, y: gpu.Buffer, step: gpu.Buffer, n: int,
            rows: Rows = Rows.per_token(), scale: float = 1.0) -> list[Op]:
    """y = softmax(scale * x) over rows of n floats; `y is x` runs in place.

    rows: Rows.per_token() (default: one row per token of the step), Rows.fixed(n) (that many rows whatever the
    step) or Rows.last() (only the step's last token's row, read from row n_tokens-1 and written to row 0 of y,
    or in place)."""
    check_rows(rows)
    inplace = y is x
    k = kernels.get("softmax", "softmax", WG=WG, SRC="y" if inplace else "x", INPLACE=inplace,
                    **ROWS_WGSL, **subgroup_consts(device))
    params = device.uniform(PARAMS.pack(n, rows.count, rows.mode, float(scale)), "softmax.params")
    res = [y, params, step] + ([] if inplace else [x])
    bound = device.bind(k, res, "softmax" + (" in place" if inplace else ""))
    return [Op(k, bound, lambda t: (max(1, rows.at(t)), 1, 1))]
