"""Projections: y = W x with the weights dequantized in the kernel (wgsl/matvec.wgsl, wgsl/matmul.wgsl).

`matvec` is the decode path (one token), `matmul` the prefill path (t tokens from the step buffer).
Both return one Op per weight part; each part writes its own row range of y. `accumulate=True` adds
into y instead of overwriting it (residual adds folded into the projection).
"""

from __future__ import annotations

import struct

from .. import gpu
from ..shaders import KernelCache
from . import Op, Weight, groups_1d
from .weights import dequant_consts

MATVEC_ROWS = 4          # rows per matvec workgroup (vec4 accumulator in the kernel)
MATMUL_TR, MATMUL_TT = 32, 16   # rows x tokens per matmul workgroup (tile sizes fixed in the kernel)

_MATVEC = struct.Struct("<8I")          # n_rows, cols, gpr, row_bytes, x_off, y_off, acc, pad
_MATMUL = struct.Struct("<12I")         # n_rows, cols, gpr, row_bytes, x_off, y_off, x_stride, y_stride, acc, pad*3


def matvec_wg(cols: int) -> int:
    """Threads per matvec workgroup: enough for one pass over a row's groups of 8, within 64..256."""
    gpr = cols // 8
    return 256 if gpr >= 512 else 128 if gpr >= 192 else 64


def subgroup_consts(device: gpu.Device) -> dict:
    """SG / NOSG line switches and the `enable` directive naga refuses but browsers require."""
    if "subgroups" in device.info.features:
        return {"SG": "", "NOSG": "// ",
                "SG_ENABLE": "enable subgroups;" if device.info.backend == "browser" else ""}
    return {"SG": "// ", "NOSG": "", "SG_ENABLE": ""}


def _check(buf: gpu.Buffer, floats: int, what: str) -> None:
    if buf.size < 4 * floats:
        raise ValueError(f"{what}: buffer {buf.label} has {buf.size} bytes, needs {4 * floats}")


def matvec(device: gpu.Device, kernels: KernelCache, w: Weight, x: gpu.Buffer, y: gpu.Buffer,
           step: gpu.Buffer | None = None, *, x_offset: int = 0, y_offset: int = 0,
           accumulate: bool = False) -> list[Op]:
    """y[y_offset + r] (+)= sum_c W[r, c] * x[x_offset + c] for one token. `step` is accepted for a
    uniform signature and not used (the grid never depends on the token count)."""
    _check(x, x_offset + w.cols, f"{w.name} matvec x")
    _check(y, y_offset + w.rows, f"{w.name} matvec y")
    wg = matvec_wg(w.cols)
    k = kernels.get("matvec", WG=wg, **dequant_consts(w.type), **subgroup_consts(device))
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    ops = []
    for part in w.parts:
        params = device.uniform(_MATVEC.pack(part.n_rows, w.cols, w.cols // 8, w.row_bytes, x_offset,
                                             y_offset + part.first_row, int(accumulate), 0),
                                f"{part.buffer.label}.matvec")
        bound = device.bind(k, [part.buffer, x, y, params], f"{part.buffer.label}.matvec")
        grid = groups_1d(part.n_rows, MATVEC_ROWS, max_dim)
        ops.append(Op(k, bound, lambda t, g=grid: g))
    return ops


def matmul(device: gpu.Device, kernels: KernelCache, w: Weight, x: gpu.Buffer, y: gpu.Buffer,
           step: gpu.Buffer, *, max_tokens: int, accumulate: bool = False, x_offset: int = 0,
           y_offset: int = 0, x_stride: int | None = None, y_stride: int | None = None) -> list[Op]:
    """Y[i, r] (+)= sum_c W[r, c] * X[i, c] for the step's t tokens (t <= max_tokens), where token i's
    input is x[x_offset + i * x_stride ...] (stride defaults to cols) and its output
    y[y_offset + i * y_stride ...] (stride defaults to rows)."""
    xs = w.cols if x_stride is None else x_stride
    ys = w.rows if y_stride is None else y_stride
    _check(x, x_offset + (max_tokens - 1) * xs + w.cols, f"{w.name} matmul x")
    _check(y, y_offset + (max_tokens - 1) * ys + w.rows, f"{w.name} matmul y")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    if -(-max_tokens // MATMUL_TT) > max_dim:
        raise gpu.GpuError(f"{w.name}: {max_tokens} tokens per step exceed the matmul grid")
    k = kernels.get("matmul", **dequant_consts(w.type))
    ops = []
    for part in w.parts:
        if -(-part.n_rows // MATMUL_TR) > max_dim:
            raise gpu.GpuError(f"{part.buffer.label}: {part.n_rows} rows exceed the matmul grid")
        params = device.uniform(_MATMUL.pack(part.n_rows, w.cols, w.cols // 8, w.row_bytes, x_offset,
                                             y_offset + part.first_row, xs, ys, int(accumulate), 0, 0, 0),
                                f"{part.buffer.label}.matmul")
        bound = device.bind(k, [part.buffer, x, y, params, step], f"{part.buffer.label}.matmul")
        row_groups = -(-part.n_rows // MATMUL_TR)
        ops.append(Op(k, bound, lambda t, r=row_groups: (r, max(1, -(-t // MATMUL_TT)), 1)))
    return ops
