"""The output head fused with the cross-entropy (issue #43, training in the tab): the loss of the step's final normed
rows xn [t, n_embd] through the head W [n_vocab, n_embd] (any kernel type, tied or its own, in parts), the optional
final soft-cap c, and one target id a row, and its gradient dxn (and dW for an F32 head), never holding the
[t, n_vocab] logits:

    z = xn W^T,  l = c tanh(z / c) (or z),  nll[t] = logsumexp(l[t]) - l[t, target[t]],  loss = sum nll / N

over the rows with a target (a target >= n_vocab, NO_TARGET among them, means none; N is their count, or the step's
rows_total when a step's windows run as several calls), and

    dlogits = (softmax(l) - onehot(target)) / N * dl/dz,   dxn (+)= dlogits W,   dW += dlogits^T xn.

The vocabulary's rows are cut into slabs, row ranges of the head bound in place of its parts (`RowRange`: a slab
starts on a multiple of SLAB_ALIGN rows of its part, so its byte offset meets WebGPU's binding alignment whatever
the row's bytes). Per slab the forward's own matmul (lab.ops.matmul) writes the slab's z into one scratch of
max_tokens x slab rows floats, and wgsl/backward_head.wgsl reads it:
- `head_loss`: per slab matmul then ce_stats (each chunk of STATS_ROWS rows: its max and sum of exp, the target's
  logit); then ce_merge (per row, the chunks in order: lse and nll) and ce_loss (the mean, in row order).
- `head_back`, right after head_loss (it reads lse and 1 / N, and the last slab's z still in the scratch): per slab,
  last first, matmul again (but for that last slab: the logits are recomputed, the price of never holding them),
  ce_dlogits in place, then lab.ops.backward_matmul's dx_back over the slab's rows (the projections' chunked
  dx = W^T dy through any weight type: a slab of the vocabulary is a row range of W), the first slab done writing
  dxn (or adding, `accumulate`) and each later one adding, and for an F32 head backward_matmul's gemm adding the
  slab's dW rows. Every sum runs in a fixed order: bit-reproducible.
Scratch (`head_ce` allocates it, `head_layout` states its sizes without a device): the slab's logits, max_tokens x
slab_rows floats with slab_rows = SLAB_FLOATS / max_tokens in whole SLAB_ALIGNs (16 MiB; less where the longest part
is shorter; 256 rows a token past 16,384 tokens); dx_back's partial sums (its own bound, ~16 MiB at most); two floats
a ce_stats chunk and row; three vectors of max_tokens and four floats.
lab/host/reference/grads_head.py is the float64 oracle with the tolerances; tests/kernels/test_backward_head.py.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from lab import gpu
from lab.gpu.shaders import KernelCache
from lab.ops import Op, Weight, WeightPart
from lab.ops.backward_matmul import TOK_K, dx_back, dx_scratch_floats, gemm
from lab.ops.matmul import matmul

WG = 64
NO_TARGET = 0xFFFFFFFF    # a row without a loss (any id >= n_vocab counts as one)
SLAB_ALIGN = 256          # rows: 256 rows of any row size are a multiple of 256 bytes, WebGPU's largest
                          # min_storage_buffer_offset_alignment
SLAB_FLOATS = 1 << 22     # the logits scratch's budget: slab rows = SLAB_FLOATS / max_tokens (16 MiB)
STATS_ROWS = 256          # rows a ce_stats invocation walks twice (a chunk of the vocabulary)
# lavapipe stops an invocation's loops past 32,768 iterations (tests/kernels/test_loop_budget.py): ce_stats walks
# 2 x stats_rows, ce_merge 2 x chunks, ce_loss max_tokens
LOOP_MAX = 32768
_PARAMS = struct.Struct("<8If3I")   # n_vocab v0 n stride chunk_rows chunk0 chunks t_off, cap, rows_total, _p0 _p1
ROWS_TOTAL_AT = struct.calcsize("<8If")   # bytes into the loss's uniform of rows_total: a step whose windows' targets
                                            # vary (a mask) writes its own N there (`rows_total_write`)
LOSS_FLOATS = 4                     # ce_loss's out: mean, count, 1 / N, sum
SCRATCH = ("logits", "sums", "stats", "tl", "lse", "nll", "loss")   # HeadCE's buffers, head_layout's sizes


@dataclass(frozen=True)
class RowRange(gpu.Slice):
    """Rows of a weight part bound in place of the whole part (a gpu.Slice with the label the builders print)."""
    label: str = ""


@dataclass(frozen=True)
class Slab:
    view: Weight        # the slab's rows as a weight of one part, a RowRange of the head's part
    v0: int             # its first row in the head (the vocabulary id of its row 0)
    chunk0: int         # its first ce_stats chunk among all the slabs'


@dataclass
class HeadCE:
    """The fused head's layout and scratch for one head and max_tokens (see the module's docstring)."""
    w: Weight
    max_tokens: int
    cap: float
    slabs: tuple[Slab, ...]
    stride: int                 # floats of the logits scratch a token: the longest slab
    stats_rows: int
    chunks: int                 # ce_stats chunks of all the slabs
    dx_chunk_rows: int | None   # dx_back's rows a chunk (None: its default)
    logits: gpu.Buffer          # [max_tokens, stride]: a slab's z, then its dlogits
    sums: gpu.Buffer            # dx_back's partial sums
    stats: gpu.Buffer           # [chunks, t] (max, sum-exp)
    tl: gpu.Buffer              # [max_tokens] the target's logit
    lse: gpu.Buffer             # [max_tokens] logsumexp of each row
    nll: gpu.Buffer             # [max_tokens] each row's loss (0 without a target)
    loss: gpu.Buffer            # LOSS_FLOATS: mean, count, 1 / N, sum

    @property
    def buffers(self) -> list[gpu.Buffer]:
        return [getattr(self, name) for name in SCRATCH]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def default_slab_rows(max_tokens: int) -> int:
    """Rows a slab for steps of up to max_tokens: SLAB_FLOATS of logits, whole SLAB_ALIGNs, at least one."""
    return max(SLAB_ALIGN, SLAB_FLOATS // max(1, max_tokens) // SLAB_ALIGN * SLAB_ALIGN)


def _row_range(w: Weight, part: WeightPart, row0: int, n: int) -> Weight:
    """Rows row0 .. row0 + n - 1 of `part` as a weight of one part (its binding padded to whole words)."""
    offset = row0 * w.row_bytes
    # the part's buffer holds its rows padded to a word (alloc_weight): the padded range stays inside it
    size = (n * w.row_bytes + 3) & ~3
    label = f"{part.buffer.label}[{row0}:{row0 + n}]"
    rows = WeightPart(RowRange(part.buffer, offset, size, label), 0, n)
    return Weight(f"{w.name}[{part.first_row + row0}:{part.first_row + row0 + n}]", w.type, n, w.cols, (rows,))


def cut_slabs(w: Weight, slab_rows: int, stats_rows: int) -> list[Slab]:
    """Each part's rows in slabs of slab_rows (the last of a part shorter), in order, with their chunks."""
    if slab_rows <= 0 or slab_rows % SLAB_ALIGN:
        raise ValueError(f"{w.name}: slabs of {slab_rows} rows are not whole multiples of {SLAB_ALIGN}")
    out, chunk0 = [], 0
    for part in w.parts:
        for row0 in range(0, part.n_rows, slab_rows):
            n = min(slab_rows, part.n_rows - row0)
            out.append(Slab(_row_range(w, part, row0, n), part.first_row + row0, chunk0))
            chunk0 += _ceil(n, stats_rows)
    return out


