"""A model's first weights drawn on the GPU (issue #44, a model trained from scratch), wgsl/init.wgsl: `normal` fills
a run of a tensor's elements with mean + std * z, z a standard normal drawn by each element's index within its tensor
and the tensor's key, so that a tensor placed in several buffers (lab.ops.weights: binding-sized parts, stacked runs)
starts the same wherever its pieces lie and whatever the order they are filled in.

    key(seed, stream)      the u32 key of one tensor's draws (stream: the tensor's index in its file)
    normal(device, kernels, buf, n, key=..., first=..., mean=..., std=..., dst=0)   -> [Op]

What it does not know: which tensor gets which mean and std (lab.format.untrained's rule) or where a tensor lies
(lab.ops.weights ModelWeights.initialize). lab/host/reference/init.py draws the same numbers in float64;
tests/kernels/test_init.py holds the kernel to it. No numpy here: it runs in Pyodide.
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op, groups_1d

WG = 256
MAX_ELEMENTS = 1 << 31       # an element's index e draws from hash inputs 2e and 2e + 1, which u32 must hold
_INIT = struct.Struct("<4I2f2I")       # n, key, first, dst, mean, std, _p0, _p1
_MASK = 0xFFFFFFFF


def key(seed: int, stream: int) -> int:
    """The u32 key of stream `stream` (a tensor) under `seed`: pcg(pcg(seed) ^ stream), so neighbouring seeds and
    neighbouring tensors draw unrelated numbers."""
    if not (0 <= seed <= _MASK and 0 <= stream <= _MASK):
        raise ValueError(f"init: seed {seed} and stream {stream} must lie in 0 .. {_MASK}")
    return pcg(pcg(seed) ^ stream)


def pcg(v: int) -> int:
    """The PCG hash (Jarzynski and Olano, 2020) on a u32, as wgsl/init.wgsl computes it."""
    state = (v * 747796405 + 2891336453) & _MASK
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _MASK
    return (word >> 22) ^ word


def normal(device: gpu.Device, kernels, buf: gpu.Buffer, n: int, *, key: int, first: int = 0, mean: float = 0.0,
           std: float = 1.0, dst: int = 0) -> list[Op]:
    """Elements first .. first + n - 1 of a tensor of key `key`, drawn from N(mean, std^2), into `buf` (bound whole)
    from its float `dst` on: one dispatch."""
    if n < 1 or first < 0 or first + n > MAX_ELEMENTS:
        raise ValueError(f"init: elements {first} .. {first + n - 1} must lie in 0 .. {MAX_ELEMENTS - 1}")
    if dst < 0 or 4 * (dst + n) > buf.size:
        raise ValueError(f"init: {n} floats from float {dst} pass the end of {buf.label} ({buf.size} bytes)")
    if not std >= 0:
        raise ValueError(f"init: std {std} must be at least 0")
    k = kernels.get("init", "normal", WG=WG)
    uni = device.uniform(_INIT.pack(n, key & _MASK, first, dst, mean, std, 0, 0), f"{buf.label}.init@{first}")
    grid = groups_1d(n, WG, device.info.limits["max_compute_workgroups_per_dimension"])
    bound = device.bind(k, [buf, uni], f"init {buf.label}@{first}")
    return [Op(k, bound, lambda t, g=grid: g)]
