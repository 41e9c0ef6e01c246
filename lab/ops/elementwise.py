"""Elementwise builders the forward pass uses (wgsl/elementwise.wgsl): a bias added into a slice of fused rows,
the copy of the step's last row for the output head, the final logit soft-cap, qwen35's attention output gate, and a
scale in place (gemma4's per-layer input scales and layer_output_scale).

Each op covers `n` features of each of the step's t tokens (t read from the step buffer). An op whose output
is one of its inputs runs an in-place entry (one read_write binding), since WebGPU refuses a buffer bound
read-only and writable at once. The file's other entries have no builder here: `scale_add` is
lab.instruments.selftest's, and add / mul / fill_zero are built by tests/kernels/elementwise_ops.py (no model path uses
them).
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op, groups_1d

WG = 256
PARAMS = struct.Struct("<IfII")   # Params { n: u32, scale: f32, _p0: u32, _p1: u32 }


def add_bias(device: gpu.Device, kernels, x: gpu.Buffer, bias: gpu.Buffer, step: gpu.Buffer, n: int,
             stride: int | None = None, offset: int = 0) -> list[Op]:
    """x[j, offset:offset+n] += bias for each of the step's t rows of `stride` floats (qwen2's Q/K/V biases,
    added into their slice of the fused QKV row)."""
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, 1.0, n if stride is None else stride, offset), "bias.params")
    k = kernels.get("elementwise", "bias_to", WG=WG)
    return [Op(k, device.bind(k, [x, params, step, bias], "bias_to"),
               lambda t: groups_1d(max(1, t * n), WG, max_dim))]


def scale(device: gpu.Device, kernels, x: gpu.Buffer, step: gpu.Buffer, n: int, s: float) -> list[Op]:
    """x *= s in place over the step's t rows of n floats."""
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, float(s), 0, 0), "scale.params")
    k = kernels.get("elementwise", "scale_to", WG=WG)
    return [Op(k, device.bind(k, [x, params, step], "scale_to"), lambda t: groups_1d(max(1, t * n), WG, max_dim))]


def last_row(device: gpu.Device, kernels, src: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer, n: int) -> list[Op]:
    """out[:n] = the step's last row of src ([t, n]): the only row the output head needs during prefill."""
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, 1.0, 0, 0), "last_row.params")
    k = kernels.get("elementwise", "last_row_to", WG=WG)
    grid = groups_1d(n, WG, max_dim)
    return [Op(k, device.bind(k, [out, params, step, src], "last_row_to"), lambda t: grid)]


def softcap(device: gpu.Device, kernels, x: gpu.Buffer, step: gpu.Buffer, n: int, cap: float,
            rows: int = 0) -> list[Op]:
    """x = cap * tanh(x / cap) in place over rows of n floats: one row per token of the step (rows=0), or the
    first `rows` rows (the head's one row of logits). gemma2's final logit soft-capping."""
    if not cap > 0:
        raise ValueError(f"softcap: cap {cap} must be positive")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, float(cap), rows, 0), "softcap.params")
    k = kernels.get("elementwise", "softcap_to", WG=WG)
    return [Op(k, device.bind(k, [x, params, step], "softcap_to"),
               lambda t: groups_1d(max(1, (rows or t) * n), WG, max_dim))]


def copy_rows(device: gpu.Device, kernels, src: gpu.Buffer, dst: gpu.Buffer, step: gpu.Buffer, n: int, *,
              src_offset: int = 0, dst_offset: int = 0) -> list[Op]:
    """dst[dst_offset + i] = src[src_offset + i] for the step's t compact rows of n floats: a copy inside the compute
    pass (a buffer copy would end it), which training uses to keep each layer's input and to put it back."""
    if src is dst:
        raise ValueError("copy_rows: source and destination must be two buffers")
    for buf, off, what in ((src, src_offset, "source"), (dst, dst_offset, "destination")):
        if off < 0 or buf.size < 4 * (off + n):
            raise ValueError(f"copy_rows: the {what} {buf.label} ({buf.size} bytes) has no row of {n} floats at {off}")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, 1.0, dst_offset, src_offset), "copy.params")
    k = kernels.get("elementwise", "copy_to", WG=WG)
    return [Op(k, device.bind(k, [dst, params, step, src], "copy_to"),
               lambda t: groups_1d(max(1, t * n), WG, max_dim))]


def sigmoid_gate(device: gpu.Device, kernels, x: gpu.Buffer, gate: gpu.Buffer, step: gpu.Buffer, n: int,
                 stride: int, offset: int) -> list[Op]:
    """x[j, :n] *= sigmoid(gate[j, offset:offset+n]) for each of the step's t rows (x rows of n floats, gate rows of
    `stride`): qwen35's attention output gate, the second half of its Q projection, applied before attn_output."""
    if x is gate:
        raise ValueError("sigmoid_gate: the gate must be a buffer other than x")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(PARAMS.pack(n, 1.0, stride, offset), "gate.params")
    k = kernels.get("elementwise", "gate_to", WG=WG)
    return [Op(k, device.bind(k, [x, params, step, gate], "gate_to"),
               lambda t: groups_1d(max(1, t * n), WG, max_dim))]
