"""wgsl/matmul_i8.wgsl with its tensor-core products written out in plain WGSL, for the native adapter.

The int8 GEMM runs only where Chromium offers int8 subgroup matrices (the H200 page). Here its three subgroup-matrix
statements (load 16 tokens x 32 inputs, load 32 x 16 unpacked weights, multiply and store the 16 x 16 int32
product) become one plain function with the same operands, offsets and strides; everything else is the page's
kernel as it is. Used by tests/kernels/test_matmul_i8.py (the kernel cases) and tests/engine/test_int8_prefill.py
(an engine whose prefill takes it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re

from lab.gpu import shaders
from lab.gpu.shaders import KernelCache

# The product the subgroup matrices compute: res[so + 16 m + n] = sum_k xq[lo + m * ls + k] * wq[ro + 32 n + k]
# (int8 elements of i32 words; the left operand row-major with stride ls, the right one column-major with stride
# 32), each of the subgroup's 32 lanes writing elements lid, lid + 32, ...
PRODUCT = """
fn i8_of(w: i32, e: u32) -> i32 {
    return (w << (24u - 8u * (e % 4u))) >> 24u;
}

fn product(lid: u32, lo: u32, ls: u32, ro: u32, so: u32) {
    for (var e = lid; e < 256u; e += 32u) {
        var s = 0i;
        for (var k = 0u; k < 32u; k++) {
            let a = lo + (e / 16u) * ls + k;
            let b = ro + (e % 16u) * 32u + k;
            s += i8_of(xq[a / 4u], a) * i8_of(wq[b / 4u], b);
        }
        res[so + e] = s;
    }
}
"""

# (pattern, replacement, times it must match)
SUBSTITUTIONS = [
    (r"enable chromium_experimental_subgroup_matrix;\n", "", 1),
    (r"enable subgroups;\n", "", 1),
    (r"alias (Left|Right|Res) = [^\n]*\n", "", 3),
    (r"let l = subgroupMatrixLoad<Left>\(&xq, (.+?), false, p\.cols\);", r"let lo = \1;", 1),
    (r"let r = subgroupMatrixLoad<Right>\(&wq, (.+?), true, 32u\);\s*"
     r"subgroupMatrixStore\(&res, (.+?),\s*subgroupMatrixMultiplyAccumulate\(l, r, Res\(\)\), false, 16u\);",
     r"product(lid, lo, p.cols, \1, \2);", 1),
]


def plain(source: str) -> str:
    """matmul_i8.wgsl's source with the subgroup matrices written out (each pattern must match as often as said:
    a kernel edit that moves them fails here, not silently)."""
    for pattern, repl, times in SUBSTITUTIONS:
        source, n = re.subn(pattern, repl, source)
        assert n == times, f"matmul_i8.wgsl: {pattern!r} matched {n} times, not {times}"
    assert "subgroupMatrix" not in source and "subgroup_matrix" not in source
    return source + PRODUCT


class PlainKernels(KernelCache):
    """The engine's pipeline cache, but matmul_i8 built from plain()."""

    def get(self, name: str, entry: str = "main", **consts):
        if name != "matmul_i8":
            return super().get(name, entry, **consts)
        key = (name, entry, tuple(sorted(consts.items())))
        if key not in self._cache:
            label = "matmul_i8 plain" + "".join(f" {a}={b}" for a, b in key[2])
            self._cache[key] = self.device.kernel(plain(shaders.source(name, **consts)), label, entry)
        return self._cache[key]


@contextlib.contextmanager
def int8_adapter(device):
    """The native device, saying it has int8 subgroup matrices (matmul_i8's and the engine's gate) meanwhile."""
    real = device.info
    device.info = dataclasses.replace(real, int8_matrix=True)
    try:
        yield device
    finally:
        device.info = real