@dataclass(frozen=True)
class Layout:
    slabs: tuple[Slab, ...]
    stride: int                 # the longest slab's rows
    chunks: int                 # ce_stats chunks of all the slabs
    floats: dict[str, int]      # each scratch buffer's floats


def head_layout(w: Weight, max_tokens: int, *, slab_rows: int | None = None, stats_rows: int = STATS_ROWS,
                dx_chunk_rows: int | None = None) -> Layout:
    """The slabs and the scratch sizes of the fused head for steps of up to max_tokens rows (no device needed)."""
    if not 0 < max_tokens <= LOOP_MAX or not 0 < stats_rows <= LOOP_MAX // 2:
        raise ValueError(f"{w.name} head: max_tokens {max_tokens} and stats_rows {stats_rows} must be positive, "
                         f"within lavapipe's loop budget ({LOOP_MAX} and {LOOP_MAX // 2})")
    slabs = cut_slabs(w, slab_rows or default_slab_rows(max_tokens), stats_rows)
    chunks = slabs[-1].chunk0 + _ceil(slabs[-1].view.rows, stats_rows)
    if 2 * chunks > LOOP_MAX:
        raise gpu.GpuError(f"{w.name} head: {chunks} chunks of {stats_rows} rows pass lavapipe's loop budget in "
                           f"ce_merge: larger stats_rows")
    stride = max(s.view.rows for s in slabs)
    floats = {"logits": max_tokens * stride,
              "sums": max(dx_scratch_floats(s.view, max_tokens, dx_chunk_rows) for s in slabs),
              "stats": 2 * chunks * max_tokens, "tl": max_tokens, "lse": max_tokens, "nll": max_tokens,
              "loss": LOSS_FLOATS}
    return Layout(tuple(slabs), stride, chunks, floats)


