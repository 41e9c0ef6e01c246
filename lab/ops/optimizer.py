"""The optimizer's step (issue #43, training in the tab), wgsl/optimizer.wgsl: the gradients cleared (`zero`), their
global norm and clip scale (`grad_norm`), then AdamW (`adamw`, PyTorch's torch.optim.AdamW) or plain SGD (`sgd`),
and the learning-rate schedule the host evaluates before each step (`schedule`).

Parameters, gradients and AdamW's moments m and v are flat f32 buffers of n floats (a LoRA adapter's A and B, or a
full fine-tune's weights, each its own buffer or one buffer for all). What changes from step to step lives in one
small storage buffer, `state` (make_state): [lr, t, sumsq, clip_scale], the host writing lr and t (state_bytes)
before each step and grad_norm the other two, so a step's plan is built once and never changes. The ops of a step
run one after another in one compute pass, each seeing the previous one's writes; their grids ignore the step's
token count. A buffer past the storage binding limit (128 MiB is WebGPU's default: 33.5 M floats) is bound in
chunks of whole reduction slices, one dispatch each (`max_binding` forces that on a small buffer, for the tests).

What it does not know: which buffers are a model's trainable ones, micro-batches, the loss. It does not skip a step
whose gradients are not finite (the host reads sumsq from `state` after the step to see one).
lab/host/reference/optim.py holds the float64 oracle; tests/kernels/test_optimizer.py checks the kernels against it.
No numpy here: it runs in Pyodide.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from lab import gpu
from lab.ops import Op, groups_1d
from lab.ops import elementwise as ew

WG = 256                     # every entry's workgroup (a power of two: the norm's tree halves it)
PER = 16                     # gradients an invocation of norm_partials squares and sums, in order
SLICE = WG * PER             # gradients a workgroup of norm_partials reduces into one partial sum
MAX_T = 1 << 24              # the last step number f32 holds exactly (t is written as f32)
# State { lr, t, sumsq, clip: f32 } (storage, read_write by norm_finish): the host writes all four before each step.
STATE = struct.Struct("<4f")
STATE_FLOATS = 4
_NORM = struct.Struct("<4I")          # n, part_base, _p0, _p1
_FINISH = struct.Struct("<IfII")      # parts, max_norm, _p0, _p1
_ADAM = struct.Struct("<I8f3I")       # n, b1, b2, 1 - b1, 1 - b2, ln b1, ln b2, eps, wd, _p0, _p1, _p2
_SGD = struct.Struct("<4I")           # n, _p0, _p1, _p2


def make_state(device: gpu.Device, label: str = "optim.state") -> gpu.Buffer:
    """The per-step state buffer (STATE_FLOATS f32). Conversation-derived: sumsq comes from the training text."""
    return device.buffer(STATE.size, gpu.CONVERSATION, label)


def state_bytes(lr: float, t: int) -> bytes:
    """What the host writes into `state` before step t (1-based) at learning rate lr: lr, t, sumsq = 0 and a clip scale
    of 1, which grad_norm overwrites (a plan without grad_norm steps unclipped)."""
    if not 1 <= t <= MAX_T or int(t) != t:
        raise ValueError(f"state_bytes: step t={t} must be an integer in 1..{MAX_T} (f32 holds it exactly)")
    return STATE.pack(float(lr), float(t), 0.0, 1.0)


def grad_norm_scratch_floats(n: int) -> int:
    """Floats of grad_norm's scratch for n gradients: one partial sum per slice of SLICE."""
    return max(1, -(-n // SLICE))


def reduction_depth(*ns: int) -> int:
    """The most roundings one square goes through on its way into sumsq, over gradients of ns floats (grad_norm's n, or
    grad_norm_many's pieces' n): its own, PER - 1 in-order adds, log2(WG) levels of the tree, ceil(parts / WG) - 1
    adds in norm_finish's invocation, the tree again (the oracle's tolerance)."""
    levels = WG.bit_length() - 1
    parts = sum(grad_norm_scratch_floats(n) for n in ns)
    return 1 + (PER - 1) + levels + (-(-parts // WG) - 1) + levels


def _chunks(device: gpu.Device, n: int, max_binding: int | None) -> list[tuple[int, int]]:
    """(first float, floats) of each binding of n floats: whole slices of SLICE floats (so a chunk's offset is
    aligned and its partial sums are the unchunked ones) within the binding limit, the last one short."""
    limit = device.info.limits["max_storage_buffer_binding_size"] if max_binding is None else int(max_binding)
    per = limit // (4 * SLICE) * SLICE
    if per == 0:
        raise ValueError(f"optimizer: a binding limit of {limit} bytes holds no slice of {SLICE} floats")
    align = device.info.limits["min_storage_buffer_offset_alignment"]
    if (4 * SLICE) % align:
        raise ValueError(f"optimizer: a slice ({4 * SLICE} bytes) is no multiple of the offset alignment {align}")
    return [(first, min(per, n - first)) for first in range(0, n, per)]


def _span(buf: gpu.Buffer, first: int, count: int) -> gpu.Slice:
    return gpu.Slice(buf, 4 * first, 4 * count)


def _check(what: str, n: int, sized: dict[str, gpu.Buffer], **bufs: gpu.Buffer) -> None:
    """n >= 1; each buffer of `sized` holds n floats; no buffer of `bufs` passed twice (WebGPU refuses a buffer bound
    writable twice, or writable and read-only, in one dispatch)."""
    if n < 1:
        raise ValueError(f"{what}: n={n} must be at least 1")
    for name, buf in sized.items():
        if buf.size < 4 * n:
            raise ValueError(f"{what}: {name} ({buf.label}) has {buf.size} bytes, needs {4 * n}")
    names = list(bufs)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            if bufs[x] is bufs[y]:
                raise ValueError(f"{what}: {x} and {y} must be different buffers")


def _state_ok(what: str, state: gpu.Buffer) -> None:
    if state.size < STATE.size:
        raise ValueError(f"{what}: state ({state.label}) has {state.size} bytes, needs {STATE.size} (make_state)")


def zero(device: gpu.Device, kernels, buf: gpu.Buffer, n: int, *, max_binding: int | None = None) -> list[Op]:
    """buf[0:n] = 0, inside the compute pass (the gradients, at the start of a step). It runs elementwise.wgsl's
    fill_zero; Device.clear would be a command of its own, outside the step's one pass."""
    _check("zero", n, dict(buf=buf))
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    k = kernels.get("elementwise", "fill_zero", WG=ew.WG)
    ops = []
    for first, count in _chunks(device, n, max_binding):
        params = device.uniform(ew.PARAMS.pack(count, 0.0, 0, 0), f"{buf.label}.zero@{first}")
        grid = groups_1d(count, ew.WG, max_dim)
        ops.append(Op(k, device.bind(k, [_span(buf, first, count), params], f"zero {buf.label}@{first}"),
                      lambda t, g=grid: g))
    return ops


def grad_norm(device: gpu.Device, kernels, grads: gpu.Buffer, n: int, state: gpu.Buffer, scratch: gpu.Buffer, *,
              max_norm: float, max_binding: int | None = None) -> list[Op]:
    """state.sumsq = sum of grads[0:n]^2 in a fixed order (bit-reproducible, the same whatever the chunking),
    state.clip = min(1, max_norm / (sqrt(sumsq) + 1e-6)) (torch.nn.utils.clip_grad_norm_), or 1 where max_norm <= 0.
    `scratch` holds grad_norm_scratch_floats(n) partial sums. One norm_partials op per binding chunk, then
    norm_finish."""
    return grad_norm_many(device, kernels, [(grads, n)], state, scratch, max_norm=max_norm, max_binding=max_binding)


def grad_norm_many(device: gpu.Device, kernels, pieces: Sequence[tuple[gpu.Buffer, int]], state: gpu.Buffer,
                   scratch: gpu.Buffer, *, max_norm: float, max_binding: int | None = None) -> list[Op]:
    """grad_norm over several gradient buffers at once, pieces = [(buffer, n), ...], each buffer's first n floats:
    the global norm clip_grad_norm_ takes over every trainable tensor (a LoRA adapter's A and B in each layer).
    Their partial sums follow one another in `scratch` (sum of grad_norm_scratch_floats(n) over the pieces), in
    the pieces' order, which fixes the sum's."""
    if not pieces:
        raise ValueError("grad_norm: no gradients")
    parts = sum(grad_norm_scratch_floats(n) for _, n in pieces)
    _check("grad_norm", parts, dict(scratch=scratch), scratch=scratch, state=state)
    _state_ok("grad_norm", state)
    ops, base = [], 0
    for grads, n in pieces:
        _check("grad_norm", n, dict(grads=grads), grads=grads, scratch=scratch, state=state)
        ops += _partials(device, kernels, grads, n, _span(scratch, 0, parts), base, max_binding)
        base += grad_norm_scratch_floats(n)
    k_fin = kernels.get("optimizer", "norm_finish", WG=WG, PER=PER)
    fin = device.uniform(_FINISH.pack(parts, float(max_norm) if max_norm > 0 else 0.0, 0, 0), "norm_finish.params")
    ops.append(Op(k_fin, device.bind(k_fin, [_span(scratch, 0, parts), state, fin], "norm_finish"),
                  lambda t: (1, 1, 1)))
    return ops


def _partials(device: gpu.Device, kernels, grads: gpu.Buffer, n: int, scratch: gpu.Slice, base: int,
              max_binding: int | None) -> list[Op]:
    """norm_partials over grads[0:n], one op per binding chunk, its partial sums at scratch[base ...]."""
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    k = kernels.get("optimizer", "norm_partials", WG=WG, PER=PER)
    ops = []
    for first, count in _chunks(device, n, max_binding):
        params = device.uniform(_NORM.pack(count, base + first // SLICE, 0, 0), f"{grads.label}.norm@{first}")
        grid = groups_1d(count, SLICE, max_dim)
        ops.append(Op(k, device.bind(k, [_span(grads, first, count), scratch, params],
                                     f"norm_partials {grads.label}@{first}"), lambda t, g=grid: g))
    return ops


def _betas(beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 < b < 1.0:
            raise ValueError(f"adamw: {name}={b} must lie in (0, 1) (ln {name} enters the bias correction)")
    if not eps > 0 or weight_decay < 0:
        raise ValueError(f"adamw: eps={eps} must be positive and weight_decay={weight_decay} not negative")


def adamw(device: gpu.Device, kernels, params: gpu.Buffer, grads: gpu.Buffer, m: gpu.Buffer, v: gpu.Buffer,
          state: gpu.Buffer, n: int, *, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.0, max_binding: int | None = None) -> list[Op]:
    """One AdamW step over params[0:n] as torch.optim.AdamW takes it, with g = grads * state.clip: params *= 1 - lr
    wd (decoupled); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; params -= lr (m / (1 - b1^t)) / (sqrt(v / (1 -
    b2^t)) + eps), lr and t read from `state`. m and v start at zero (a fresh buffer); grads are read only.
    1 - b and ln b go to the kernel from float64 (wgsl/optimizer.wgsl says why its bias corrections are not pow)."""
    data = dict(params=params, grads=grads, m=m, v=v)
    _check("adamw", n, data, **data, state=state)
    _state_ok("adamw", state)
    _betas(beta1, beta2, eps, weight_decay)
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    k = kernels.get("optimizer", "adamw", WG=WG, PER=PER)
    consts = (beta1, beta2, 1.0 - beta1, 1.0 - beta2, math.log(beta1), math.log(beta2), eps, weight_decay)
    ops = []
    for first, count in _chunks(device, n, max_binding):
        uni = device.uniform(_ADAM.pack(count, *(float(c) for c in consts), 0, 0, 0), f"{params.label}.adamw@{first}")
        spans = [_span(b, first, count) for b in (params, grads, m, v)]
        grid = groups_1d(count, WG, max_dim)
        ops.append(Op(k, device.bind(k, [*spans, state, uni], f"adamw {params.label}@{first}"), lambda t, g=grid: g))
    return ops


def sgd(device: gpu.Device, kernels, params: gpu.Buffer, grads: gpu.Buffer, state: gpu.Buffer, n: int, *,
        max_binding: int | None = None) -> list[Op]:
    """params[0:n] -= state.lr * grads[0:n]: the issue's `--optimizer sgd`, W <- W - lr grad (no momentum, no decay,
    no clipping: state.clip is not read)."""
    _check("sgd", n, dict(params=params, grads=grads), params=params, grads=grads, state=state)
    _state_ok("sgd", state)
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    k = kernels.get("optimizer", "sgd", WG=WG, PER=PER)
    ops = []
    for first, count in _chunks(device, n, max_binding):
        uni = device.uniform(_SGD.pack(count, 0, 0, 0), f"{params.label}.sgd@{first}")
        spans = [_span(params, first, count), _span(grads, first, count)]
        grid = groups_1d(count, WG, max_dim)
        ops.append(Op(k, device.bind(k, [*spans, state, uni], f"sgd {params.label}@{first}"), lambda t, g=grid: g))
    return ops


def schedule(step: int, *, lr: float, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """The learning rate of step `step` (1-based): a linear warm-up, lr * step / warmup for step = 1 .. warmup (step 1
    already moves; step `warmup` reaches lr), then a half cosine from lr at step `warmup` down to lr * min_ratio at
    step `total`, lr_min + (lr - lr_min) (1 + cos(pi (step - warmup) / (total - warmup))) / 2, and lr * min_ratio
    past `total`. warmup = 0: no warm-up (step 1 is already 1 / total into the cosine)."""
    if step < 1 or warmup < 0 or total < warmup or not 0.0 <= min_ratio <= 1.0 or lr < 0:
        raise ValueError(f"schedule: step={step} (>= 1), warmup={warmup} (>= 0), total={total} (>= warmup), "
                         f"min_ratio={min_ratio} (0..1), lr={lr} (>= 0)")
    if step <= warmup:
        return lr * step / warmup
    low = lr * min_ratio
    if step >= total:
        return low
    progress = (step - warmup) / (total - warmup)
    return low + (lr - low) * 0.5 * (1.0 + math.cos(math.pi * progress))
