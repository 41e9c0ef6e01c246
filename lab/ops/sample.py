"""Sampling reductions (wgsl/sample.wgsl): greedy argmax and sorted top-k over rows of logits, so a decode
step reads back one index or k (index, value) pairs instead of the whole vocabulary."""

from __future__ import annotations

import struct

from lab import gpu
from lab.gpu.shaders import subgroup_consts
from lab.ops import Op
from lab.ops.rows import WGSL as ROWS_WGSL
from lab.ops.rows import Rows
from lab.ops.rows import check as check_rows

WG = 256
ARGMAX_EPT = 4      # elements per invocation in the part pass: chunks of 1024 logits
TOPK_EPT = 16       # chunks of 4096 logits: 64 chunks * k candidates for a 262,144 vocabulary
MAX_K = 64          # the largest k the top-k kernel takes (its candidates per chunk); the engine asks for
                    # lab.settings.MAX_CANDIDATES
PARAMS = struct.Struct("<8I")   # n, n_chunks, k, rows, mode, _p0, _p1, _p2
PAIR = struct.Struct("<If")     # struct Pair { index: u32, value: f32 } as the out buffer of top_k holds it
NONE = 0xFFFFFFFF


def _plan(device, n: int, rows: Rows, ept: int, per_chunk: int, label: str):
    if not rows.capped:
        raise ValueError(f"{label}: Rows.per_token() needs max_rows, the scratch capacity")
    n_chunks = -(-n // (WG * ept))
    scratch = device.buffer(8 * rows.count * n_chunks * per_chunk, gpu.CONVERSATION, f"{label}.partial")
    return n_chunks, scratch


def argmax(device: gpu.Device, kernels, logits: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer, n: int,
           rows: Rows = Rows.fixed(1)) -> list[Op]:
    """out[r] (u32) = index of the largest of row r's n logits, the lowest index among equal maxima.

    rows: Rows.fixed(n) (rows 0..n-1; default one), Rows.last() (the step's last token's row, result in out[0]),
    or Rows.per_token(max_rows) (one row per token, at most max_rows: the scratch is sized for them). Two ops:
    per-chunk bests into a scratch buffer (made here, kind CONVERSATION), then the merge. 0xffffffff when a
    row holds nothing finite."""
    return _two_pass(device, kernels, "argmax", logits, out, step, n, 1, rows, ARGMAX_EPT)


def top_k(device: gpu.Device, kernels, logits: gpu.Buffer, out: gpu.Buffer, step: gpu.Buffer, n: int, k: int,
          rows: Rows = Rows.fixed(1)) -> list[Op]:
    """out[r*k + q] = the q-th largest (index u32, value f32) pair of row r, q < k <= 64, sorted by value
    descending, ties by lower index (8 bytes a pair, `PAIR`). NaN and +-inf are never chosen; places beyond
    the row's other elements are (0xffffffff, -3.4028235e38). rows as in `argmax`."""
    if not 1 <= k <= MAX_K or k > n:
        raise ValueError(f"top_k: k={k} must be in 1..{min(MAX_K, n)}")
    return _two_pass(device, kernels, "topk", logits, out, step, n, k, rows, TOPK_EPT)


def _two_pass(device, kernels, name: str, logits, out, step, n: int, k: int, rows: Rows, ept: int) -> list[Op]:
    """`{name}_part` (per-chunk best k pairs of each row into a scratch) then `{name}_final` (the merge)."""
    check_rows(rows)
    consts = dict(WG=WG, EPT=ept, **ROWS_WGSL, **subgroup_consts(device))
    n_chunks, part = _plan(device, n, rows, ept, k, name)
    params = device.uniform(PARAMS.pack(n, n_chunks, k, rows.count, rows.mode, 0, 0, 0), f"{name}.params")
    k1 = kernels.get("sample", f"{name}_part", **consts)
    k2 = kernels.get("sample", f"{name}_final", **consts)
    b1 = device.bind(k1, [part, params, step, logits], f"{name}_part")
    b2 = device.bind(k2, [part, params, step, out], f"{name}_final")
    nr = lambda t: max(1, rows.at(t))
    return [Op(k1, b1, lambda t: (n_chunks, nr(t), 1)), Op(k2, b2, lambda t: (nr(t), 1, 1))]