def head_ce(device: gpu.Device, w: Weight, max_tokens: int, *, cap: float = 0.0, slab_rows: int | None = None,
            stats_rows: int = STATS_ROWS, dx_chunk_rows: int | None = None) -> HeadCE:
    """The fused head's slabs and scratch (kind CONVERSATION: they hold the text's scores) for steps of up to
    max_tokens rows. cap: the final soft-cap (0: none). slab_rows, stats_rows, dx_chunk_rows: the cuts (tests)."""
    if cap < 0:
        raise ValueError(f"{w.name} head: the soft-cap {cap} must be positive, or 0 for none")
    lay = head_layout(w, max_tokens, slab_rows=slab_rows, stats_rows=stats_rows, dx_chunk_rows=dx_chunk_rows)
    if _ceil(lay.stride, WG) > device.info.limits["max_compute_workgroups_per_dimension"]:
        raise gpu.GpuError(f"{w.name} head: slabs of {lay.stride} rows exceed the grid: smaller slabs")
    bufs = {name: device.buffer(4 * n, gpu.CONVERSATION, f"{w.name}.ce {name}") for name, n in lay.floats.items()}
    return HeadCE(w, max_tokens, float(cap), lay.slabs, lay.stride, stats_rows, lay.chunks, dx_chunk_rows, **bufs)


def free_head_ce(device: gpu.Device, ce: HeadCE) -> None:
    for buf in ce.buffers:
        device.destroy(buf)


def _params(device: gpu.Device, ce: HeadCE, label: str, *, t_off: int, rows_total: int = 0,
            slab: Slab | None = None) -> gpu.Buffer:
    v0, n, chunk0 = (slab.v0, slab.view.rows, slab.chunk0) if slab else (0, 0, 0)
    return device.uniform(_PARAMS.pack(ce.w.rows, v0, n, ce.stride, ce.stats_rows, chunk0, ce.chunks, t_off,
                                       ce.cap, rows_total, 0, 0), label)


def _slab_logits(device: gpu.Device, kernels: KernelCache, ce: HeadCE, slab: Slab, xn: gpu.Buffer,
                 step: gpu.Buffer, x_offset: int, x_stride: int | None) -> list[Op]:
    """The forward's matmul over the slab's rows into the logits scratch (token t's row at t * stride)."""
    return matmul(device, kernels, slab.view, xn, ce.logits, step, max_tokens=ce.max_tokens, x_offset=x_offset,
                  x_stride=x_stride, y_stride=ce.stride)


def _check_targets(ce: HeadCE, targets: gpu.Buffer, target_offset: int) -> None:
    if targets.size < 4 * (target_offset + ce.max_tokens):
        raise ValueError(f"{ce.w.name} head: targets {targets.label} hold {targets.size // 4} ids, need "
                         f"{target_offset + ce.max_tokens}")


def loss_params(device: gpu.Device, ce: HeadCE, *, rows_total: int = 0, target_offset: int = 0) -> gpu.Buffer:
    """The uniform of head_loss's merge and mean (its divisor N = rows_total; 0: the rows with a target): made by the
    caller when a step rewrites N (`rows_total_write`), then given to head_loss as `params`."""
    return _params(device, ce, f"{ce.w.name}.ce", t_off=target_offset, rows_total=rows_total)


def rows_total_write(params: gpu.Buffer, rows_total: int) -> tuple[gpu.Buffer, int, bytes]:
    """The host's write that makes a step's divisor N = rows_total (the positions with a target in all its windows),
    into a `loss_params` uniform: a write of the step's first window, before its dispatches read it."""
    return params, ROWS_TOTAL_AT, struct.pack("<I", rows_total)


def head_loss(device: gpu.Device, kernels: KernelCache, ce: HeadCE, xn: gpu.Buffer, targets: gpu.Buffer,
              step: gpu.Buffer, *, rows_total: int = 0, x_offset: int = 0, x_stride: int | None = None,
              target_offset: int = 0, params: gpu.Buffer | None = None) -> list[Op]:
    """The loss of the step's rows: token t's xn at xn[x_offset + t * x_stride ...] (stride defaults to n_embd), its
    target at targets[target_offset + t] (u32). Leaves lse and nll a row and ce.loss = (mean, count, 1 / N, sum),
    N = rows_total, or with 0 the count of rows with a target. head_back reads lse and 1 / N. params: the merge's and
    mean's uniform made by `loss_params` (then rows_total and target_offset are its), made here when None."""
    _check_targets(ce, targets, target_offset)
    k_stats = kernels.get("backward_head", "ce_stats", WG=WG)
    ops = []
    for slab in ce.slabs:
        ops += _slab_logits(device, kernels, ce, slab, xn, step, x_offset, x_stride)
        label = f"{slab.view.name}.ce_stats"
        slab_params = _params(device, ce, label, t_off=target_offset, slab=slab)
        groups = _ceil(_ceil(slab.view.rows, ce.stats_rows), WG)
        bound = device.bind(k_stats, [ce.logits, targets, ce.stats, ce.tl, slab_params, step], label)
        ops.append(Op(k_stats, bound, lambda t, g=groups: (g, max(1, t), 1)))
    if params is None:
        params = loss_params(device, ce, rows_total=rows_total, target_offset=target_offset)
    k_merge = kernels.get("backward_head", "ce_merge", WG=WG)
    k_loss = kernels.get("backward_head", "ce_loss", WG=WG)
    merge = device.bind(k_merge, [ce.stats, ce.tl, targets, ce.lse, ce.nll, params, step], f"{ce.w.name}.ce_merge")
    loss = device.bind(k_loss, [ce.nll, targets, ce.loss, params, step], f"{ce.w.name}.ce_loss")
    return ops + [Op(k_merge, merge, lambda t: (_ceil(max(1, t), WG), 1, 1)), Op(k_loss, loss, lambda t: (1, 1, 1))]


