"""Qwen3.5's gated delta-net backward builder (issue #43, training in the tab; wgsl/backward_deltanet.wgsl): the
gradients of lab.ops.deltanet's recurrence and gated norm, from the gradient at the gated norm's output, through the
in-projection row's z, beta and alpha columns and the conv's output (q, k, v), and, in full fine-tuning, of dt's bias,
A and the gated norm's weight, for a training window of t tokens.

A training window starts at position 0 from a zero state (lab.instruments.training writes pos 0 for every window),
so the backward reads no state and no gradient flows into one (what the step's forward leaves in the state is its
own, as an attention layer's KV writes are). The conv in front of it takes lab.ops.backward_shortconv's silu mode,
the projections around it lab.ops.backward_matmul's.

The states in reverse. The recurrence's backward carries the state's gradient dS from the window's last token to its
first, and each token's step reads the state before it. Keeping every state costs t n_v_heads S^2 floats a layer:
Qwen3.5-0.8B (16 value heads of 128) holds 1 MiB a token, 512 MiB a layer at t = 512, past a WebGPU binding. So the
window is cut into chunks of CHUNK tokens: a forward pass keeps the state at each chunk's end (checkpoints), and the
backward, a chunk at a time from the last, computes the chunk's states again from its checkpoint and walks its
tokens backward. The states held are (ceil(t / CHUNK) - 1) checkpoints and CHUNK states of one chunk, n_v_heads S^2
floats each, for the layer in hand (the layers' backward runs one at a time, so one set serves them all): at
t = 512 for Qwen3.5-0.8B, 31 + 16 states and dS, 48 MiB, and 32 MiB of rows of t; 1.2 MiB in all for the synthetic
qwen35 file (2 key and 4 value heads of 64) at t = 16.
The cost is one more forward scan (the checkpoints' pass) and, inside the backward, the chunk's again: the
recurrence runs three times a step where it ran once. `scratch_floats` is the whole layout, counted by the training
budget (lab.engine.backward.TrainScratch) before anything is made.

Conventions as lab/ops/backward.py's: the input gradients (dproj's z, beta and alpha columns, dconv) are written, the
parameters' (dnorm_w, ddt, da) added into; every sum runs in a fixed order. lab/host/reference/grads_deltanet.py holds
the float64 oracle and the tolerance; tests/kernels/test_backward_deltanet.py checks the kernels against it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from lab import gpu
from lab.ops import Op
from lab.ops.deltanet import MAX_HEAD, MIN_HEAD

CHUNK = 16          # tokens a chunk: a chunk's states again and its backward in one invocation stay within lavapipe's
                    # loop budget at heads of 256 (`back_iterations`)
WG = 64             # threads of the per-row entries
GATES = 8           # floats of a (token, value head) in the gates' scratch
# n_k_heads, n_v_heads, proj_stride, z_offset, beta_offset, alpha_offset, chunk, _p0, eps, _p1, _p2, _p3
PARAMS = struct.Struct("<8If3I")
# lavapipe stops an invocation's loops silently past 32,768 iterations (tests/kernels/test_loop_budget.py)
LOOP_LIMIT = 32_767
STORAGE = 7         # the most storage buffers an entry binds (delta_prep, delta_back)


def chunks(max_tokens: int) -> int:
    """The chunks of a window of max_tokens."""
    return -(-max_tokens // CHUNK)


def back_iterations(head_dim: int) -> int:
    """Loop iterations of one delta_back invocation (the longest walk): a chunk's states again (2 loops of S a token,
    and the checkpoint's S), dS's S, then per token 3 loops of S over a column, one over a row and thread 0's sum."""
    S = head_dim
    return S + CHUNK * (2 * S + 1) + S + CHUNK * (5 * S + 1) + S


def scratch_floats(max_tokens: int, n_k_heads: int, n_v_heads: int, head_dim: int) -> dict[str, int]:
    """Floats of each scratch buffer for windows of up to max_tokens (T), K = n_k_heads S, V = n_v_heads S:
    qkv [T, 2K + V] (q and k L2-normed, v), inv [T, 2 n_k_heads] (1/|x| of each), gates [T, n_v_heads, 8], o and do
    [T, V] (the read-out before the gated norm, its gradient), rs [T, n_v_heads] (the gated norm's 1/rms), dqkv
    [T, n_v_heads, 3S] (each value head's dq, dk, dv), ckpt [max(1, chunks - 1), n_v_heads, S, S] (the states at the
    chunks' ends), chunk [n_v_heads, CHUNK, S, S] (a chunk's states again), ds [n_v_heads, S, S] (dS carried back)."""
    T, S, nk, nv = max_tokens, head_dim, n_k_heads, n_v_heads
    K, V, state = nk * S, nv * S, nv * S * S
    return {"qkv": T * (2 * K + V), "inv": T * 2 * nk, "gates": T * nv * GATES, "o": T * V, "do": T * V,
            "rs": T * nv, "dqkv": T * nv * 3 * S, "ckpt": max(1, chunks(T) - 1) * state, "chunk": CHUNK * state,
            "ds": state}


