"""RMSNorm builder (wgsl/norm.wgsl): whole rows, or per head with a weight of head_dim (Gemma 3 q/k norm)."""

from __future__ import annotations

import struct

from lab import gpu
from lab.gpu.shaders import subgroup_consts
from lab.ops import Op

PARAMS = struct.Struct("<6IfI")   # group, n_groups, in_stride, in_offset, out_stride, out_offset, eps, split


def rms_norm(device: gpu.Device, kernels, x: gpu.Buffer, w: gpu.Buffer, y: gpu.Buffer, step: gpu.Buffer,
             n: int, eps: float, group: int | None = None,
             in_stride: int | None = None, in_offset: int = 0,
             out_stride: int | None = None, out_offset: int = 0, residual: gpu.Buffer | None = None,
             w2: gpu.Buffer | None = None, split: int = 0) -> list[Op]:
    """y = x / sqrt(mean(x^2) + eps) * w over each `group` floats of the first n floats of every token row.

    group=None normalises whole rows (group = n, w has n floats); group=head_dim normalises each head of a
    [t, n_head*head_dim] row with one shared weight of head_dim floats. Strides and offsets are in floats:
    row j is read from j*in_stride + in_offset (default stride n, e.g. Q inside a fused QKV row: stride
    (nh+2*nkv)*hd, offset 0; K: offset nh*hd) and written to j*out_stride + out_offset (default: compact n).
    `y is x` runs in place (then the output addressing is the input's). `residual` (compact [t, n]) also gets
    the normed values added to it. `w2`: groups from `split` on use this weight instead (Q then K heads)."""
    group = n if group is None else int(group)
    if group <= 0 or n % group:
        raise ValueError(f"rms_norm: n={n} is not a whole number of groups of {group}")
    n_groups = n // group
    in_stride = n if in_stride is None else int(in_stride)
    inplace = y is x
    if inplace:
        out_stride, out_offset = in_stride, in_offset
    else:
        out_stride = n if out_stride is None else int(out_stride)
    # SwiftShader pays per thread at each barrier (gpu.AdapterInfo.swiftshader): SmolLM2's 61 norms of a 37-token
    # prefill took 853 ms at 256 threads
    wg = (gpu.SWIFTSHADER_WG if device.info.swiftshader else
          64 if group <= 64 else (128 if group <= 128 else 256))
    if w2 is not None and not 0 < split < n_groups:
        raise ValueError(f"rms_norm: the second weight starts at group {split}, not inside 1..{n_groups - 1}")
    res = [y, w, None, step] + ([] if inplace else [x])      # [2]: the parameters, made below
    b_res = len(res)
    res += [residual] if residual is not None else []
    b_w2 = len(res)
    res += [w2] if w2 is not None else []
    k = kernels.get("norm", "rms_norm", WG=wg, SRC="y" if inplace else "x", RES="" if residual is not None else "// ",
                    B_RES=b_res, W2="" if w2 is not None else "// ", B_W2=b_w2, **subgroup_consts(device))
    res[2] = device.uniform(PARAMS.pack(group, n_groups, in_stride, in_offset, out_stride, out_offset,
                                        float(eps), split if w2 is not None else n_groups), "rms_norm.params")
    bound = device.bind(k, res, "rms_norm" + (" in place" if inplace else "") + (" + residual" if residual is not None else ""))
    return [Op(k, bound, lambda t: (max(1, t), n_groups, 1))]
