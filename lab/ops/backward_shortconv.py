"""LFM2's short-conv backward builder (issue #43, training in the tab; wgsl/backward_shortconv.wgsl): the gradients of
lab.ops.shortconv's gated mode, y = C * conv(B * x), through the in_proj rows [B | C | x] it read, and of its conv
kernel (full fine-tuning), for a training window of t tokens.

A training window starts at position 0 from a zero conv state (lab.instruments.training writes pos 0 for every
window), so nothing before the window reaches it and no gradient flows into a state: the backward reads no state
(what the step's forward leaves in the conv state is its own, as the KV writes of an attention layer are). The
projections around it (in_proj, out_proj) take lab.ops.backward_matmul's backward like every other projection, their
LoRA factors included.

Conventions as lab/ops/backward.py's: the input gradient (dbcx) is written, the weight's (dw) added into; every sum
runs in a fixed order. lab/host/reference/grads_shortconv.py holds the float64 oracle and the tolerances;
tests/kernels/test_backward_shortconv.py checks the kernels against it.
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.ops import Op

WG = 64
PARAMS = struct.Struct("<4I")   # n, _p0, _p1, _p2
# lavapipe stops an invocation's loops silently past 32,768 iterations (tests/kernels/test_loop_budget.py)
LOOP_LIMIT = 32_767


def dw_iterations(max_tokens: int, l_cache: int) -> int:
    """Loop iterations of one shortconv_dw invocation over a window of max_tokens: per token the window's shift
    (l_cache - 1) and the taps' sums (l_cache) plus the token loop's own, then the l_cache adds into dw."""
    return max_tokens * 2 * l_cache + l_cache


def shortconv_back(device: gpu.Device, kernels, bcx: gpu.Buffer, weight: gpu.Buffer, dy: gpu.Buffer,
                   dbcx: gpu.Buffer, dw: gpu.Buffer | None, step: gpu.Buffer, *, n: int, l_cache: int,
                   max_tokens: int, label: str = "shortconv_back") -> list[Op]:
    """For the step's t tokens (a window from position 0): dbcx [t, 3n] = [dB | dC | dx] written, given the forward's
    in_proj rows bcx [t, 3n], the conv kernel weight [n, l_cache] f32 and the gradient at y, dy [t, n]; with dw
    ([n, l_cache] f32: full fine-tuning) the kernel's gradient added into it, a second op after the first."""
    if l_cache < 2:
        raise ValueError(f"{label}: l_cache {l_cache} must be at least 2")
    if dbcx is bcx or dbcx is dy or dw is not None and dw in (bcx, dy, dbcx, weight):
        raise ValueError(f"{label}: the gradients must be buffers of their own (WebGPU refuses a buffer bound "
                         f"read-only and writable in one dispatch)")
    for buf, floats, what in ((bcx, 3 * n * max_tokens, "bcx [T, 3n]"), (dy, n * max_tokens, "dy [T, n]"),
                              (dbcx, 3 * n * max_tokens, "dbcx [T, 3n]"), (weight, n * l_cache, "the conv weight"),
                              (dw, n * l_cache, "dw")):
        if buf is not None and buf.size < 4 * floats:
            raise ValueError(f"{label}: {what} holds {buf.size} bytes, {4 * floats} needed for {max_tokens} tokens "
                             f"of n = {n}, l_cache = {l_cache}")
    if dw is not None and device.info.loop_budget and dw_iterations(max_tokens, l_cache) > LOOP_LIMIT:
        raise gpu.GpuError(f"{label}: a window of {max_tokens} tokens runs the conv weight's gradient past "
                           f"{LOOP_LIMIT:,} loop iterations an invocation, where {device.info.name} stops loops")
    params = device.uniform(PARAMS.pack(n, 0, 0, 0), f"{label}.params")
    gx = -(-n // WG)
    k_dx = kernels.get("backward_shortconv", "shortconv_dx", WG=WG, LC=l_cache)
    out = [Op(k_dx, device.bind(k_dx, [bcx, dy, params, step, weight, dbcx], f"{label}.dx"),
              lambda t: (gx, max(1, t), 1))]
    if dw is not None:
        k_dw = kernels.get("backward_shortconv", "shortconv_dw", WG=WG, LC=l_cache)
        out.append(Op(k_dw, device.bind(k_dw, [bcx, dy, params, step, dw], f"{label}.dw"), lambda t: (gx, 1, 1)))
    return out