def head_back(device: gpu.Device, kernels: KernelCache, ce: HeadCE, xn: gpu.Buffer, targets: gpu.Buffer,
              dxn: gpu.Buffer, step: gpu.Buffer, *, x_offset: int = 0, x_stride: int | None = None,
              target_offset: int = 0, dx_offset: int = 0, dx_stride: int | None = None, accumulate: bool = False,
              dw: Sequence[WeightPart] | None = None) -> list[Op]:
    """The loss's gradient, run right after head_loss's ops (same ce, xn and targets; nothing else writes the
    scratch between them): dxn [t, n_embd] at
    dxn[dx_offset + t * dx_stride ...] written, or added into with accumulate=True; with `dw` (an F32 gradient of
    the head's shape in f32 parts of rows, WeightPart: buffer, first_row, n_rows; a tied head's is the embedding's
    gradient table) dW += dlogits^T xn too."""
    _check_targets(ce, targets, target_offset)
    if dw is not None and sum(p.n_rows for p in dw) != ce.w.rows:
        raise ValueError(f"{ce.w.name} head_back: dW's parts hold {sum(p.n_rows for p in dw)} rows, not {ce.w.rows}")
    k = kernels.get("backward_head", "ce_dlogits", WG=WG)
    ops = []
    # last slab first: head_loss left its z in the scratch, so its matmul is not run again (a head of one slab, up to
    # SLAB_FLOATS / n_vocab rows a step, computes its logits once for the loss and the gradient)
    for i, slab in enumerate(reversed(ce.slabs)):
        if i > 0:
            ops += _slab_logits(device, kernels, ce, slab, xn, step, x_offset, x_stride)
        label = f"{slab.view.name}.ce_dlogits"
        params = _params(device, ce, label, t_off=target_offset, slab=slab)
        bound = device.bind(k, [ce.logits, targets, ce.lse, ce.loss, params, step], label)
        ops.append(Op(k, bound, lambda t, g=_ceil(slab.view.rows, WG): (g, max(1, t), 1)))
        ops += dx_back(device, kernels, slab.view, ce.logits, dxn, ce.sums, step, max_tokens=ce.max_tokens,
                       accumulate=accumulate or i > 0, dy_stride=ce.stride, dx_offset=dx_offset,
                       dx_stride=dx_stride, chunk_rows=ce.dx_chunk_rows)
        if dw is not None:
            ops += _slab_dw(device, kernels, ce, slab, dw, xn, step, x_offset, x_stride)
    return ops


def _slab_dw(device: gpu.Device, kernels: KernelCache, ce: HeadCE, slab: Slab, dw: Sequence[WeightPart],
             xn: gpu.Buffer, step: gpu.Buffer, x_offset: int, x_stride: int | None) -> list[Op]:
    """dW[v, c] += sum_t dlogits[t, v] xn[t, c] over the slab's rows v, one GEMM for each dW part they meet (the
    parts of dW need not be the weight's)."""
    cols = ce.w.cols
    xs = cols if x_stride is None else x_stride
    ops = []
    for part in dw:
        lo = max(slab.v0, part.first_row)
        hi = min(slab.v0 + slab.view.rows, part.first_row + part.n_rows)
        if lo >= hi:
            continue
        ops.append(gemm(device, kernels, (ce.logits, lo - slab.v0, 1, ce.stride), (xn, x_offset, xs, 1),
                        (part.buffer, (lo - part.first_row) * cols, cols, 1), step, hi - lo, cols, ce.max_tokens,
                        tok=TOK_K, accumulate=True, label=f"{part.buffer.label}[{lo}:{hi}].ce_dw"))
    return ops
