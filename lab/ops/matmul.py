"""Projections: y = W x with the weights dequantized in the kernel (wgsl/matvec.wgsl, wgsl/matmul.wgsl).

`matvec` is the decode path (one token), `matmul` the prefill path (t tokens from the step buffer).
Both return one Op per weight part; each part writes its own row range of y. `accumulate=True` adds
into y instead of overwriting it (residual adds folded into the projection). The matvec can also fold
the op before it into its input (RMSNorm, or the GLU of a [gate | up] row) and a bias into its output:
decode is bound by dispatches, not bytes, on a GPU (docs/performance.md).
"""

from __future__ import annotations

import struct

from lab import gpu
from lab.gpu.shaders import KernelCache, grid_bytes, subgroup_consts
from lab.ops import KV_WRITE, Op, Weight, groups_1d
from lab.ops.attention import kv_consts
from lab.ops.rope import QkvRope
from lab.ops.weights import dequant_consts

MATVEC_ROWS = 4          # rows per matvec workgroup (vec4 accumulator in the kernel)
MATMUL_TR, MATMUL_TT = 64, 64   # rows x tokens per matmul workgroup (fixed in the kernel). 32-token tiles, twice
                                # the workgroups, were slower on the H200 even for SmolLM2's 576-row projections
                                # (72 workgroups of 64 x 64 for 512 tokens): 10.5 against 10.4 ms a prefill step
# A CPU adapter takes matmul_lanes.wgsl instead: 4 invocations of 4 rows x 4 tokens each, no barrier (SwiftShader
# and lavapipe pay per thread at every barrier, AdapterInfo.software)
MATMUL_LANES_TR, MATMUL_LANES_TT = 16, 4

_MATVEC = struct.Struct("<8If3I")      # n_rows, cols, gpr, row_bytes, x_off, y_off, acc, write_xn, eps, xn_off,
                                        # bias_off, up_off
GLU_ACTS = {"swiglu": "silu", "geglu": "gelu_tanh"}
_MATMUL = struct.Struct("<12I")         # n_rows, cols, gpr, row_bytes, x_off, y_off, x_stride, y_stride, acc, pad*3


