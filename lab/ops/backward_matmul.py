"""Backward builders of the projections (issue #43, training in the tab), y[t, r] = sum_c W[r, c] x[t, c] as
lab.ops.matmul's matvec and matmul compute it, and of LoRA adapters on them, y = W x + s B (A x):

- `dx_back`: the input's gradient dx = W^T dy through a weight in any kernel type, read in place from its GGUF blocks
  (the base stays quantized: wgsl/backward_matmul.wgsl dequantizes with quant.wgsl as the forward does), a weight
  split into parts included; dx written or added into (`accumulate`: a residual stream's gradient sums two branches).
- `dw_back`: an F32 weight's own gradient, dW += dy^T x summed over the step's tokens (full fine-tuning); `bias_back`
  a bias's, db += dy^T 1.
- `lora_back`: dA += s (B^T dy)^T x, dB += s dy^T (A x), and dx += s A^T (B^T dy).
The last two run on one generic strided f32 GEMM (wgsl/backward_gemm.wgsl, `gemm`): every one of those products is
"C (+)= scale * A B" with some operand read transposed, and only the strides tell them apart.

Conventions as lab/ops/backward.py's: a weight's gradient is added into its buffer (training sums it over
micro-batches; the caller clears it at the start of a step); every sum runs in a fixed order (no float atomics in
WGSL), so a backward pass is bit-reproducible. Token t's rows sit at offset + t * stride (floats) as matmul's
x_offset / x_stride and y_offset / y_stride do. lab/host/reference/grads.py holds the float64 oracle;
tests/kernels/test_backward_matmul.py and test_backward_lora.py check the kernels against it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from lab import gpu
from lab.gpu.shaders import KernelCache
from lab.ops import Op, Weight, WeightPart, groups_1d
from lab.ops.weights import dequant_consts

DX_WG = 64              # dx_rows: invocations a workgroup, one group of 8 columns each
DX_TOKENS = 8           # tokens an invocation of dx_rows (its 8 x 8 running sums: the kernel's TQ)
SUM_WG = 64             # chunk_sum's workgroup (fixed in the kernel)
GEMM_TILE = 8           # gemm's workgroup is GEMM_TILE x GEMM_TILE outputs (fixed in the kernel)
SPLIT_TILE = 4          # gemm_split's workgroup: SPLIT_TILE x SPLIT_TILE outputs, K over 16 lanes each (the kernel's)
SPLIT_MIN_K = 64        # gemm's default: gemm_split from this K up on a GPU (below it, a lane would hold < 4 terms)
TILES = 64              # gemm_tiles' workgroup: TILES x TILES outputs (the kernel's BM and BN)
TILES_MIN = 64          # gemm's default: gemm_tiles on a GPU where M and N both reach a tile (a dW, the head's, dx)
KINDS = ("gemm", "split", "tiles")      # gemm's kernels: one invocation an output, K over 16 lanes, 64 x 64 tiles
# dx_rows' rows a chunk: enough chunks that the grid reaches DX_TARGET invocations (a GPU's memory wants ~1e5 reads in
# flight, 8 tokens' sums an invocation; the tokens and columns alone give cols / 8 * ceil(t / 8)), but at least
# CHUNK_MIN rows, so that the 256 bytes of partial sums an invocation writes stay small next to the weights it reads,
# and at most CHUNK_MAX, within lavapipe's 32,768 iterations a loop (tests/kernels/test_loop_budget.py) with room to
# spare. The scratch is then about 64 * DX_TARGET floats at most (16 MiB) once the rows allow that many chunks.
DX_TARGET = 1 << 16
CHUNK_MIN, CHUNK_MAX = 256, 4096
TOK_M, TOK_N, TOK_K = 1, 2, 4    # gemm's `tok` bits: which of M, N, K is the step's token count

_DX = struct.Struct("<12I")      # n_rows, cols, gpr, row_bytes, first_row, chunk_rows, chunk0, dy_off, dy_stride, pad*3
_SUM = struct.Struct("<8I")      # cols, chunks, dx_off, dx_stride, acc, pad*3
_GEMM = struct.Struct("<14IfI")  # m n k tok, a_off a_si a_sk, b_off b_sk b_sj, c_off c_si c_sj, acc, scale, pad


def _need(buf: gpu.Buffer, floats: int, what: str) -> None:
    if buf.size < 4 * floats:
        raise ValueError(f"{what}: buffer {buf.label} has {buf.size} bytes, needs {4 * floats}")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# -- dx through a weight of any type --------------------------------------------------------------------------------

def dx_chunk_rows(w: Weight, max_tokens: int) -> int:
    """dx_back's default rows a chunk for steps of up to max_tokens (DX_TARGET, CHUNK_MIN, CHUNK_MAX say why)."""
    per_chunk = (w.cols // 8) * _ceil(max_tokens, DX_TOKENS)      # invocations one chunk of rows gives
    chunks = max(1, DX_TARGET // max(1, per_chunk))
    return min(CHUNK_MAX, max(CHUNK_MIN, _ceil(w.rows, chunks)))


def dx_chunks(w: Weight, chunk_rows: int) -> list[int]:
    """Chunks of each part (a part's rows are cut on their own, the last chunk of each may be short)."""
    return [_ceil(part.n_rows, chunk_rows) for part in w.parts]


def dx_scratch_floats(w: Weight, max_tokens: int, chunk_rows: int | None = None) -> int:
    """Floats of the partial sums dx_back needs (its `sums` buffer) for steps of up to max_tokens."""
    rows = chunk_rows or dx_chunk_rows(w, max_tokens)
    return sum(dx_chunks(w, rows)) * max_tokens * w.cols


def dx_back(device: gpu.Device, kernels: KernelCache, w: Weight, dy: gpu.Buffer, dx: gpu.Buffer,
            sums: gpu.Buffer, step: gpu.Buffer, *, max_tokens: int, accumulate: bool = False, dy_offset: int = 0,
            dy_stride: int | None = None, dx_offset: int = 0, dx_stride: int | None = None,
            chunk_rows: int | None = None) -> list[Op]:
    """dx[t, c] (+)= sum_r W[r, c] dy[t, r] for the step's t tokens (t <= max_tokens): the gradient of matmul's
    input, token t's dy at dy[dy_offset + t * dy_stride ...] (stride defaults to rows) and its dx at
    dx[dx_offset + t * dx_stride ...] (stride defaults to cols). `sums` is scratch of dx_scratch_floats floats.
    One op per weight part (each part's chunks of rows summed into `sums`: wgsl/backward_matmul.wgsl says why the
    rows are cut), then one op adding the chunks in order into dx (written, or added into with accumulate=True).
    `chunk_rows` overrides the rows a chunk (tests: several chunks a part at small shapes)."""
    ys = w.rows if dy_stride is None else dy_stride
    xs = w.cols if dx_stride is None else dx_stride
    rows = chunk_rows or dx_chunk_rows(w, max_tokens)
    chunks = dx_chunks(w, rows)
    _check_dx(device, w, dy, dx, sums, max_tokens, dy_offset, ys, dx_offset, xs, rows, chunks)
    k = kernels.get("backward_matmul", "dx_rows", WG=DX_WG, TQ=DX_TOKENS, **dequant_consts(w.type))
    gx = _ceil(w.cols // 8, DX_WG)
    ops, chunk0 = [], 0
    for part, n in zip(w.parts, chunks):
        label = f"{part.buffer.label}.dx_back"
        params = device.uniform(_DX.pack(part.n_rows, w.cols, w.cols // 8, w.row_bytes, part.first_row, rows, chunk0,
                                         dy_offset, ys, 0, 0, 0), label)
        bound = device.bind(k, [part.buffer, dy, sums, params, step], label)
        ops.append(Op(k, bound, lambda t, n=n: (gx, n, max(1, _ceil(t, DX_TOKENS)))))
        chunk0 += n
    ks = kernels.get("backward_gemm", "chunk_sum")
    params = device.uniform(_SUM.pack(w.cols, chunk0, dx_offset, xs, int(accumulate), 0, 0, 0), f"{w.name}.dx_sum")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    ops.append(Op(ks, device.bind(ks, [sums, dx, params, step], f"{w.name}.dx_sum"),
                  lambda t: groups_1d(max(1, t) * w.cols, SUM_WG, max_dim)))
    return ops


def _check_dx(device: gpu.Device, w: Weight, dy: gpu.Buffer, dx: gpu.Buffer, sums: gpu.Buffer, max_tokens: int,
              dy_offset: int, dy_stride: int, dx_offset: int, dx_stride: int, rows: int, chunks: list[int]) -> None:
    """dx_back's checks of its arguments: distinct buffers, every one long enough, a grid within the limits."""
    if dx is dy or dx is sums or dy is sums:
        raise ValueError(f"{w.name} dx_back: dy, dx and the sums must be three buffers (WebGPU refuses one buffer "
                         f"bound read-only and writable in one dispatch)")
    if max_tokens <= 0 or rows <= 0:
        raise ValueError(f"{w.name} dx_back: max_tokens {max_tokens} and chunk_rows {rows} must be positive")
    _need(dy, dy_offset + (max_tokens - 1) * dy_stride + w.rows, f"{w.name} dx_back dy")
    _need(dx, dx_offset + (max_tokens - 1) * dx_stride + w.cols, f"{w.name} dx_back dx")
    _need(sums, sum(chunks) * max_tokens * w.cols, f"{w.name} dx_back sums")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    if max(chunks) > max_dim or _ceil(max_tokens, DX_TOKENS) > max_dim:
        raise gpu.GpuError(f"{w.name} dx_back: {max(chunks)} chunks or {max_tokens} tokens exceed the grid")


# -- the generic f32 GEMM -------------------------------------------------------------------------------------------

def gemm(device: gpu.Device, kernels: KernelCache, a: tuple, b: tuple, c: tuple, step: gpu.Buffer,
         m: int, n: int, k: int, *, tok: int = 0, scale: float = 1.0, accumulate: bool = False,
         label: str = "gemm", kind: str | None = None) -> Op:
    """C[i, j] (+)= scale * sum_k A[i, k] B[k, j] (wgsl/backward_gemm.wgsl), each operand a (buffer, offset,
    stride of its first index, stride of its second) in floats, so a transposed operand is only other strides.
    `tok` (TOK_M | TOK_N | TOK_K) names the dimensions that are the step's token count: m, n or k then give their
    largest value (the buffers are checked against it) and the grid follows the step. `kind` (KINDS) picks the
    kernel; by default, on a GPU adapter, gemm_tiles where M and N both reach TILES_MIN, else gemm_split from a K of
    SPLIT_MIN_K up, else gemm (always gemm on a CPU adapter: the kernel's comments say why)."""
    (ab, a_off, a_si, a_sk), (bb, b_off, b_sk, b_sj), (cb, c_off, c_si, c_sj) = a, b, c
    if cb is ab or cb is bb:
        raise ValueError(f"{label}: C must be a buffer other than A and B")
    _need(ab, a_off + (m - 1) * a_si + (k - 1) * a_sk + 1, f"{label} A")
    _need(bb, b_off + (k - 1) * b_sk + (n - 1) * b_sj + 1, f"{label} B")
    _need(cb, c_off + (m - 1) * c_si + (n - 1) * c_sj + 1, f"{label} C")
    if kind is None:
        gpu_ = not device.info.software
        kind = ("tiles" if gpu_ and min(m, n) >= TILES_MIN else "split" if gpu_ and k >= SPLIT_MIN_K else "gemm")
    if kind not in KINDS:
        raise ValueError(f"{label}: kind {kind!r}, not one of {', '.join(KINDS)}")
    tile = {"gemm": GEMM_TILE, "split": SPLIT_TILE, "tiles": TILES}[kind]
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    if _ceil(m, tile) > max_dim or _ceil(n, tile) > max_dim:
        raise gpu.GpuError(f"{label}: {m} x {n} outputs exceed the grid")
    kern = kernels.get("backward_gemm", {"gemm": "gemm", "split": "gemm_split", "tiles": "gemm_tiles"}[kind])
    params = device.uniform(_GEMM.pack(m, n, k, tok, a_off, a_si, a_sk, b_off, b_sk, b_sj, c_off, c_si, c_sj,
                                       int(accumulate), float(scale), 0), label)

    def grid(t: int) -> tuple[int, int, int]:
        mt = max(1, t) if tok & TOK_M else m
        nt = max(1, t) if tok & TOK_N else n
        return (_ceil(nt, tile), _ceil(mt, tile), 1)

    return Op(kern, device.bind(kern, [ab, bb, cb, params, step], label), grid)


def dw_back(device: gpu.Device, kernels: KernelCache, dw: Sequence[WeightPart], cols: int, x: gpu.Buffer,
            dy: gpu.Buffer, step: gpu.Buffer, *, max_tokens: int, x_offset: int = 0, x_stride: int | None = None,
            dy_offset: int = 0, dy_stride: int | None = None, kind: str | None = None) -> list[Op]:
    """dW[r, c] += sum_t dy[t, r] x[t, c] over the step's tokens: the gradient of an F32 weight of rows x cols, held
    as f32 parts of rows (WeightPart: buffer, first_row, n_rows; alloc_weight's split of an F32 weight gives them),
    one GEMM a part. Token t's x at x[x_offset + t * x_stride ...] (stride defaults to cols), its dy at
    dy[dy_offset + t * dy_stride ...] (stride defaults to the parts' rows in all). `kind`: gemm's."""
    rows = sum(p.n_rows for p in dw)
    xs = cols if x_stride is None else x_stride
    ys = rows if dy_stride is None else dy_stride
    return [gemm(device, kernels, (dy, dy_offset + p.first_row, 1, ys), (x, x_offset, xs, 1), (p.buffer, 0, cols, 1),
                 step, p.n_rows, cols, max_tokens, tok=TOK_K, accumulate=True, label=f"{p.buffer.label}.dw_back",
                 kind=kind)
            for p in dw]


def bias_back(device: gpu.Device, kernels: KernelCache, db: gpu.Buffer, one: gpu.Buffer, dy: gpu.Buffer,
              step: gpu.Buffer, *, width: int, max_tokens: int, dy_offset: int = 0, dy_stride: int | None = None,
              kind: str | None = None) -> list[Op]:
    """db[c] += sum_t dy[t, c] for c < width over the step's tokens: the gradient of a bias b in y = W x + b (full
    fine-tuning: qwen2's fused Q/K/V biases), the column sums of dy. It is gemm's dy^T 1 with the ones read from one
    float (`one`, holding 1.0) at stride 0, so each sum runs in token order as dW's does (a product by 1 is exact):
    no kernel of its own. Token t's dy at dy[dy_offset + t * dy_stride ...] (stride defaults to width)."""
    ys = width if dy_stride is None else dy_stride
    return [gemm(device, kernels, (dy, dy_offset, 1, ys), (one, 0, 0, 0), (db, 0, 1, 0), step, width, 1, max_tokens,
                 tok=TOK_K, accumulate=True, label=f"{db.label}.bias_back", kind=kind)]


# -- LoRA ------------------------------------------------------------------------------------------------------------

def _at(arg) -> tuple[gpu.Buffer, int]:
    """A buffer, or (buffer, offset in floats): an adapter's matrices inside one flat buffer."""
    return arg if isinstance(arg, tuple) else (arg, 0)


def lora_back(device: gpu.Device, kernels: KernelCache, lora: tuple, grads: tuple, scratch: tuple,
              x: gpu.Buffer, dy: gpu.Buffer, dx: gpu.Buffer, step: gpu.Buffer, *, n_in: int, n_out: int, rank: int,
              scale: float, max_tokens: int, x_offset: int = 0, x_stride: int | None = None, dy_offset: int = 0,
              dy_stride: int | None = None, dx_offset: int = 0, dx_stride: int | None = None,
              kind: str | None = None, pieces: Sequence[tuple[int, int, int]] | None = None) -> list[Op]:
    """Gradients of y = W x + scale * B (A x) with respect to the adapter and the input, for the step's tokens.
    lora = (A, B): f32, A [rank, n_in] and B [n_out, rank] row-major, each a buffer or (buffer, offset in floats);
    grads = (dA, dB) of their shapes, the same way, added into; scratch = (u, du), max_tokens * rank floats each.
    Five GEMMs in order: u = x A^T (the forward's A x again,
    cheaper than keeping it: t x rank x n_in), du = scale * dy B, then dA += du^T x, dB += scale * dy^T u and
    dx += du A, the input's extra gradient, always added: it joins the base projection's dx (dx_back) or another
    branch's. x, dy, dx rows as dw_back's and dx_back's (strides default to n_in, n_out, n_in). `kind` forces
    gemm's choice of kernel for all five (tests; default: gemm's). `pieces`: where B's rows lie in dy, each (dy's
    column from dy_offset, B's first row, rows) (lab.engine.lora.members: qwen35's attn_q, whose rows the run holds
    apart; gemma4's K rows read again as V, two pieces of the same rows); du's GEMM and dB's then run a piece at a
    time, du's adding from the second. Default: B whole at dy_offset."""
    (a, ao), (b, bo), (da, dao), (db, dbo) = (_at(v) for v in (*lora, *grads))
    u, du = scratch
    xs = n_in if x_stride is None else x_stride
    ys = n_out if dy_stride is None else dy_stride
    dxs = n_in if dx_stride is None else dx_stride
    t, r = max_tokens, rank
    pieces = pieces or [(0, 0, n_out)]
    if any(at < 0 or n < 1 or at + n > n_out for _, at, n in pieces):
        raise ValueError(f"lora_back: pieces {pieces} reach past B's {n_out} rows")
    out = [gemm(device, kernels, (x, x_offset, xs, 1), (a, ao, 1, n_in), (u, 0, r, 1), step, t, r, n_in, tok=TOK_M,
                label="lora_back.u", kind=kind)]
    out += [gemm(device, kernels, (dy, dy_offset + col, ys, 1), (b, bo + at * r, r, 1), (du, 0, r, 1), step, t, r, n,
                 tok=TOK_M, scale=scale, accumulate=i > 0, label="lora_back.du", kind=kind)
            for i, (col, at, n) in enumerate(pieces)]
    out.append(gemm(device, kernels, (du, 0, 1, r), (x, x_offset, xs, 1), (da, dao, n_in, 1), step, r, n_in, t,
                    tok=TOK_K, accumulate=True, label="lora_back.dA", kind=kind))
    out += [gemm(device, kernels, (dy, dy_offset + col, 1, ys), (u, 0, r, 1), (db, dbo + at * r, r, 1), step, n, r, t,
                 tok=TOK_K, scale=scale, accumulate=True, label="lora_back.dB", kind=kind) for col, at, n in pieces]
    out.append(gemm(device, kernels, (du, 0, r, 1), (a, ao, n_in, 1), (dx, dx_offset, dxs, 1), step, t, n_in, r,
                    tok=TOK_M, accumulate=True, label="lora_back.dx", kind=kind))
    return out
