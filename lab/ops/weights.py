"""Weights on the GPU: GGUF blocks copied as they are, split into row ranges that each fit one binding.

A tensor of `rows` x `cols` (GGUF ne1 x ne0) is `rows * row_bytes` bytes, row after row. It is cut
into parts of whole rows, each at most the storage binding limit (greedy: every part but the last
is as full as the limit allows), one buffer per part, each padded to a multiple of 4 bytes.
`placements` is the pure byte-range mapping loaders use (native file reads, browser File.slice).

`KERNEL_TYPES` is the table the WGSL kernels share (wgsl/quant.wgsl): for each supported type, the
dequant function and the HALF of its 8-value groups.
"""

from __future__ import annotations

from .. import gpu
from ..ggml import GgmlType
from . import Weight, WeightPart

# type name -> (dequant function in quant.wgsl, HALF: a group is 4 values at e0 and 4 at e0 + HALF)
KERNEL_TYPES: dict[str, tuple[str, int]] = {
    "F32": ("dq_f32", 4), "F16": ("dq_f16", 4), "BF16": ("dq_bf16", 4), "Q8_0": ("dq_q8_0", 4),
    "Q4_0": ("dq_q4_0", 16), "Q4_1": ("dq_q4_1", 16), "Q5_0": ("dq_q5_0", 16), "Q5_1": ("dq_q5_1", 16),
    "Q4_K": ("dq_q4_k", 32), "Q5_K": ("dq_q5_k", 32), "Q6_K": ("dq_q6_k", 32),
}


def dequant_consts(type: GgmlType) -> dict:
    """The WGSL constants DQ and HALF for `type`, or GpuError naming an unsupported one."""
    try:
        fn, half = KERNEL_TYPES[type.name]
    except KeyError:
        raise gpu.GpuError(f"{type.name} weights are not supported by the kernels "
                           f"(supported: {', '.join(KERNEL_TYPES)})") from None
    return {"DQ": fn, "HALF": half}


def check_cols(type: GgmlType, cols: int, name: str) -> None:
    """Rows must be whole blocks, and whole groups of 8 values (float types: cols % 8 == 0)."""
    type.row_bytes(cols)                     # raises on a partial block
    if cols % 8 or cols <= 0:
        raise ValueError(f"{name}: {cols} columns; the kernels need a positive multiple of 8")


def alloc_weight(device: gpu.Device, name: str, type: GgmlType, rows: int, cols: int,
                 max_binding: int | None = None) -> Weight:
    """Buffers (kind WEIGHTS, zero-filled) for a rows x cols tensor of `type`, split to fit `max_binding`."""
    dequant_consts(type)
    check_cols(type, cols, name)
    if rows <= 0:
        raise ValueError(f"{name}: {rows} rows")
    limit = device.info.limits["max_storage_buffer_binding_size"] if max_binding is None else max_binding
    limit = min(limit, device.info.limits["max_buffer_size"]) & ~3
    row_bytes = type.row_bytes(cols)
    per_part = limit // row_bytes            # whole rows; padding to 4 never passes a 4-aligned limit
    if per_part == 0:
        raise gpu.GpuError(f"{name}: one row is {row_bytes:,} bytes, over this GPU's storage binding "
                           f"limit ({limit:,} bytes)")
    parts = []
    for i, first in enumerate(range(0, rows, per_part)):
        n = min(per_part, rows - first)
        label = name if rows <= per_part else f"{name}[{i}]"
        parts.append(WeightPart(device.buffer(n * row_bytes, gpu.WEIGHTS, label), first, n))
    return Weight(name, type, rows, cols, tuple(parts))


def placements(weight: Weight) -> list[tuple[WeightPart, int, int]]:
    """(part, byte offset in the tensor's data, byte count) for each part, in order."""
    rb = weight.row_bytes
    return [(part, part.first_row * rb, part.n_rows * rb) for part in weight.parts]


def concat_placements(weight: Weight, sources: list[tuple[str, int]]) -> list[tuple[str, int, WeightPart, int, int]]:
    """For a weight whose rows are several tensors' rows one after another (`sources`: (name, rows) in
    order), the copies that fill it: (tensor, byte offset in that tensor, part, byte offset in the part,
    byte count). A part may take rows from two tensors, a tensor may span two parts."""
    rb = weight.row_bytes
    if sum(n for _, n in sources) != weight.rows:
        raise ValueError(f"{weight.name}: sources have {sum(n for _, n in sources)} rows, the weight {weight.rows}")
    out = []
    start = 0
    for name, n in sources:
        lo, hi = start * rb, (start + n) * rb
        for part, p_off, p_size in placements(weight):
            a, b = max(lo, p_off), min(hi, p_off + p_size)
            if a < b:
                out.append((name, a - lo, part, a - p_off, b - a))
        start += n
    return out


def upload_weight(device: gpu.Device, weight: Weight, data) -> None:
    """Copy the tensor's bytes (rows * row_bytes, GGUF layout) into its parts."""
    view = memoryview(data).cast("B")
    if len(view) != weight.rows * weight.row_bytes:
        raise ValueError(f"{weight.name}: {len(view):,} bytes given, {weight.rows * weight.row_bytes:,} expected")
    for part, offset, nbytes in placements(weight):
        chunk = view[offset:offset + nbytes]
        if nbytes % 4:
            chunk = bytes(chunk) + bytes(4 - nbytes % 4)
        device.write(part.buffer, chunk)