@dataclass(frozen=True)
class DeltaScratch:
    """The backward's own buffers (`scratch_floats`), one set for every delta-net layer of a model."""
    qkv: gpu.Buffer
    inv: gpu.Buffer
    gates: gpu.Buffer
    o: gpu.Buffer
    do: gpu.Buffer
    rs: gpu.Buffer
    dqkv: gpu.Buffer
    ckpt: gpu.Buffer
    chunk: gpu.Buffer
    ds: gpu.Buffer

    @classmethod
    def alloc(cls, device: gpu.Device, max_tokens: int, n_k_heads: int, n_v_heads: int, head_dim: int,
              kind: str = gpu.CONVERSATION, label: str = "delta back") -> DeltaScratch:
        floats = scratch_floats(max_tokens, n_k_heads, n_v_heads, head_dim)
        return cls(**{name: device.buffer(4 * n, kind, f"{label} {name} [{n}]") for name, n in floats.items()})


def _check(device: gpu.Device, label: str, *, S: int, nk: int, nv: int, T: int, proj_stride: int, offsets: dict,
           bufs: dict, scratch: DeltaScratch) -> None:
    """deltanet_back's arguments, refused in words before any op is made: the head size, the heads' ratio, the
    projection's columns, every buffer's size for T tokens, no buffer both read and written, the device's storage
    bindings and (SwiftShader, lavapipe) its loop budget."""
    if not (MIN_HEAD <= S <= MAX_HEAD and S % 16 == 0):
        raise ValueError(f"{label}: head_dim {S} must be a multiple of 16 in {MIN_HEAD}..{MAX_HEAD}")
    if nk < 1 or nv % nk:
        raise ValueError(f"{label}: {nv} value heads are not a multiple of {nk} key heads")
    full = [bufs[k] is not None for k in ("dnorm_w", "ddt", "da")]
    if any(full) != all(full):
        raise ValueError(f"{label}: the parameters' gradients come together (full fine-tuning) or not at all")
    K, V = nk * S, nv * S
    cw = 2 * K + V
    for name, (offset, width) in offsets.items():
        if offset < 0 or offset + width > proj_stride:
            raise ValueError(f"{label}: {name} [{width}] at {offset} does not fit proj rows of {proj_stride} floats")
    need = {"proj": T * proj_stride, "conv": T * cw, "dy": T * V, "dproj": T * proj_stride, "dconv": T * cw,
            "dt_bias": nv, "ssm_a": nv, "norm_w": S, "dnorm_w": S, "ddt": nv, "da": nv}
    sized = [(k, bufs[k], n) for k, n in need.items()]
    sized += [(f"scratch {k}", getattr(scratch, k), n) for k, n in scratch_floats(T, nk, nv, S).items()]
    for name, buf, n in sized:
        if buf is not None and buf.size < 4 * n:
            raise ValueError(f"{label}: {name} holds {buf.size} bytes, {4 * n} needed for {T} tokens")
    reads = [bufs[k] for k in ("proj", "conv", "dt_bias", "ssm_a", "norm_w", "dy")]
    writes = [bufs["dproj"], bufs["dconv"], *(bufs[k] for k in ("dnorm_w", "ddt", "da") if bufs[k] is not None),
              *vars(scratch).values()]
    if any(w is r for w in writes for r in reads) or len({id(w) for w in writes}) < len(writes):
        raise ValueError(f"{label}: the gradients and the scratch must be buffers of their own (WebGPU refuses a "
                         f"buffer bound read-only and writable in one dispatch)")
    if device.info.limits["max_storage_buffers_per_shader_stage"] < STORAGE:
        raise gpu.GpuError(f"{label}: the kernels bind {STORAGE} storage buffers, {device.info.name} allows "
                           f"{device.info.limits['max_storage_buffers_per_shader_stage']}")
    if device.info.loop_budget:
        walks = {"a chunk's backward": back_iterations(S)}
        if all(full):           # full fine-tuning's sums over the window: (token, head) pairs, tokens
            walks.update({"the gated norm's weight": T * nv + T, "dt's bias and A": T})
        for what, n in walks.items():
            if n > LOOP_LIMIT:
                raise gpu.GpuError(f"{label}: {what} runs {n:,} loop iterations an invocation at {T} tokens and "
                                   f"{nv} heads of {S}, past the {LOOP_LIMIT:,} where {device.info.name} stops loops")


