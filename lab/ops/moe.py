"""A routed layer's ops (mixtures of experts): the gating and top-k (`route`, wgsl/moe.wgsl), the chosen experts'
products (`expert_matvec`, wgsl/matvec.wgsl's EXPERT variant: every weight type the matvec reads), and their weighted
sum into the residual (`combine`). The router's logits are a plain projection (lab.ops.matmul). The experiments' op
`mute` (one expert's weight zeroed or scaled between `route` and `combine`) is spliced in by
lab/instruments/interventions.py, never by the plans.

A step of t tokens with k experts a token has t * k (token, slot) pairs, pair q = token * k + slot: `route` writes each
pair's expert and weight, `expert_matvec` runs one workgroup row of the grid per pair, reading the rows of that pair's
expert only (a part of the stack that does not hold it returns at once), and `combine` sums a token's k rows.

Speed, as it stands: a prefill re-reads an expert's rows once per pair that chose it (a matvec per pair, not a GEMM
over the tokens grouped by expert); `route` walks a token's experts in one invocation. Both are correct first; the plan
for prefill is a grouping pass (the pairs sorted by expert, an offset per expert) and the GEMM tile over each expert's
tokens, so that an expert's weights are read once a chunk.

What it does not know: which layers route, or where the buffers live (lab.engine.blocks.moe).
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.gpu.shaders import KernelCache, grid_bytes, subgroup_consts
from lab.ops import Experts, Op
from lab.ops.attention import kv_consts
from lab.ops.matmul import _MATVEC, GLU_ACTS, _matvec_consts, matvec_wg
from lab.ops.weights import dequant_consts

WG = 64
GATINGS = ("softmax", "sigmoid")
_ROUTE = struct.Struct("<8I")       # n_expert, k, gating, bias, norm, pad x3
_COMBINE = struct.Struct("<4I")     # n, k, acc, pad
_EXPERT = struct.Struct("<8I")      # k, x_stride, y_stride, first, count, x_div, pad x2
MUTE_OPS = ("zero", "scale")        # what `mute` does to an expert's weight (lab.ops.intervene.OPS numbers them)


def _check(buf: gpu.Buffer, floats: int, what: str) -> None:
    if buf.size < 4 * floats:
        raise ValueError(f"{what}: buffer {buf.label} has {buf.size} bytes, needs {4 * floats}")


def route(device: gpu.Device, kernels: KernelCache, logits: gpu.Buffer, bias: gpu.Buffer | None, ids: gpu.Buffer,
          weights: gpu.Buffer, step: gpu.Buffer, *, n_expert: int, k: int, gating: str, max_tokens: int,
          norm: bool = True) -> list[Op]:
    """For each of the step's t tokens: its router logits (logits [t, n_expert]) through the gating function, the k
    experts of largest probability (plus `bias` [n_expert] for the choice only) into ids [t, k] (u32), their
    probabilities, divided by their sum where `norm`, into weights [t, k]. wgsl/moe.wgsl states the rule of ties."""
    if gating not in GATINGS:
        raise ValueError(f"route: gating {gating!r} is not one of {', '.join(GATINGS)}")
    if not 1 <= k <= n_expert:
        raise ValueError(f"route: {k} experts a token of {n_expert}")
    _check(logits, max_tokens * n_expert, "route logits")
    _check(ids, max_tokens * k, "route ids")
    _check(weights, max_tokens * k, "route weights")
    if bias is not None:
        _check(bias, n_expert, "route bias")
    kern = kernels.get("moe", "route", WG=WG, ROUTE="", COMBINE="// ", MUTE="// ", B_STEP=5)
    params = device.uniform(_ROUTE.pack(n_expert, k, GATINGS.index(gating), int(bias is not None), int(norm), 0, 0, 0),
                            "moe.route")
    bound = device.bind(kern, [logits, bias if bias is not None else logits, ids, weights, params, step], "moe.route")
    return [Op(kern, bound, lambda t: (max(1, -(-t // WG)), 1, 1))]


def combine(device: gpu.Device, kernels: KernelCache, down: gpu.Buffer, weights: gpu.Buffer, y: gpu.Buffer,
            step: gpu.Buffer, *, n: int, k: int, max_tokens: int, accumulate: bool = True) -> list[Op]:
    """y[t, n] (+)= sum over the token's k slots of weights[t, s] * down[t k + s, n], in slot order."""
    _check(down, max_tokens * k * n, "combine down")
    _check(weights, max_tokens * k, "combine weights")
    _check(y, max_tokens * n, "combine y")
    kern = kernels.get("moe", "combine", WG=WG, ROUTE="// ", COMBINE="", MUTE="// ", B_STEP=4)
    params = device.uniform(_COMBINE.pack(n, k, int(accumulate), 0), "moe.combine")
    bound = device.bind(kern, [down, weights, y, params, step], "moe.combine")
    gx = -(-n // WG)
    return [Op(kern, bound, lambda t: (gx, max(1, t), 1))]


def mute(device: gpu.Device, kernels: KernelCache, ids: gpu.Buffer, weights: gpu.Buffer, step: gpu.Buffer,
         params: gpu.Buffer, *, k: int, max_tokens: int, label: str = "moe.mute") -> Op:
    """For each (token, slot) pair of the step whose expert (ids [t, k]) is the one `params` names, at a position in
    its range: its weight (weights [t, k]) zeroed or scaled, the others' left as they are (no renormalising), so that
    `combine` leaves that expert out of the sum. `params` is an intervention slot's uniform (lab.ops.intervene.PARAMS:
    stride k, c0 the expert, r0, r1, op 0 zero or 3 scale, scale), written by its caller before each run."""
    _check(ids, max_tokens * k, "mute ids")
    _check(weights, max_tokens * k, "mute weights")
    kern = kernels.get("moe", "mute", WG=WG, ROUTE="// ", COMBINE="// ", MUTE="", B_STEP=2)
    return Op(kern, device.bind(kern, [ids, weights, step, params], label),
              lambda t: (max(1, -(-(t * k) // WG)), 1, 1))


def expert_matvec(device: gpu.Device, kernels: KernelCache, experts: Experts, x: gpu.Buffer, y: gpu.Buffer,
                  ids: gpu.Buffer, *, k: int, max_tokens: int, x_stride: int, x_div: int, y_stride: int,
                  x_offset: int = 0, y_offset: int = 0, glu: str | None = None, wg: int | None = None) -> list[Op]:
    """For each (token, slot) pair q of the step (t * k of them): y[y_offset + q * y_stride + r] = sum_c
    W_e[r, c] in(c), r < experts.per, e = ids[q], W_e the e-th expert's rows; in(c) = x[x_offset + (q / x_div) *
    x_stride + c] (x_div = k: the pair's token's row; 1: a row per pair), or with glu the GLU of the [gate | up] row
    of 2 cols there (up at + cols). One op per part of the stack; only the chosen experts' rows are read."""
    w = experts.weight
    if glu is not None and glu not in GLU_ACTS:
        raise ValueError(f"{w.name} expert matvec: unknown glu {glu!r} ({', '.join(GLU_ACTS)})")
    pairs = max_tokens * k
    rows_in = (pairs - 1) // x_div + 1
    _check(x, x_offset + (rows_in - 1) * x_stride + (2 if glu else 1) * w.cols, f"{w.name} expert matvec x")
    _check(y, y_offset + (pairs - 1) * y_stride + experts.per, f"{w.name} expert matvec y")
    _check(ids, pairs, f"{w.name} expert matvec ids")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    gx = -(-experts.per // 4)
    if gx > max_dim or pairs > max_dim:
        raise gpu.GpuError(f"{w.name}: {experts.per} rows an expert x {pairs} pairs exceed the matvec grid")
    x4 = x_offset % 4 == 0 and x_stride % 4 == 0
    consts, w4, table = _matvec_consts(w.type.name, x4, norm=False, glu=glu, bias=False, rope=False, expert=True)
    wg = wg or matvec_wg(w.cols, experts.per, device.info.software, w.type.name, device.info.swiftshader)
    sg = subgroup_consts(device)
    red = max(1, wg // 4) if sg["SG"] == "" else wg
    kern = kernels.get("matvec", WG=wg, RED=red, **consts, **dequant_consts(w.type), **sg, **kv_consts("f32"))
    grid_buf = [kernels.table(f"{table} grid", grid_bytes(table))] if table else []
    ops = []
    for part in w.parts:
        first, count = experts.experts_of(part)
        params = device.uniform(_MATVEC.pack(experts.per, w.cols, w.cols // 8, w.row_bytes, x_offset, y_offset, 0, 0,
                                             0.0, 0, 0, w.cols), f"{part.buffer.label}.experts")
        ep = device.uniform(_EXPERT.pack(k, x_stride, y_stride, first, count, x_div, 0, 0),
                            f"{part.buffer.label}.experts.ep")
        res = [part.buffer, x, y, params] + [part.buffer] * w4 + grid_buf + [ids, ep]
        ops.append(Op(kern, device.bind(kern, res, f"{part.buffer.label}.experts"),
                      lambda t, gx=gx: (gx, max(1, t * k), 1)))
    return ops

