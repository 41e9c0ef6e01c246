"""RoPE's backward builder (issue #43, training in the tab; wgsl/backward_rope.wgsl): the gradient of lab.ops.rope's
rotation, which is the rotation by the negative angle, applied in place to gradient rows of Q and K heads, compact or
strided like the forward's fused row. Conventions as lab/ops/backward.py's; lab/host/reference/grads_attention.py
holds the float64 oracle and tests/kernels/test_backward_rope.py checks the kernel against it.
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op
from lab.ops.rope import MODES, checked_rot, frequency_table

WG = 64
PARAMS = struct.Struct("<8I")   # n_head, head_dim, half, row_stride, col_offset, _p0, _p1, _p2


def rope_back(device: gpu.Device, kernels, grad: gpu.Buffer, step: gpu.Buffer, n_head: int, head_dim: int,
              n_rot: int | None = None, freq_base: float = 10000.0, freq_scale: float = 1.0, mode="neox",
              row_stride: int | None = None, col_offset: int = 0, freq_factors=None) -> list[Op]:
    """dx of lab.ops.rope's rotation, in place: `grad` holds dy of the step's t rotated rows (token j at position
    step.pos + j) and is left holding dx. Every argument means what it means to lab.ops.rope (the same frequency
    table: freq_scale multiplies the positions, freq_factors divide theta), so one op over n_head = nh + nkv heads of a
    fused [dq | dk | dv] gradient row (row_stride (nh + 2 nkv) head_dim) turns back Q and K and leaves dV as it is.
    Dims past n_rot pass through; rows past the step are not touched."""
    n_rot = checked_rot("rope_back", mode, head_dim, n_rot)
    row_stride = n_head * head_dim if row_stride is None else int(row_stride)
    if col_offset + n_head * head_dim > row_stride:
        raise ValueError(f"rope_back: {n_head} heads of {head_dim} from column {col_offset} run past the row "
                         f"({row_stride} floats)")
    half = n_rot // 2
    table = frequency_table(device, "rope_back.freqs", n_rot, freq_base, freq_scale, freq_factors)
    params = device.uniform(PARAMS.pack(n_head, head_dim, half, row_stride, col_offset, 0, 0, 0), "rope_back.params")
    entry = MODES[mode].replace("rope_", "rope_back_")
    k = kernels.get("backward_rope", entry, WG=WG)
    gx = -(-(n_head * half) // WG)
    return [Op(k, device.bind(k, [grad, table, params, step], entry), lambda t: (gx, max(1, t), 1))]