def deltanet_back(device: gpu.Device, kernels, proj: gpu.Buffer, conv: gpu.Buffer, dt_bias: gpu.Buffer,
                  ssm_a: gpu.Buffer, norm_w: gpu.Buffer, dy: gpu.Buffer, dproj: gpu.Buffer, dconv: gpu.Buffer,
                  scratch: DeltaScratch, step: gpu.Buffer, *, n_k_heads: int, n_v_heads: int, head_dim: int,
                  proj_stride: int, z_offset: int, beta_offset: int, alpha_offset: int, eps: float, max_tokens: int,
                  dnorm_w: gpu.Buffer | None = None, ddt: gpu.Buffer | None = None, da: gpu.Buffer | None = None,
                  label: str = "deltanet_back") -> list[Op]:
    """For the step's t tokens (a window from position 0), given the forward's in-projection rows proj [t,
    proj_stride] (z, beta, alpha read at their offsets), the conv's output conv [t, 2K + V], dt_bias and ssm_a
    [n_v_heads], norm_w [S] and the gradient at the gated norm's output dy [t, V]: dproj's z, beta and alpha columns
    and dconv [t, 2K + V] written; with dnorm_w [S], ddt and da [n_v_heads] (full fine-tuning) their gradients added
    into them. The ops in order: the inputs prepared, the chunks forward, the gated norm's backward, the chunks
    backward (last first), the key heads' and gates' gradients into dconv and dproj, then the parameters'."""
    S, nk, nv = head_dim, n_k_heads, n_v_heads
    V = nv * S
    T = max_tokens
    _check(device, label, S=S, nk=nk, nv=nv, T=T, proj_stride=proj_stride,
           offsets={"z": (z_offset, V), "beta": (beta_offset, nv), "alpha": (alpha_offset, nv)},
           bufs={"proj": proj, "conv": conv, "dy": dy, "dproj": dproj, "dconv": dconv, "dt_bias": dt_bias,
                 "ssm_a": ssm_a, "norm_w": norm_w, "dnorm_w": dnorm_w, "ddt": ddt, "da": da}, scratch=scratch)

    def kernel(entry: str):
        return kernels.get("backward_deltanet", entry, S=S, C=CHUNK, WG=WG)

    def params(chunk: int = 0):
        return device.uniform(PARAMS.pack(nk, nv, proj_stride, z_offset, beta_offset, alpha_offset, chunk, 0, eps,
                                          0, 0, 0), f"{label}.params {chunk}")

    def op(entry: str, buffers: list, grid, what: str = "") -> Op:
        k = kernel(entry)
        return Op(k, device.bind(k, buffers, f"{label}.{entry}{what}"), grid)

    sc, p0 = scratch, params()
    rows = lambda t: (-(-(2 * nk + nv) // WG), max(1, t), 1)       # noqa: E731  a key vector or value head a token
    heads = lambda t: (-(-nv // WG), max(1, t), 1)                  # noqa: E731

    def chunk_grid(c: int):
        return lambda t: (nv if c * CHUNK < max(1, t) else 0, 1, 1)

    n = chunks(T)
    chunk_params = [params(c) for c in range(n)]
    out = [op("delta_prep", [proj, conv, dt_bias, ssm_a, sc.qkv, sc.inv, sc.gates, p0, step], rows)]
    out += [op("delta_fwd", [sc.qkv, sc.gates, sc.ckpt, sc.o, chunk_params[c], step], chunk_grid(c), f" {c}")
            for c in range(n)]
    out.append(op("delta_norm_back", [proj, sc.o, norm_w, dy, sc.do, dproj, sc.rs, p0, step], heads))
    if dnorm_w is not None:
        out.append(op("delta_norm_dw", [proj, sc.o, sc.rs, dy, dnorm_w, p0, step], lambda t: (-(-S // WG), 1, 1)))
    out += [op("delta_back", [sc.qkv, sc.gates, sc.ckpt, sc.do, sc.chunk, sc.ds, sc.dqkv, chunk_params[c], step],
               chunk_grid(c), f" {c}") for c in reversed(range(n))]
    out.append(op("delta_qk_back", [sc.dqkv, sc.qkv, sc.inv, sc.gates, dconv, dproj, p0, step], rows))
    if ddt is not None:
        out.append(op("delta_param_back", [sc.gates, ddt, da, p0, step], lambda t: (-(-nv // WG), 1, 1)))
    return out
