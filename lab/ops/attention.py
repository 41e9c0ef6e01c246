"""Attention and the KV-cache write (wgsl/attention.wgsl, wgsl/kv.wgsl).

KV cache, one layer: two f32 buffers, K and V, each [n_ctx, n_kv_head * head_dim] row-major; row p holds the
key (value) of the token at position p, heads side by side (head g at columns g*head_dim ..). `kv_write` fills
rows pos .. pos+t-1 of a step from any token-major source (the fused QKV output included); `attention` reads
rows 0 .. pos+t-1.

Attention, for token j of the step (position qpos = pos + j) and query head h, with GROUP = n_head / n_kv_head:
    kv = h // GROUP;  s_k = cap(scale * q . k_k), cap(x) = c * tanh(x / c) when softcap c > 0
    key k visible iff k <= qpos and (window W == 0 or qpos - k < W)      (llama.cpp's standard sliding window)
    out[j, h*hd : (h+1)*hd] = sum_k softmax(s)_k v_k                      (out is [t, n_head * head_dim])

Probe (optional): the attention probabilities, f32 [t, n_head, n_ctx]: P(token j, head h, key k) at
(j * n_head + h) * n_ctx + k, zero for keys the token does not see; each row sums to 1. A separate pipeline
variant (constant PROBE); without a probe the kernel has no probe binding and no probe code.

Two entries (see the WGSL header for their organisation): `decode` (a workgroup per head and token; best for one
token) and `prefill` (a workgroup per block of query rows of one KV head; K/V tiles shared by the rows). Both are
correct for any t; `attention(mode="auto")` returns one op of each with complementary grids, so that a step of
one token runs only decode and a longer step only prefill (the other op's grid is (0, 0, 0): a no-op dispatch).
"""

from __future__ import annotations

import math
import struct

from .. import gpu
from . import Op, groups_1d

KV_WG = 64
WG = 64            # threads per attention workgroup (a power of two)
TK = 256           # decode: keys per tile
Q_FLOATS = 1024    # prefill: floats of Q per workgroup (BQ = Q_FLOATS / head_dim rows, at most 16)
KV_FLOATS = 2048   # prefill: floats of one K or V tile (BK = KV_FLOATS / head_dim keys, at most 32)

_KV_PARAMS = struct.Struct("<8I")
_ATTN_PARAMS = struct.Struct("<5I2fI")


def kv_cache_bytes(n_ctx: int, n_kv_head: int, head_dim: int) -> int:
    """Bytes of one of a layer's two caches (K or V)."""
    return 4 * n_ctx * n_kv_head * head_dim


def probe_bytes(max_tokens: int, n_head: int, n_ctx: int) -> int:
    """Bytes of a probe buffer for steps of up to `max_tokens` tokens."""
    return 4 * max_tokens * n_head * n_ctx


def _size(buf) -> int:
    return buf.size


def kv_write(device: gpu.Device, kernels, src, k_cache, v_cache, step, *, n_kv_head: int, head_dim: int,
             src_stride: int, k_offset: int, v_offset: int, n_ctx: int, label: str = "kv_write") -> list[Op]:
    """Copy the step's t K rows (at src[j*src_stride + k_offset ..]) and V rows (at v_offset) into cache rows
    pos .. pos+t-1. Strides and offsets are in floats."""
    kvd = n_kv_head * head_dim
    for buf, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if _size(buf) < kv_cache_bytes(n_ctx, n_kv_head, head_dim):
            raise ValueError(f"{label}: {name} holds {_size(buf)} bytes, needs {kv_cache_bytes(n_ctx, n_kv_head, head_dim)}")
    if max(k_offset, v_offset) + kvd > src_stride:
        raise ValueError(f"{label}: K/V columns run past the source row ({src_stride} floats)")
    kernel = kernels.get("kv", "kv_write", WG=KV_WG)
    params = device.uniform(_KV_PARAMS.pack(kvd, src_stride, k_offset, v_offset, n_ctx, 0, 0, 0), f"{label}.params")
    bound = device.bind(kernel, [src, k_cache, v_cache, step, params], label)
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    return [Op(kernel, bound, lambda t: groups_1d(t * kvd, KV_WG, max_dim))]


