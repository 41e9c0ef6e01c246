"""Qwen3.5's gated delta-net recurrence (wgsl/deltanet.wgsl): from a delta-net layer's in-projection rows (z, beta,
alpha) and its conv output (q, k, v), the L2-normed q and k, the beta gate and the decay, the delta-rule update of
each value head's S x S state, the read-out by q and the gated RMS norm, token by token in one dispatch, for a whole
prefill chunk or one decode token alike, with the layer's state read and written in the same pass.

What it does not know: which layer it serves, the projections around it (lab.engine.plans), the conv before it
(lab.ops.shortconv, mode "silu"), or snapshots of the state (lab.engine.scratch, lab.engine.session).
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.gpu.shaders import subgroup_consts
from lab.ops import Op

# n_k_heads, n_v_heads, proj_stride, z_offset, beta_offset, alpha_offset, eps, _p0
PARAMS = struct.Struct("<6IfI")
MIN_HEAD, MAX_HEAD = 16, 256     # S, a multiple of 16: S lanes(S) threads a workgroup, at most WebGPU's default 256
MAX_LANES = 4                    # lanes a column: adjacent lanes of one subgroup (WGSL's subgroups hold 4 at least)


def lanes(device: gpu.Device, head_dim: int) -> int:
    """The lanes that split each column's rows (wgsl/deltanet.wgsl's P, the header says why): the largest power of two
    (their partial sums meet by a butterfly of subgroup shuffles; it divides S / 4) that keeps S P threads within 256,
    at most MAX_LANES; 1 without subgroups."""
    if "subgroups" not in device.info.features:
        return 1
    p = 1
    while 2 * p <= MAX_LANES and 2 * p * head_dim <= 256:
        p *= 2
    return p


def state_bytes(n_v_heads: int, head_dim: int) -> int:
    """The recurrent state of one layer: [n_v_heads, S, S] f32, state[(h S + r) S + c] = S_h[r][c]."""
    return 4 * n_v_heads * head_dim * head_dim


def deltanet(device: gpu.Device, kernels, proj: gpu.Buffer, conv: gpu.Buffer, dt_bias: gpu.Buffer,
             ssm_a: gpu.Buffer, norm_w: gpu.Buffer, state: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer, *,
             n_k_heads: int, n_v_heads: int, head_dim: int, proj_stride: int, z_offset: int, beta_offset: int,
             alpha_offset: int, eps: float, label: str = "deltanet") -> list[Op]:
    """out [t, n_v_heads S] for the step's t tokens at step.pos, S = head_dim, K = n_k_heads S: proj rows of
    proj_stride floats (z [n_v_heads S] at z_offset, beta and alpha [n_v_heads] at their offsets), conv rows [2K +
    n_v_heads S] (q | k | v), dt_bias and ssm_a [n_v_heads], norm_w [S], state [n_v_heads, S, S] (read unless
    step.pos is 0, then written). Value head h reads key head h % n_k_heads; eps is both the L2 norms' and the gated
    RMS norm's (the model's rms eps)."""
    S, nk, nv = head_dim, n_k_heads, n_v_heads
    if not (MIN_HEAD <= S <= MAX_HEAD and S % 16 == 0):
        raise ValueError(f"{label}: head_dim {S} must be a multiple of 16 in {MIN_HEAD}..{MAX_HEAD}")
    if nk < 1 or nv % nk:
        raise ValueError(f"{label}: {nv} value heads are not a multiple of {nk} key heads")
    for name, offset, width in (("z", z_offset, nv * S), ("beta", beta_offset, nv), ("alpha", alpha_offset, nv)):
        if offset < 0 or offset + width > proj_stride:
            raise ValueError(f"{label}: {name} [{width}] at {offset} does not fit proj rows of {proj_stride} floats")
    conv_width = 2 * nk * S + nv * S
    for name, buf, need in (("proj", proj, proj_stride), ("conv", conv, conv_width), ("dt_bias", dt_bias, nv),
                            ("ssm_a", ssm_a, nv), ("norm_w", norm_w, S), ("out", out, nv * S)):
        if buf.size < 4 * need:
            raise ValueError(f"{label}: {name} holds {buf.size} bytes, less than {need} f32")
    if state.size < state_bytes(nv, S):
        raise ValueError(f"{label}: the state holds {state.size} bytes, [{nv}, {S}, {S}] f32 needs "
                         f"{state_bytes(nv, S)}")
    if any(out is b for b in (proj, conv, dt_bias, ssm_a, norm_w, state)):
        raise ValueError(f"{label}: out must be a buffer of its own")
    if any(state is b for b in (proj, conv, dt_bias, ssm_a, norm_w)):
        raise ValueError(f"{label}: the state must be a buffer of its own")
    k = kernels.get("deltanet", S=S, P=lanes(device, S), **subgroup_consts(device))
    params = device.uniform(PARAMS.pack(nk, nv, proj_stride, z_offset, beta_offset, alpha_offset, eps, 0),
                            f"{label}.params")
    bound = device.bind(k, [proj, conv, dt_bias, ssm_a, norm_w, state, out, params, step], label)
    return [Op(k, bound, lambda t: (nv, 1, 1))]
