"""Sampling reductions (wgsl/sample.wgsl): greedy argmax and sorted top-k over rows of logits, so a decode
step reads back one index or k (index, value) pairs instead of the whole vocabulary."""

from __future__ import annotations

import struct

from .. import gpu
from . import Op
from .elementwise import row_mode, rows_at, subgroup_consts

WG = 256
ARGMAX_EPT = 4      # elements per invocation in the part pass: chunks of 1024 logits
TOPK_EPT = 16       # chunks of 4096 logits: 64 chunks * k candidates for a 262,144 vocabulary
MAX_K = 64
PARAMS = struct.Struct("<8I")   # n, n_chunks, k, rows, mode, _p0, _p1, _p2
PAIR = struct.Struct("<If")     # struct Pair { index: u32, value: f32 } as the out buffer of top_k holds it
NONE = 0xFFFFFFFF


def _plan(device, n: int, rows, max_rows, ept: int, per_chunk: int, label: str):
    mode, count = row_mode(rows, max_rows)
    if mode == 1 and max_rows is None:
        raise ValueError(f"{label}: rows=None (per token) needs max_rows, the scratch capacity")
    n_chunks = -(-n // (WG * ept))
    scratch = device.buffer(8 * count * n_chunks * per_chunk, gpu.CONVERSATION, f"{label}.partial")
    return mode, count, n_chunks, scratch


def argmax(device: gpu.Device, kernels, logits: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer, n: int,
           rows=1, max_rows: int | None = None) -> list[Op]:
    """out[r] (u32) = index of the largest of row r's n logits, the lowest index among equal maxima.

    rows: an int (that many rows from row 0), "last" (the step's last token's row, result in out[0]), or
    None (one row per token, at most max_rows). Two ops: per-chunk bests into a scratch buffer (made here,
    kind CONVERSATION), then the merge. 0xffffffff when a row holds nothing but NaN and -inf."""
    consts = dict(WG=WG, EPT=ARGMAX_EPT, **subgroup_consts(device))
    mode, count, n_chunks, part = _plan(device, n, rows, max_rows, ARGMAX_EPT, 1, "argmax")
    params = device.uniform(PARAMS.pack(n, n_chunks, 1, count, mode, 0, 0, 0), "argmax.params")
    k1 = kernels.get("sample", "argmax_part", **consts)
    k2 = kernels.get("sample", "argmax_final", **consts)
    b1 = device.bind(k1, [part, params, step, logits], "argmax_part")
    b2 = device.bind(k2, [part, params, step, out], "argmax_final")
    nr = lambda t: max(1, rows_at(mode, count, t))  # noqa: E731
    return [Op(k1, b1, lambda t: (n_chunks, nr(t), 1)), Op(k2, b2, lambda t: (nr(t), 1, 1))]


def top_k(device: gpu.Device, kernels, logits: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer, n: int, k: int,
          rows=1, max_rows: int | None = None) -> list[Op]:
    """out[r*k + q] = the q-th largest (index u32, value f32) pair of row r, q < k <= 64, sorted by value
    descending, ties by lower index (8 bytes a pair, `PAIR`). NaN and -inf are never chosen; places beyond
    the row's other elements are (0xffffffff, -3.4028235e38). rows / max_rows as in `argmax`."""
    if not 1 <= k <= MAX_K or k > n:
        raise ValueError(f"top_k: k={k} must be in 1..{min(MAX_K, n)}")
    consts = dict(WG=WG, EPT=TOPK_EPT, **subgroup_consts(device))
    mode, count, n_chunks, part = _plan(device, n, rows, max_rows, TOPK_EPT, k, "top_k")
    params = device.uniform(PARAMS.pack(n, n_chunks, k, count, mode, 0, 0, 0), "top_k.params")
    k1 = kernels.get("sample", "topk_part", **consts)
    k2 = kernels.get("sample", "topk_final", **consts)
    b1 = device.bind(k1, [part, params, step, logits], "topk_part")
    b2 = device.bind(k2, [part, params, step, out], "topk_final")
    nr = lambda t: max(1, rows_at(mode, count, t))  # noqa: E731
    return [Op(k1, b1, lambda t: (n_chunks, nr(t), 1)), Op(k2, b2, lambda t: (nr(t), 1, 1))]