def _consts(head_dim: int, group: int, n_kv_head: int, probe: bool) -> dict:
    hd4 = head_dim // 4
    n_parts = max(1, WG // hd4)
    bq = max(1, min(16, Q_FLOATS // head_dim))
    bk = max(1, min(32, KV_FLOATS // head_dim))
    return dict(HEAD_DIM=head_dim, GROUP=group, N_KV_HEAD=n_kv_head, WG=WG, TK=TK,
                NP=n_parts, DPT=-(-(hd4 * n_parts) // WG), BQ=bq, BK=bk, ACC=-(-(bq * hd4) // WG),
                PROBE=probe, PROBE_OFF="" if probe else "//")


def workgroup_bytes(head_dim: int) -> dict[str, int]:
    """Workgroup memory of each entry, for the limit check (WebGPU's default limit is 16 KiB)."""
    c = _consts(head_dim, 1, 1, False)
    hd4 = head_dim // 4
    return {"decode": 16 * hd4 + 4 * TK + 4 * WG + 16 * hd4 * c["NP"],
            "prefill": 16 * c["BQ"] * hd4 + 16 * c["BK"] * hd4 + 4 * c["BQ"] * c["BK"] + 12 * c["BQ"]}


def attention(device: gpu.Device, kernels, q_src, k_cache, v_cache, out, step, *, n_head: int, n_kv_head: int,
              head_dim: int, q_stride: int, q_offset: int, n_ctx: int, scale: float | None = None,
              window: int = 0, softcap: float = 0.0, probe=None, mode: str = "auto",
              label: str = "attention") -> list[Op]:
    """Attention of the step's t queries (Q of token j, head h at q_src[j*q_stride + q_offset + h*head_dim ..])
    over cache rows 0 .. pos+t-1, into `out` [t, n_head*head_dim]. `scale` defaults to 1/sqrt(head_dim);
    `window` W > 0 keeps keys with qpos - k < W; `softcap` c > 0 maps each scaled score s to c*tanh(s/c);
    `probe`, a buffer of probe_bytes(max t, n_head, n_ctx), receives the probabilities.
    `mode`: "decode" or "prefill" forces that entry for every t; "auto" uses decode for t == 1, prefill otherwise."""
    if n_head % n_kv_head:
        raise ValueError(f"{label}: n_head {n_head} is not a multiple of n_kv_head {n_kv_head}")
    if head_dim % 4:
        raise ValueError(f"{label}: head_dim {head_dim} is not a multiple of 4")
    if mode not in ("auto", "decode", "prefill"):
        raise ValueError(f"{label}: unknown mode {mode!r}")
    group = n_head // n_kv_head
    for buf, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if _size(buf) < kv_cache_bytes(n_ctx, n_kv_head, head_dim):
            raise ValueError(f"{label}: {name} is smaller than {n_ctx} rows")
    if q_offset + n_head * head_dim > q_stride:
        raise ValueError(f"{label}: Q columns run past the source row ({q_stride} floats)")
    limit = device.info.limits["max_compute_workgroup_storage_size"]
    for entry, need in workgroup_bytes(head_dim).items():
        if need > limit:
            raise gpu.GpuError(f"{label}: {entry} needs {need} bytes of workgroup memory, this GPU has {limit}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    consts = _consts(head_dim, group, n_kv_head, probe is not None)
    params = device.uniform(_ATTN_PARAMS.pack(q_stride, q_offset, n_head, n_ctx, window, scale, float(softcap), 0),
                            f"{label}.params")
    resources = [q_src, k_cache, v_cache, out, step, params] + ([probe] if probe is not None else [])
    bq = consts["BQ"]

    def decode_grid(t: int) -> tuple[int, int, int]:
        return (n_head, t, 1)

    def prefill_grid(t: int) -> tuple[int, int, int]:
        return (-(-(t * group) // bq), n_kv_head, 1)

    ops = []
    for entry, grid in (("decode", decode_grid), ("prefill", prefill_grid)):
        if mode not in ("auto", entry):
            continue
        kernel = kernels.get("attention", entry, **consts)
        bound = device.bind(kernel, resources, f"{label}.{entry}")
        if mode == "auto":
            grid = (lambda g, one: (lambda t: g(t) if (t == 1) == one else (0, 0, 0)))(grid, entry == "decode")
        ops.append(Op(kernel, bound, grid))
    return ops