# Types with a loop of their own (matvec.wgsl's `accumulate`; their scales unpacked once per 32-64 values, not
# per group of 8, their input read as vec4s): the loop's file and its constants. Every other type runs
# matvec_groups.wgsl. The loops of WIDE_VIEW also bind the weights through a wider view (binding B_W4);
# matvec_iq.wgsl (the grid types, a 32-value sub-block a step) its grid (B_GRID, IQ_GRID).
MATVEC_LOOPS = {
    "Q4_K": ("matvec_k.wgsl", {"KT": "Q4_K", "QH": "qh_none", "QH16": 0}),
    "Q5_K": ("matvec_k.wgsl", {"KT": "Q5_K", "QH": "qh_q5_k", "QH16": 1}),
    "Q6_K": ("matvec_q6_k.wgsl", {}),
    "Q2_K": ("matvec_q2_k.wgsl", {}),
    "Q3_K": ("matvec_q3_k.wgsl", {}),
    "IQ4_XS": ("matvec_iq4_xs.wgsl", {}),
    **{t: ("matvec_iq.wgsl", {"IQ": t, "STEP": t.lower() + "_step"})
       for t in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")},
}
# The loops that read W a second time through a wider view, its widest alignment in every row and block: vec4<u32>
# (Q4_K's 144-byte and Q5_K's 176-byte blocks), vec2<u32> (IQ4_XS's 136). Q2_K's 84 bytes allow words only (W itself).
WIDE_VIEW = ("matvec_k.wgsl", "matvec_iq4_xs.wgsl")
# Values one step of a type's own loop covers (its "unit": the K loops a 16-byte piece of 32 values, Q6_K, Q2_K and
# Q3_K 64, IQ4_XS and the grid types a sub-block of 32).
LOOP_UNIT = {"Q4_K": 32, "Q5_K": 32, "Q6_K": 64, "Q2_K": 64, "Q3_K": 64, "IQ4_XS": 32,
             **{t: 32 for t, (f, _) in MATVEC_LOOPS.items() if f == "matvec_iq.wgsl"}}
# The grid each grid type's loop binds (lab/gpu/shaders.py's names; IQ1_M shares IQ1_S's): ggml's table in a CONSTANT
# storage buffer, one per grid and owner (KernelCache.table), its values made from float bit patterns
# (wgsl/matvec_iq.wgsl says why, as measured on the H200).
IQ_GRID = {"IQ2_XXS": "IQ2XXS", "IQ2_XS": "IQ2XS", "IQ2_S": "IQ2S", "IQ3_XXS": "IQ3XXS", "IQ3_S": "IQ3S",
           "IQ1_S": "IQ1S", "IQ1_M": "IQ1S"}
TALL = 16384            # rows from which a matvec is a tall output head (the vocabulary's rows)


def matvec_wg(cols: int, rows: int = 0, software: bool = False, type_name: str = "", swiftshader: bool = False) -> int:
    """Threads per matvec workgroup. GPU (chosen on an H200, docs/performance.md): 32 for a tall head
    (16,384+ rows: many short workgroups beat fewer wide ones, 21 vs 31 us), 256 once a row has 192+ groups
    of 8, else 128 (the RMSNorm's reduction favours wider groups: 4.5 vs 5.3 us at 960x576). A CPU adapter
    pays for every thread of a workgroup instead (below).
    A type with its own loop: 64 threads, or 128 under 2,048 rows (too few workgroups to fill the GPU). On the
    H200 at 14336x4096 Q4_K: 64 threads 22.0 us, 128 22.9, 256 28.2; at 896x4864: 6.0, 5.5, 5.5. A tall head of
    short rows (Qwen3.5-0.8B's tied Q6_K table, 248,320 x 1,024: 16 units a row) left three of 64 threads idle
    (0.35 TB/s, 0.6 ms of a 2.2 ms decode step): there, as many threads as a row has units, 16..64.
    SwiftShader (the page without a GPU) runs a workgroup as 4-wide SIMD groups switched at each barrier: 4 threads
    for every shape and type. SmolLM2 in Chromium: gate_up 3072x576 Q4_1 7.9 ms at 4 threads, 12.6 at 8, 62 at 64;
    the 49152x576 Q8_0 head 222, 209 and 842 ms. lavapipe likewise: one 8-wide SIMD group, no barrier between
    subgroups (2026-12-03, 2-core machine, `lab bench MODEL --profile --prompts 1`, every matvec at one size): a
    SmolLM2 decode step 450 ms at 8 threads, 447 at 4, 519 at 16, 606 at 32, 1,015 at this function's earlier
    64-256; Qwen2.5 2.11 against 3.39 s, Gemma 3 1.06 against 2.07 s."""
    if swiftshader:
        return gpu.SWIFTSHADER_WG
    if software:
        return gpu.LLVMPIPE_WG
    if type_name in MATVEC_LOOPS:
        if rows >= TALL:
            units = cols // LOOP_UNIT[type_name]
            return min(64, max(16, 1 << max(units - 1, 0).bit_length()))
        return 64 if rows >= 2048 else 128
    gpr = cols // 8
    if rows >= TALL:
        return 32
    return 256 if gpr >= 192 else 128


def matvec_storage(type_name: str, *, norm: bool, bias: bool, rope: bool, x4: bool = True) -> int:
    """Storage buffers one matvec binds: W, x, y, the norm's weight and xn, the bias, a loop's wider view of W or
    a grid type's grid, the rotary epilogue's two caches (WebGPU's default limit is 8 a stage)."""
    loop = MATVEC_LOOPS.get(type_name, ("",))[0] if x4 else ""
    extra = loop in WIDE_VIEW or loop == "matvec_iq.wgsl"
    return 3 + 2 * norm + bias + extra + 2 * rope


def _check(buf: gpu.Buffer, floats: int, what: str) -> None:
    if buf.size < 4 * floats:
        raise ValueError(f"{what}: buffer {buf.label} has {buf.size} bytes, needs {4 * floats}")


def matvec(device: gpu.Device, kernels: KernelCache, w: Weight, x: gpu.Buffer, y: gpu.Buffer,
           step: gpu.Buffer | None = None, *, x_offset: int = 0, y_offset: int = 0,
           accumulate: bool = False, norm: tuple[gpu.Buffer, float] | None = None,
           xn: gpu.Buffer | None = None, xn_offset: int = 0, write_xn: bool = True, glu: str | None = None,
           bias: gpu.Buffer | None = None, bias_offset: int = 0, wg: int | None = None,
           rope: QkvRope | None = None) -> list[Op]:
    """y[y_offset + r] (+)= sum_c W[r, c] * in(c) (+ bias[bias_offset + r]) for one token. `step` is
    accepted for a uniform signature and not used (the grid never depends on the token count).

    in(c) = x[x_offset + c], or with norm=(weight, eps) the RMSNorm of those cols floats (the normed
    vector is also stored at xn[xn_offset..], once, unless write_xn=False: several projections of one
    normed input bind the same xn and only one writes it), or with glu="swiglu"|"geglu" the GLU of a
    [gate | up] row of 2 * cols floats at x_offset. `wg` overrides the threads per workgroup (tests).
    `rope` (decode's fused QKV row, y_offset its column): the output leaves rotated and its K and V go to the cache
    (wgsl/matvec.wgsl ROPE); each op's role is then KV_WRITE, its `without_kv` the same rotation without the writes."""
    _check_matvec(w, x, y, x_offset=x_offset, y_offset=y_offset, accumulate=accumulate, norm=norm, xn=xn,
                  xn_offset=xn_offset, glu=glu, bias=bias, bias_offset=bias_offset, rope=rope)

    # x is read as vec4s where its offset allows; the types' own loops need that, else they take the group loop
    x4 = x_offset % 4 == 0
    k, w4, table = _matvec_kernel(device, kernels, w, x4, norm=norm is not None, glu=glu, bias=bias is not None,
                                  rope=rope, wg=wg)

    # The bindings every part shares: the prologue's and the bias after W, x, y and the parameters, then the loop's
    # (the grid: one table per grid and owner, not one per op); the rotary epilogue's last.
    extra = ([norm[0], xn] if norm is not None else []) + ([bias] if bias is not None else [])
    grid_buf = [kernels.table(f"{table} grid", grid_bytes(table))] if table else []
    tail = _rope_bindings(device, w, rope) if rope is not None else {}

    # One op per weight part, each writing its own rows of y (only the first writes xn).
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    eps = float(norm[1]) if norm else 0.0
    ops = []
    for i, part in enumerate(w.parts):
        params = device.uniform(_MATVEC.pack(part.n_rows, w.cols, w.cols // 8, w.row_bytes, x_offset,
                                             y_offset + part.first_row, int(accumulate),
                                             int(norm is not None and write_xn and i == 0), eps, xn_offset,
                                             bias_offset + part.first_row, w.cols),
                                f"{part.buffer.label}.matvec")
        res = [part.buffer, x, y, params] + extra + [part.buffer] * w4 + grid_buf
        grid = groups_1d(part.n_rows, MATVEC_ROWS, max_dim)
        if rope is None:
            ops.append(Op(k, device.bind(k, res, f"{part.buffer.label}.matvec"), lambda t, g=grid: g))
            continue
        plain = Op(k, device.bind(k, res + tail[False], f"{part.buffer.label}.matvec+rope"), lambda t, g=grid: g)
        ops.append(Op(k, device.bind(k, res + tail[True], f"{part.buffer.label}.matvec+rope+kv"),
                      lambda t, g=grid: g, KV_WRITE, without_kv=plain))
    return ops


def _matvec_kernel(device: gpu.Device, kernels: KernelCache, w: Weight, x4: bool, *, norm: bool, glu: str | None,
                   bias: bool, rope: QkvRope | None, wg: int | None) -> tuple[object, bool, str]:
    """matvec's variant: its kernel (the input prologue, the weight type's loop, the epilogues, the threads), whether
    the loop binds W a second time, wider, and the grid it binds (or "")."""
    consts, w4, table = _matvec_consts(w.type.name, x4, norm=norm, glu=glu, bias=bias, rope=rope is not None)
    if rope is not None:
        storage = matvec_storage(w.type.name, norm=norm, bias=bias, rope=True, x4=x4)
        if storage > device.info.limits["max_storage_buffers_per_shader_stage"]:
            raise gpu.GpuError(f"{w.name} matvec: the rotary epilogue needs {storage} storage buffers, the adapter "
                               f"allows {device.info.limits['max_storage_buffers_per_shader_stage']}")
    wg = wg or matvec_wg(w.cols, w.rows, device.info.software, w.type.name, device.info.swiftshader)
    sg = subgroup_consts(device)
    red = max(1, wg // 4) if sg["SG"] == "" else wg
    kvc = kv_consts(rope.kv if rope is not None else "f32")
    k = kernels.get("matvec", WG=wg, RED=red, **consts,
                    **dequant_consts(w.type), **sg, **kvc)
    return k, w4, table


def _rope_bindings(device: gpu.Device, w: Weight, rope: QkvRope) -> dict[bool, list]:
    """The rotary epilogue's bindings, its parameters with the cache writes (True) and without (False)."""
    return {True: [device.uniform(rope.params(True), f"{w.name}.rope"), rope.step, rope.k_cache, rope.v_cache],
            False: [device.uniform(rope.params(False), f"{w.name}.rope (no kv)"), rope.step, rope.k_cache,
                    rope.v_cache]}


def _check_matvec(w: Weight, x: gpu.Buffer, y: gpu.Buffer, *, x_offset: int, y_offset: int, accumulate: bool,
                  norm: tuple[gpu.Buffer, float] | None, xn: gpu.Buffer | None, xn_offset: int, glu: str | None,
                  bias: gpu.Buffer | None, bias_offset: int, rope: QkvRope | None) -> None:
    """matvec's checks of its arguments: one prologue at a time, every buffer long enough, whole rotary pairs."""
    if norm is not None and glu is not None:
        raise ValueError(f"{w.name} matvec: one input prologue at a time (norm or glu)")
    if (xn is not None) != (norm is not None):
        raise ValueError(f"{w.name} matvec: norm and xn (where the normed input goes) come together")
    if glu is not None and glu not in GLU_ACTS:
        raise ValueError(f"{w.name} matvec: unknown glu {glu!r} ({', '.join(GLU_ACTS)})")
    _check(x, x_offset + (2 if glu else 1) * w.cols, f"{w.name} matvec x")
    _check(y, y_offset + w.rows, f"{w.name} matvec y")
    if norm is not None:
        _check(norm[0], w.cols, f"{w.name} matvec norm weight")
        _check(xn, xn_offset + w.cols, f"{w.name} matvec xn")
    if bias is not None:
        _check(bias, bias_offset + w.rows, f"{w.name} matvec bias")
    if rope is not None:
        if glu or accumulate:
            raise ValueError(f"{w.name} matvec: the rotary epilogue is for a plain QKV projection")
        odd = [p.first_row for p in w.parts if (y_offset + p.first_row) % 2]
        if odd or rope.head_dim % 2 or rope.n_rot % 2:
            raise ValueError(f"{w.name} matvec: the rotary epilogue needs whole pairs in every part")
        if rope.neox and (rope.head_dim % 4 or rope.n_rot % 4
                          or any((y_offset + p.first_row) % rope.head_dim for p in w.parts)):
            raise ValueError(f"{w.name} matvec: the rotary epilogue's NeoX pairs need head_dim and n_rot multiples of "
                             f"4 and every part starting on a head")


def _matvec_consts(type_name: str, x4: bool, *, norm: bool, glu: str | None, bias: bool,
                   rope: bool, expert: bool = False) -> tuple[dict, bool, str]:
    """matvec.wgsl's constants for one variant, whether its loop binds W a second time, wider (B_W4), and the
    grid it binds (a name of IQ_GRID's, or ""). Bindings: 0 W, 1 x, 2 y, 3 params, then only those the variant has, in
    this order: the norm's weight and xn, the bias, W's wider view or the grid, the rotary epilogue's parameters,
    step, K cache and V cache; or, for a stack of experts (expert, lab.ops.moe), the chosen experts and their
    parameters."""
    loop, loop_consts = (MATVEC_LOOPS if x4 else {}).get(type_name, ("matvec_groups.wgsl", {}))
    w4 = loop in WIDE_VIEW
    table = IQ_GRID[type_name] if loop == "matvec_iq.wgsl" else ""
    b_loop = 4 + 2 * norm + bias
    b_rope = b_loop + w4 + bool(table)
    consts = {"IN": "in_norm" if norm else "in_glu" if glu else "in_plain", "ACT": GLU_ACTS.get(glu, "silu"),
              "NORM": "" if norm else "// ", "B_NW": 4, "B_XN": 5,
              "BIAS": "" if bias else "// ", "B_BIAS": 4 + 2 * norm,
              **loop_consts, "LOOP": loop, "XVIEW": "matvec_x4.wgsl" if x4 else "matvec_x1.wgsl",
              **({"B_W4": b_loop} if w4 else {}), **({"B_GRID": b_loop} if table else {}),
              "ROPE": "" if rope else "// ", "B_RP": b_rope, "B_STEP": b_rope + 1, "B_KC": b_rope + 2,
              "B_VC": b_rope + 3, "EXPERT": "" if expert else "// ", "B_IDS": b_rope, "B_EP": b_rope + 1}
    return consts, w4, table


def matmul(device: gpu.Device, kernels: KernelCache, w: Weight, x: gpu.Buffer, y: gpu.Buffer,
           step: gpu.Buffer, *, max_tokens: int, accumulate: bool = False, x_offset: int = 0,
           y_offset: int = 0, x_stride: int | None = None, y_stride: int | None = None,
           lanes: bool | None = None) -> list[Op]:
    """Y[i, r] (+)= sum_c W[r, c] * X[i, c] for the step's t tokens (t <= max_tokens), where token i's
    input is x[x_offset + i * x_stride ...] (stride defaults to cols) and its output
    y[y_offset + i * y_stride ...] (stride defaults to rows). `lanes` picks matmul_lanes.wgsl (default: on a
    CPU adapter. SwiftShader: SmolLM2's 120 projections of a 37-token prefill took 8.0 s against 27.9 in
    matmul.wgsl's tiles; lavapipe, 2026-12-03 on the 2-core machine, `lab bench MODEL --profile --prompts 32
    --contexts 0`: 4.7 s against 15.5, the whole prefill step 5.4 against 16.1 s)."""
    xs = w.cols if x_stride is None else x_stride
    ys = w.rows if y_stride is None else y_stride
    _check(x, x_offset + (max_tokens - 1) * xs + w.cols, f"{w.name} matmul x")
    _check(y, y_offset + (max_tokens - 1) * ys + w.rows, f"{w.name} matmul y")
    lanes = device.info.software if lanes is None else lanes
    tr, tt = (MATMUL_LANES_TR, MATMUL_LANES_TT) if lanes else (MATMUL_TR, MATMUL_TT)
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    if -(-max_tokens // tt) > max_dim:
        raise gpu.GpuError(f"{w.name}: {max_tokens} tokens per step exceed the matmul grid")
    k = kernels.get("matmul_lanes" if lanes else "matmul", **dequant_consts(w.type))
    ops = []
    for part in w.parts:
        if -(-part.n_rows // tr) > max_dim:
            raise gpu.GpuError(f"{part.buffer.label}: {part.n_rows} rows exceed the matmul grid")
        params = device.uniform(_MATMUL.pack(part.n_rows, w.cols, w.cols // 8, w.row_bytes, x_offset,
                                             y_offset + part.first_row, xs, ys, int(accumulate), 0, 0, 0),
                                f"{part.buffer.label}.matmul")
        bound = device.bind(k, [part.buffer, x, y, params, step], f"{part.buffer.label}.matmul")
        row_groups = -(-part.n_rows // tr)
        ops.append(Op(k, bound, lambda t, r=row_groups, tt=tt: (r, max(1, -(-t // tt)), 1)))
    return ops


# -- the tensor-core prefill (browser adapters with AdapterInfo.int8_matrix) -------------------------------------------
# Types whose blocks of 32 are w = a * q + c with q in 0..31 or -128..127: wgsl/matmul_i8.wgsl's unpack function each.
I8_TYPES = {"Q4_0": "iq_q4_0", "Q4_1": "iq_q4_1", "Q5_0": "iq_q5_0", "Q5_1": "iq_q5_1", "Q8_0": "iq_q8_0",
            "Q4_K": "iq_q4_k", "Q5_K": "iq_q5_k", "Q6_K": "iq_q6_k", "Q3_K": "iq_q3_k", "IQ4_XS": "iq_iq4_xs"}
I8_HALVES = {"Q6_K", "Q3_K"}     # scaled per 16 values: a block of 32 is two products (the kernel's HV = 2)
I8_TILE = 32                     # tokens per matmul_i8 workgroup
I8_WIDE = 2048                   # projections of at least this many rows take 32-row matmul_i8 tiles, narrower ones
                                 # 16 (more workgroups: each is one subgroup, and a few per SM leave latency bare)
_Q8 = struct.Struct("<4I")        # cols, nb, x_off, x_stride
_I8 = struct.Struct("<8I")        # n_rows, cols, nb, row_bytes, y_off, y_stride, acc, pad


def i8_scratch_bytes(max_tokens: int, max_cols: int) -> tuple[int, int]:
    """Bytes of the int8 inputs and of their (d, d * sum q) pairs for steps of up to max_tokens rows of up to
    max_cols values: rows padded to the tile, since the GEMM loads 16 whole rows at a time."""
    rows = -(-max_tokens // I8_TILE) * I8_TILE
    return rows * max_cols, rows * (max_cols // 32) * 8


def q8_rows(device: gpu.Device, kernels: KernelCache, x: gpu.Buffer, xq: gpu.Buffer, xd: gpu.Buffer,
            step: gpu.Buffer, cols: int, *, x_offset: int = 0, x_stride: int | None = None) -> list[Op]:
    """The step's t input rows (token i at x[x_offset + i * x_stride], cols floats) quantized per block of 32
    (wgsl/q8_rows.wgsl): xq [t, cols] int8, xd [t, cols / 32] pairs (d, d * sum q). Plain WGSL: any adapter."""
    if cols % 32:
        raise ValueError(f"q8_rows: {cols} columns are not whole blocks of 32")
    nb = cols // 32
    k = kernels.get("q8_rows")
    params = device.uniform(_Q8.pack(cols, nb, x_offset, cols if x_stride is None else x_stride), "q8_rows")
    return [Op(k, device.bind(k, [x, xq, xd, params, step], "q8_rows"), lambda t: (-(-t * nb // 64), 1, 1))]


def matmul_i8(device: gpu.Device, kernels: KernelCache, w: Weight, x: gpu.Buffer, y: gpu.Buffer,
              step: gpu.Buffer, xq: gpu.Buffer, xd: gpu.Buffer, *, max_tokens: int, accumulate: bool = False,
              x_offset: int = 0, y_offset: int = 0, x_stride: int | None = None,
              y_stride: int | None = None, tile_rows: int | None = None) -> list[Op]:
    """matmul's product with the input quantized to 8 bits per block of 32 (xq, xd: scratch of
    i8_scratch_bytes), on the tensor cores through Chromium's subgroup matrices: one quantizing op
    (wgsl/q8_rows.wgsl), then the GEMM per weight part (wgsl/matmul_i8.wgsl). The result is llama.cpp's for its
    quantized matmuls, not the f32 product: each input is rounded to 1/254 of its block's largest.
    tile_rows: rows a workgroup, 16 or 32 (default: 32 from I8_WIDE rows, else 16)."""
    if not device.info.int8_matrix:
        raise gpu.GpuError(f"{w.name}: this adapter has no int8 subgroup matrices (chromium-experimental-subgroup-"
                           f"matrix with i8 16x16x32 and 32-wide subgroups)")
    if w.type.name not in I8_TYPES:
        raise gpu.GpuError(f"{w.name}: {w.type.name} has no int8 GEMM (types: {', '.join(I8_TYPES)})")
    xs = w.cols if x_stride is None else x_stride
    ys = w.rows if y_stride is None else y_stride
    _check(x, x_offset + (max_tokens - 1) * xs + w.cols, f"{w.name} matmul_i8 x")
    _check(y, y_offset + (max_tokens - 1) * ys + w.rows, f"{w.name} matmul_i8 y")
    q_bytes, d_bytes = i8_scratch_bytes(max_tokens, w.cols)
    if xq.size < q_bytes or xd.size < d_bytes:
        raise ValueError(f"{w.name} matmul_i8: scratch {xq.size} + {xd.size} bytes, needs {q_bytes} + {d_bytes}")
    nb = w.cols // 32
    ops = q8_rows(device, kernels, x, xq, xd, step, w.cols, x_offset=x_offset, x_stride=xs)
    tr = tile_rows or (32 if w.rows >= I8_WIDE else 16)
    if tr not in (16, 32):
        raise ValueError(f"{w.name} matmul_i8: tiles of 16 or 32 rows, not {tr}")
    k = kernels.get("matmul_i8", IQ=I8_TYPES[w.type.name], BB=w.type.nbytes, SB=w.type.block // 32,
                    HV=2 if w.type.name in I8_HALVES else 1, RQ=tr // 16)
    for part in w.parts:
        params = device.uniform(_I8.pack(part.n_rows, w.cols, nb, w.row_bytes, y_offset + part.first_row, ys,
                                         int(accumulate), 0), f"{part.buffer.label}.matmul_i8")
        bound = device.bind(k, [part.buffer, xq, xd, y, params, step], f"{part.buffer.label}.matmul_i8")
        row_groups = -(-part.n_rows // tr)
        ops.append(Op(k, bound, lambda t, r=row_groups: (r, max(1, -(-t // I8_TILE)), 1)))
    return ops
