"""The short conv's backward builder (issue #43, training in the tab; wgsl/backward_shortconv.wgsl): the gradients of
lab.ops.shortconv's two modes, LFM2's gated y = C * conv(B * x) through the in_proj rows [B | C | x] it read, and
Qwen3.5's y = silu(conv(x)) through the first n floats of the delta-net's in-projection rows (its q k v), and of the
conv kernel (full fine-tuning), for a training window of t tokens.

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
from lab.ops.shortconv import row_stride

WG = 64
PARAMS = struct.Struct("<4I")   # n, stride, _p0, _p1
# lavapipe stops an invocation's loops silently past 32,768 iterations (tests/kernels/test_loop_budget.py)
LOOP_LIMIT = 32_767


def dw_iterations(max_tokens: int, l_cache: int, mode: str = "gated") -> int:
    """Loop iterations of one shortconv_dw (silu_dw) invocation over a window of max_tokens: per token the window's
    shift (l_cache - 1), (silu: the pre-activation's l_cache products) and the taps' sums (l_cache) plus the token
    loop's own, then the l_cache adds into dw."""
    return max_tokens * (3 if mode == "silu" else 2) * l_cache + l_cache


def shortconv_back(device: gpu.Device, kernels, bcx: gpu.Buffer, weight: gpu.Buffer, dy: gpu.Buffer,
                   dbcx: gpu.Buffer, dw: gpu.Buffer | None, step: gpu.Buffer, *, n: int, l_cache: int,
                   max_tokens: int, mode: str = "gated", stride: int | None = None,
                   label: str = "shortconv_back") -> list[Op]:
    """For the step's t tokens (a window from position 0), mode "gated": dbcx [t, 3n] = [dB | dC | dx] written, given
    the forward's in_proj rows bcx [t, 3n]; mode "silu": the first n floats of each row of dbcx [t, stride] written
    (the rest left as they are), given rows bcx [t, stride] whose first n floats are the conv's input. Both from the
    conv kernel weight [n, l_cache] f32 and the gradient at y, dy [t, n]; with dw ([n, l_cache] f32: full
    fine-tuning) the kernel's gradient added into it, a second op after the first."""
    stride = row_stride(mode, n, stride, label)
    if l_cache < 2:
        raise ValueError(f"{label}: l_cache {l_cache} must be at least 2")
    if dbcx is bcx or dbcx is dy or dw is not None and dw in (bcx, dy, dbcx, weight):
        raise ValueError(f"{label}: the gradients must be buffers of their own (WebGPU refuses a buffer bound "
                         f"read-only and writable in one dispatch)")
    for buf, floats, what in ((bcx, stride * max_tokens, f"bcx [T, {stride}]"), (dy, n * max_tokens, "dy [T, n]"),
                              (dbcx, stride * max_tokens, f"dbcx [T, {stride}]"),
                              (weight, n * l_cache, "the conv weight"), (dw, n * l_cache, "dw")):
        if buf is not None and buf.size < 4 * floats:
            raise ValueError(f"{label}: {what} holds {buf.size} bytes, {4 * floats} needed for {max_tokens} tokens "
                             f"of n = {n}, l_cache = {l_cache}")
    if dw is not None and device.info.loop_budget and dw_iterations(max_tokens, l_cache, mode) > LOOP_LIMIT:
        raise gpu.GpuError(f"{label}: a window of {max_tokens} tokens runs the conv weight's gradient past "
                           f"{LOOP_LIMIT:,} loop iterations an invocation, where {device.info.name} stops loops")
    params = device.uniform(PARAMS.pack(n, stride, 0, 0), f"{label}.params")
    gx = -(-n // WG)
    dx_entry, dw_entry = ("shortconv_dx", "shortconv_dw") if mode == "gated" else ("silu_dx", "silu_dw")
    k_dx = kernels.get("backward_shortconv", dx_entry, WG=WG, LC=l_cache)
    out = [Op(k_dx, device.bind(k_dx, [bcx, dy, params, step, weight, dbcx], f"{label}.dx"),
              lambda t: (gx, max(1, t), 1))]
    if dw is not None:
        k_dw = kernels.get("backward_shortconv", dw_entry, WG=WG, LC=l_cache)
        dw_bufs = [bcx, dy, params, step, dw] if mode == "gated" else [bcx, dy, params, step, weight, dw]
        out.append(Op(k_dw, device.bind(k_dw, dw_bufs, f"{label}.dw"), lambda t: (gx, 1, 1)))
    return out
