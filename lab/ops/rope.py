"""RoPE builder (wgsl/rope.wgsl): both pairings, partial rotary dims, strided rows of a fused QKV buffer."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from lab import gpu
from lab.ops import KV_WRITE, Op
from lab.ops.attention import KV_TYPES, kv_consts

WG = 64
PARAMS = struct.Struct("<8I")   # n_head, head_dim, half, row_stride, col_offset, n_q_head, n_ctx, _p
MODES = {"adjacent": "rope_adjacent", "norm": "rope_adjacent", 0: "rope_adjacent",   # llama.cpp calls mode 0 "norm"
         "neox": "rope_neox", 2: "rope_neox"}


def frequencies(n_rot: int, freq_base: float, freq_scale: float = 1.0, freq_factors=None) -> list[float]:
    """freqs[i] = freq_scale * base^(-2i/n_rot) / factor_i, i < n_rot/2, in double precision (the kernel
    multiplies by the position once, so theta carries a single f32 rounding)."""
    half = n_rot // 2
    factors = [1.0] * half if freq_factors is None else [float(f) for f in freq_factors]
    if len(factors) != half:
        raise ValueError(f"rope: {len(factors)} frequency factors for {half} rotary pairs")
    return [freq_scale * freq_base ** (-2.0 * i / n_rot) / factors[i] for i in range(half)]


def checked_rot(label: str, mode: str, head_dim: int, n_rot: int | None) -> int:
    """The rotated dims (None: the whole head), refused unless even and within the head, or the mode unknown."""
    if mode not in MODES:
        raise ValueError(f"{label}: unknown mode {mode!r} (adjacent/norm/0 or neox/2)")
    n_rot = head_dim if n_rot is None else int(n_rot)
    if n_rot <= 0 or n_rot % 2 or n_rot > head_dim:
        raise ValueError(f"{label}: n_rot={n_rot} must be even and at most head_dim={head_dim}")
    return n_rot


def frequency_table(device: gpu.Device, label: str, n_rot: int, freq_base: float, freq_scale: float,
                    freq_factors) -> gpu.Buffer:
    """The n_rot / 2 frequencies (`frequencies`) in a constant buffer: what the rotation and its backward read."""
    half = n_rot // 2
    table = device.buffer(4 * half, gpu.CONSTANT, label)
    device.write(table, struct.pack(f"<{half}f", *frequencies(n_rot, freq_base, freq_scale, freq_factors)))
    return table


def rope(device: gpu.Device, kernels, x: gpu.Buffer, step: gpu.Buffer, n_head: int, head_dim: int,
         n_rot: int | None = None, freq_base: float = 10000.0, freq_scale: float = 1.0, mode="neox",
         row_stride: int | None = None, col_offset: int = 0, freq_factors=None,
         cache: tuple[gpu.Buffer, gpu.Buffer, int, int] | None = None, kv: str = "f32") -> list[Op]:
    """Rotate n_head heads of head_dim floats in place; token j of the step sits at position step.pos + j.

    mode "adjacent" (or llama.cpp's 0 / "norm") pairs (2i, 2i+1); "neox" (or 2) pairs (i, i + n_rot/2). Only the first
    n_rot dims of each head rotate (default: all). Head h of token row j starts at float
    j*row_stride + col_offset + h*head_dim; row_stride defaults to n_head*head_dim. In a fused QKV buffer
    [t, (nh + 2*nkv)*hd] the K heads follow the Q heads, so one op with n_head = nh + nkv, col_offset 0,
    row_stride (nh + 2*nkv)*hd rotates both (or build one op per part). freq_factors: llama.cpp's
    rope_freqs (theta divided by factor_i), optional.

    cache=(k_cache, v_cache, n_q_head, n_ctx): the row is a fused [q | k | v] row whose first n_q_head heads are Q,
    the rest of the n_head K, and V follows them; the op also writes each token's rotated K and its V into cache
    row pos + j ([n_ctx, kvd] of element type `kv`, lab/ops/attention.py KV_TYPES). Its role is KV_WRITE, and
    `without_kv` is the same rotation without the writes (the probes replay cached positions with it)."""
    n_rot = checked_rot("rope", mode, head_dim, n_rot)
    row_stride = n_head * head_dim if row_stride is None else int(row_stride)
    half = n_rot // 2
    table = frequency_table(device, "rope.freqs", n_rot, freq_base, freq_scale, freq_factors)
    n_q, n_ctx = (cache[2], cache[3]) if cache else (n_head, 0)
    params = device.uniform(PARAMS.pack(n_head, head_dim, half, row_stride, col_offset, n_q, n_ctx, 0), "rope.params")
    kvc = kv_consts(kv if cache else "f32")
    k = kernels.get("rope", MODES[mode], WG=WG, **kvc)
    gx = -(-(n_head * half) // WG)
    plain = Op(k, device.bind(k, [x, table, params, step], MODES[mode]), lambda t: (gx, max(1, t), 1))
    if cache is None:
        return [plain]
    k_cache, v_cache = cache[0], cache[1]
    n_kv = n_head - n_q
    if head_dim % 4:
        raise ValueError(f"rope: a cache write takes heads of a multiple of 4 values, not {head_dim}")
    if kv == "f16" and MODES[mode] == "rope_neox" and half % 2:
        raise ValueError(f"rope: an f16 cache of neox pairs needs n_rot a multiple of 4 (whole words), not {n_rot}")
    if not 0 < n_kv <= n_q:
        raise ValueError(f"rope: {n_q} Q heads of {n_head} leave {n_kv} K heads (1 to {n_q})")
    if row_stride < col_offset + (n_head + n_kv) * head_dim:
        raise ValueError(f"rope: the V heads run past the row ({row_stride} floats)")
    for buf, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        need = KV_TYPES[kv] * n_ctx * n_kv * head_dim
        if buf.size < need:
            raise ValueError(f"rope: {name} holds {buf.size} bytes, needs {need}")
    entry = MODES[mode].replace("rope_", "rope_kv_")
    kk = kernels.get("rope", entry, WG=WG, **kvc)
    gxk = -(-(n_head * (head_dim // 4)) // WG)      # two slots an invocation (wgsl/rope.wgsl rotate_kv)
    return [Op(kk, device.bind(kk, [x, table, params, step, k_cache, v_cache], entry), lambda t: (gxk, max(1, t), 1),
               KV_WRITE, without_kv=plain)]


# -- RoPE in the QKV projection's epilogue (decode; wgsl/matvec.wgsl ROPE) -----------------------------------------
MAX_FUSED_PAIRS = 128            # RopeParams.f holds 32 vec4s of frequencies
FUSED_PARAMS = struct.Struct("<8I")      # n_q, n_kv, head_dim, n_rot, n_ctx, write_kv, neox, pad; then 128 f32


@dataclass(frozen=True)
class QkvRope:
    """What matvec's ROPE epilogue needs to rotate a fused [q | k | v] row at step.pos (adjacent pairs, or NeoX's
    (i, i + n_rot / 2) with neox=True) and write its K and V into cache row pos: models without q/k norms (a norm
    would sit between projection and rotation)."""
    n_q: int                 # Q heads (rotated), then n_kv K heads (rotated and cached), then n_kv V heads (cached)
    n_kv: int
    head_dim: int
    n_rot: int
    freqs: tuple[float, ...]
    step: gpu.Buffer
    k_cache: gpu.Buffer
    v_cache: gpu.Buffer
    n_ctx: int
    kv: str = "f32"          # the caches' element type (lab/ops/attention.py KV_TYPES)
    neox: bool = False       # NeoX pairs: n_rot and head_dim multiples of 4, every part of the weight on a head

    def params(self, write_kv: bool) -> bytes:
        if len(self.freqs) > MAX_FUSED_PAIRS:
            raise ValueError(f"rope: {len(self.freqs)} rotary pairs; the fused epilogue holds {MAX_FUSED_PAIRS}")
        f = list(self.freqs) + [0.0] * (MAX_FUSED_PAIRS - len(self.freqs))
        return FUSED_PARAMS.pack(self.n_q, self.n_kv, self.head_dim, self.n_rot, self.n_ctx, int(write_kv),
                                 int(self.neox), 0) \
            + struct.pack(f"<{MAX_FUSED_PAIRS}f", *f)
