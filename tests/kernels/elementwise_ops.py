"""Builders for the elementwise entries no model path uses (add / mul over the step's rows, fill_zero), so
the tests keep checking those kernels of wgsl/elementwise.wgsl. Same conventions as lab/ops: each returns `Op`s
whose grid depends on the step's token count; the workgroup size and Params layout are lab.ops.elementwise's."""

from __future__ import annotations

from lab import gpu
from lab.ops import Op, groups_1d
from lab.ops.elementwise import PARAMS, WG
from lab.ops.elementwise import scale as scale  # noqa: F401  (a model path uses it now: gemma4; the tests import it here)


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
