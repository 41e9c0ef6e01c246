"""Backward builders of the dense path's elementwise and normalization ops (issue #43, training in the tab): RMSNorm
(wgsl/backward_norm.wgsl), SwiGLU and GeGLU (wgsl/backward_glu.wgsl), the soft-cap (wgsl/backward_elementwise.wgsl)
and the embedding lookup (wgsl/backward_embed.wgsl). Each mirrors its forward builder's conventions (compact f32
rows, the shared `step` uniform, a grid that depends on the step's token count) and returns `Op`s.

Gradients: an input's gradient (dx) is written, replacing what the buffer held; a weight's gradient (dw, dE) is
added into its buffer, since training sums it over micro-batches (the caller clears it at the start of a step).
Every sum over tokens runs in a fixed order (no float atomics exist in WGSL), so a backward pass is bit-reproducible.
lab/host/reference/grads.py holds the float64 oracle; tests/kernels/test_backward_*.py check each kernel against it.
The projections' and LoRA adapters' backward builders are lab/ops/backward_matmul.py.

The residual add (h = x + f(x)) has no backward kernel: its gradient is the identity, dh reaching the stream and the
branch unchanged, and the two meet again as a sum where the branch's input gradient is added into the stream's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from lab import gpu
from lab.gpu.shaders import subgroup_consts
from lab.ops import Op, WeightPart, groups_1d

WG = 64           # the glu's and the embedding's (one invocation per column) workgroup
EW_WG = 256       # the soft-cap's, as the forward's elementwise kernels
NORM_PARAMS = struct.Struct("<IIfI4I")   # group, n_groups, eps, acc, stride, offset, _p0, _p1
GLU_PARAMS = struct.Struct("<4I")        # n, _p0, _p1, _p2
SOFTCAP_PARAMS = struct.Struct("<IfII")  # n, cap, rows, _p
GATE_PARAMS = struct.Struct("<4I")       # n, stride, offset, _p
EMBED_PARAMS = struct.Struct("<4If3I")   # first_row, n_rows, cols, x_off, scale, _p0, _p1, _p2
GLU_ACTS = ("swiglu", "geglu")
SOFTCAP_SAVED = ("x", "y")


def _norm_wg(device: gpu.Device, group: int) -> int:
    """The dx pass's workgroup: one per (token, group), sized to the group as the forward's (lab.ops.norm)."""
    if device.info.swiftshader:
        return gpu.SWIFTSHADER_WG
    return 64 if group <= 64 else (128 if group <= 128 else 256)


def rms_norm_back(device: gpu.Device, kernels, x: gpu.Buffer, w: gpu.Buffer, dy: gpu.Buffer, dx: gpu.Buffer,
                  dw: gpu.Buffer | None, rs: gpu.Buffer, step: gpu.Buffer, n: int, eps: float,
                  group: int | None = None, accumulate: bool = False, stride: int | None = None,
                  offset: int = 0) -> list[Op]:
    """Gradients of y = x / sqrt(mean(x^2) + eps) * w (lab.ops.norm.rms_norm) over each `group` floats (None: the
    whole row of n) of the step's t compact rows x [t, n], given dy [t, n]: dx [t, n] is written and dw (`group`
    floats) gets the sum over the t rows and their groups added. `rs` (t * n / group floats) is scratch: the dx
    pass leaves each group's 1 / rms there for the dw pass. Two ops, dx then dw, run in that order; with dw=None
    (a norm whose weight is not trained: LoRA) only the first. accumulate=True adds dx into the buffer (the
    residual stream's gradient, which the branch's joins). Token j's n floats start at j * stride + offset in x, dy
    and dx alike (default: compact rows; the Q heads of a fused [q | k | v] row: its width, offset 0)."""
    group = n if group is None else int(group)
    if group <= 0 or n % group:
        raise ValueError(f"rms_norm_back: n={n} is not a whole number of groups of {group}")
    if dx is x or dx is dy:
        raise ValueError("rms_norm_back: dx must be a buffer other than x and dy (WebGPU refuses a buffer bound "
                         "read-only and writable at once, and the dw pass reads both after dx is written)")
    n_groups = n // group
    stride = n if stride is None else int(stride)
    if offset < 0 or offset + n > stride:
        raise ValueError(f"rms_norm_back: {n} floats from {offset} do not fit rows of {stride}")
    wg = _norm_wg(device, group)
    params = device.uniform(NORM_PARAMS.pack(group, n_groups, float(eps), int(accumulate), stride, int(offset), 0, 0),
                            "rms_norm_back.params")
    consts = dict(WG=wg, **subgroup_consts(device))
    k_dx = kernels.get("backward_norm", "rms_norm_dx", **consts)
    k_dw = kernels.get("backward_norm", "rms_norm_dw", **consts)
    dx_op = Op(k_dx, device.bind(k_dx, [dx, x, dy, w, params, step, rs], "rms_norm_back.dx"),
               lambda t: (max(1, t), n_groups, 1))
    gx = -(-group // wg)
    if dw is None:
        return [dx_op]
    dw_op = Op(k_dw, device.bind(k_dw, [dw, x, dy, rs, params, step], "rms_norm_back.dw"), lambda t: (gx, 1, 1))
    return [dx_op, dw_op]


def glu_back(device: gpu.Device, kernels, gu: gpu.Buffer, dh: gpu.Buffer, dgu: gpu.Buffer, step: gpu.Buffer,
             n: int, act: str = "swiglu") -> list[Op]:
    """Gradients of h = act(gate) * up (lab.ops.glu.glu with up=None) over the step's fused rows gu [t, 2n] =
    [gate | up], given dh [t, n]: dgu [t, 2n] = [d gate | d up] is written, in the forward's fused layout (the
    gradient of the one matvec over the concatenated gate and up weights)."""
    if act not in GLU_ACTS:
        raise ValueError(f"glu_back: unknown activation {act!r} ({', '.join(GLU_ACTS)})")
    if dgu is gu or dgu is dh:
        raise ValueError("glu_back: dgu must be a buffer other than its inputs")
    params = device.uniform(GLU_PARAMS.pack(n, 0, 0, 0), f"{act}_back.params")
    k = kernels.get("backward_glu", f"{act}_back", WG=WG)
    gx = -(-n // WG)
    return [Op(k, device.bind(k, [gu, dh, dgu, params, step], f"{act}_back"), lambda t: (gx, max(1, t), 1))]


def softcap_back(device: gpu.Device, kernels, grad: gpu.Buffer, saved: gpu.Buffer, step: gpu.Buffer, n: int,
                 cap: float, rows: int = 0, saved_is: str = "x") -> list[Op]:
    """grad *= 1 - tanh(x / cap)^2 in place over rows of n floats (the gradient of lab.ops.elementwise.softcap, with
    its `rows`: the step's tokens when 0). `saved` holds the forward's input x (saved_is="x") or, since the forward
    caps in place, its output y = cap * tanh(x / cap) (saved_is="y"; near saturation good only to ~1e-7 of grad)."""
    if not cap > 0:
        raise ValueError(f"softcap_back: cap {cap} must be positive")
    if saved_is not in SOFTCAP_SAVED:
        raise ValueError(f"softcap_back: saved_is {saved_is!r} is not one of {SOFTCAP_SAVED}")
    if saved is grad:
        raise ValueError("softcap_back: the saved values must be a buffer other than the gradient")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(SOFTCAP_PARAMS.pack(n, float(cap), rows, 0), "softcap_back.params")
    k = kernels.get("backward_elementwise", f"softcap_back_{saved_is}", WG=EW_WG)
    return [Op(k, device.bind(k, [grad, params, step, saved], f"softcap_back_{saved_is}"),
               lambda t: groups_1d(max(1, (rows or t) * n), EW_WG, max_dim))]


def sigmoid_gate_back(device: gpu.Device, kernels, grad: gpu.Buffer, x: gpu.Buffer, gate: gpu.Buffer,
                      dgate: gpu.Buffer, step: gpu.Buffer, n: int, stride: int, offset: int) -> list[Op]:
    """The gradient of lab.ops.elementwise.sigmoid_gate (y = x sigmoid(g) over rows of n, g from rows of `stride` at
    `offset`): grad (at y) becomes the gradient at x in place, dg = grad x s(g) s(-g) written into dgate's rows of
    `stride` at `offset`. x: the forward's input, the values before the gate."""
    if offset < 0 or offset + n > stride:
        raise ValueError(f"sigmoid_gate_back: {n} floats from {offset} do not fit rows of {stride}")
    if dgate in (grad, x, gate) or grad in (x, gate):
        raise ValueError("sigmoid_gate_back: the gradients must be buffers of their own (WebGPU refuses a buffer bound "
                         "read-only and writable in one dispatch)")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    params = device.uniform(GATE_PARAMS.pack(n, stride, offset, 0), "gate_back.params")
    k = kernels.get("backward_elementwise", "gate_back", WG=EW_WG)
    return [Op(k, device.bind(k, [grad, params, step, x, gate, dgate], "gate_back"),
               lambda t: groups_1d(max(1, t * n), EW_WG, max_dim))]


def embed_back(device: gpu.Device, kernels, table: Sequence[WeightPart], cols: int, ids: gpu.Buffer,
               dx: gpu.Buffer, step: gpu.Buffer, *, scale: float = 1.0, x_offset: int = 0) -> list[Op]:
    """dE[ids[i], :] += scale * dx[x_offset + i * cols ...] for the step's t tokens (the gradient of
    lab.ops.embed.get_rows): `table` is the f32 gradient table [rows, cols] as parts of rows (WeightPart: buffer,
    first_row, n_rows), one op per part, each adding only the tokens whose ids it holds. Only the rows of ids seen
    are written; a repeated id's row gets its tokens' sum, added in token order (wgsl/backward_embed.wgsl says what
    that costs)."""
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    k = kernels.get("backward_embed", "embed_back", WG=WG)
    grid = groups_1d(cols, WG, max_dim)
    out = []
    for part in table:
        label = f"{part.buffer.label}.embed_back"
        params = device.uniform(EMBED_PARAMS.pack(part.first_row, part.n_rows, cols, x_offset, float(scale), 0, 0, 0),
                                label)
        out.append(Op(k, device.bind(k, [part.buffer, ids, dx, params, step], label), lambda t: grid))
    return out
