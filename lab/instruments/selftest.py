"""A GPU self-test: one kernel from wgsl/ run through lab.gpu, checked against plain Python.

Used by the page (shown in `gpu-selftest`) and by tests on both backends; it proves the whole
path: WGSL loading, pipeline creation, buffers, one compute pass, an asynchronous read.
"""

from __future__ import annotations

import math
import random
import struct

from lab import gpu
from lab.gpu.shaders import KernelCache

WG = 64


async def run(device: gpu.Device, n: int = 1000, seed: int = 1) -> dict:
    rng = random.Random(seed)
    a = [rng.uniform(-4, 4) for _ in range(n)]
    b = [rng.uniform(-4, 4) for _ in range(n)]
    scale = 0.37
    # f32 rounding of inputs first, so the expected value is what the GPU can represent.
    a = list(struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *a)))
    b = list(struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *b)))
    expected = [x + scale * y for x, y in zip(a, b)]

    kernels = KernelCache(device)
    ba = device.buffer(4 * n, gpu.CONSTANT, "selftest.a")
    bb = device.buffer(4 * n, gpu.CONSTANT, "selftest.b")
    bo = device.buffer(4 * n, gpu.CONSTANT, "selftest.out")
    params = device.uniform(struct.pack("<If", n, scale), "selftest.params")
    try:
        device.write(ba, struct.pack(f"<{n}f", *a))
        device.write(bb, struct.pack(f"<{n}f", *b))
        k = kernels.get("elementwise", "scale_add", WG=WG)
        bound = device.bind(k, [ba, bb, bo, params], "selftest")
        device.run([gpu.Dispatch(k, bound, ((n + WG - 1) // WG, 1, 1))])
        got = struct.unpack(f"<{n}f", await device.read(bo))
    finally:
        for buf in (ba, bb, bo, params):
            device.destroy(buf)
    # One f32 multiply-add: error within a few ulps of the result's magnitude.
    worst = max(abs(g - e) / max(1.0, abs(e)) for g, e in zip(got, expected))
    return {"kernel": "elementwise.scale_add", "n": n, "max_rel_err": worst,
            "ok": worst < 1e-6 and all(math.isfinite(g) for g in got),
            "sample": {"got": got[7], "expected": expected[7]}}
