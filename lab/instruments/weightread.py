"""Read a byte range of one file tensor back from the GPU buffers it was uploaded into (tests: the large-file
test compares what landed on the GPU with the file, tensor by tensor, past 2 and 4 GB, through the worker's
weight-bytes message: lab/worker/hooks.py).

A tensor may be split over several buffers (row ranges, lab.ops.weights) or stacked with others into one
(qkv, gate|up): `ModelWeights.uploads` records every file range and where it went, so the bytes of tensor
offset [a, b) are found range by range. It reads only; it knows nothing of what the bytes mean.
"""

from __future__ import annotations


async def tensor_bytes(device, weights, name: str, offset: int, size: int) -> bytes:
    """Bytes [offset, offset + size) of tensor `name` as the file holds them, read from the GPU.
    Offsets and sizes are multiples of 4 (a buffer read's rule)."""
    t = weights.tensors.get(name)
    if t is None:
        raise KeyError(f"no tensor {name!r} in the loaded model")
    if offset % 4 or size % 4 or offset < 0 or size <= 0 or offset + size > t.nbytes:
        raise ValueError(f"{name}: range [{offset}, {offset + size}) is not 4-aligned inside its {t.nbytes} bytes")
    out = bytearray(size)
    covered = 0
    for u in weights.uploads:
        if u.tensor != name:
            continue
        rel = u.file_offset - t.offset               # where this upload starts within the tensor
        a, b = max(offset, rel), min(offset + size, rel + u.size)
        if a >= b:
            continue
        lo, hi = a & ~3, (b + 3) & ~3                # an upload of a size not a multiple of 4 was padded
        raw = await device.read(u.buffer, u.buffer_offset + (lo - rel), hi - lo)
        out[a - offset:b - offset] = raw[a - lo:b - lo]
        covered += b - a
    if covered != size:
        raise ValueError(f"{name}: only {covered} of the {size} bytes asked for were uploaded")
    return bytes(out)

