"""Elementwise builders: residual add, mul, scale by a constant, and a zero wipe (wgsl/elementwise.wgsl).

Also the two small helpers the row-wise families share (`subgroup_consts`, `row_mode`).

Every per-step op covers `n` features of each of the step's t tokens (t read from the step buffer), i.e.
`t * n` contiguous floats from the start of each buffer. An op whose output is one of its inputs runs the
in-place entry (one read_write binding), since WebGPU refuses a buffer bound read-only and writable at once.
"""

from __future__ import annotations

import struct

from .. import gpu
from . import Op, groups_1d

WG = 256
PARAMS = struct.Struct("<IfII")   # Params { n: u32, scale: f32, _p0: u32, _p1: u32 }


def subgroup_consts(device: gpu.Device) -> dict:
    """Constants that switch a reduction kernel between its subgroup path and its shared-memory fallback.

    Lines prefixed `{{SG}}` are live only with subgroups, lines prefixed `{{NOSG}}` only without (the other
    prefix becomes `//`). `{{SG_ENABLE}}` is the `enable subgroups;` directive the browser's WGSL requires
    (wgpu-native's naga refuses the directive and enables subgroup builtins through the device feature).
    """
    if "subgroups" in device.info.features:
        enable = "enable subgroups;" if device.info.backend == "browser" else ""
        return {"SG_ENABLE": enable, "SG": "", "NOSG": "//"}
    return {"SG_ENABLE": "", "SG": "//", "NOSG": ""}


# Row selection shared by softmax and sampling: (mode, count) as the kernels read them.
ROWS_FIXED, ROWS_TOKENS, ROWS_LAST = 0, 1, 2


def row_mode(rows, max_rows: int | None = None) -> tuple[int, int]:
    """rows=int: that many rows from row 0, whatever the step; rows=None: one row per token of the step
    (at most max_rows when given); rows="last": only the step's last token's row (row n_tokens-1)."""
    if rows is None:
        return ROWS_TOKENS, (0xFFFFFFFF if max_rows is None else int(max_rows))
    if rows == "last":
        return ROWS_LAST, 1
    if isinstance(rows, int) and rows > 0:
        return ROWS_FIXED, rows
    raise ValueError(f"rows must be a positive int, None (per token) or 'last', not {rows!r}")


def rows_at(mode: int, count: int, t: int) -> int:
    """How many rows an op with this row mode handles in a step of t tokens."""
    if mode == ROWS_TOKENS:
        return max(0, min(t, count))
    if mode == ROWS_LAST:
        return 1 if t > 0 else 0
    return count


def _grid(n: int, max_per_dim: int):
    return lambda t: groups_1d(max(1, t * n), WG, max_per_dim)


def _binary(device, kernels, name: str, a, b, out, step, n: int) -> list[Op]:
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, 1.0, 0, 0), f"{name}.params")
    if out is a or out is b:
        other = b if out is a else a          # add and mul commute: x = x (op) other
        k = kernels.get("elementwise", name + "_to", WG=WG)
        bound = device.bind(k, [out, params, step, other], f"{name}_to")
    else:
        k = kernels.get("elementwise", name + "_rows", WG=WG)
        bound = device.bind(k, [a, b, out, params, step], f"{name}_rows")
    return [Op(k, bound, _grid(n, max_dim))]


def add(device: gpu.Device, kernels, a: gpu.Buffer, b: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer,
        n: int) -> list[Op]:
    """out = a + b over t rows of n floats. `out` may be `a` or `b` (residual add in place)."""
    return _binary(device, kernels, "add", a, b, out, step, n)


def mul(device: gpu.Device, kernels, a: gpu.Buffer, b: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer,
        n: int) -> list[Op]:
    """out = a * b over t rows of n floats. `out` may be `a` or `b`."""
    return _binary(device, kernels, "mul", a, b, out, step, n)


def scale(device: gpu.Device, kernels, x: gpu.Buffer, step: gpu.Buffer, n: int, s: float) -> list[Op]:
    """x *= s in place over t rows of n floats (e.g. Gemma's embedding scale sqrt(n_embd))."""
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, float(s), 0, 0), "scale.params")
    k = kernels.get("elementwise", "scale_to", WG=WG)
    return [Op(k, device.bind(k, [x, params, step], "scale_to"), _grid(n, max_dim))]


def add_bias(device: gpu.Device, kernels, x: gpu.Buffer, bias: gpu.Buffer, step: gpu.Buffer, n: int,
             stride: int | None = None, offset: int = 0) -> list[Op]:
    """x[j, offset:offset+n] += bias for each of the step's t rows of `stride` floats (qwen2's Q/K/V biases,
    added into their slice of the fused QKV row)."""
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, 1.0, n if stride is None else stride, offset), "bias.params")
    k = kernels.get("elementwise", "bias_to", WG=WG)
    return [Op(k, device.bind(k, [x, params, step, bias], "bias_to"), _grid(n, max_dim))]


def last_row(device: gpu.Device, kernels, src: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer, n: int) -> list[Op]:
    """out[:n] = the step's last row of src ([t, n]): the only row the output head needs during prefill."""
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, 1.0, 0, 0), "last_row.params")
    k = kernels.get("elementwise", "last_row_to", WG=WG)
    grid = groups_1d(n, WG, max_dim)
    return [Op(k, device.bind(k, [out, params, step, src], "last_row_to"), lambda t: grid)]


def fill_zero(device: gpu.Device, kernels, buf: gpu.Buffer, n_words: int | None = None,
              wg: int = WG) -> list[Op]:
    """Zero the first n_words 32-bit words of buf (all of it by default), inside the compute pass.

    The grid folds into y past the per-dimension workgroup limit; a buffer over the storage binding limit is
    bound in aligned slices, one op each. The grid does not depend on the step."""
    n_words = buf.size // 4 if n_words is None else int(n_words)
    if n_words * 4 > buf.size:
        raise ValueError(f"fill_zero: {n_words} words exceed {buf.label} ({buf.size} bytes)")
    limits = device.info.limits
    align = max(256, limits["min_storage_buffer_offset_alignment"])
    chunk = limits["max_storage_buffer_binding_size"] // align * align      # bytes per slice
    max_dim = limits["max_compute_workgroups_per_dimension"]
    k = kernels.get("elementwise", "fill_zero", WG=wg)
    ops, start = [], 0
    while start < n_words * 4:
        size = min(chunk, n_words * 4 - start)
        words = size // 4
        params = device.uniform(PARAMS.pack(words, 0.0, 0, 0), "fill_zero.params")
        res = buf if (start == 0 and size == buf.size) else gpu.Slice(buf, start, size)
        grid = groups_1d(words, wg, max_dim)
        ops.append(Op(k, device.bind(k, [res, params], f"fill_zero {buf.label}@{start}"), lambda t, g=grid: g))
        start += size
    return ops
