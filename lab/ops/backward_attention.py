"""Causal attention's backward builder (issue #43, training in the tab; wgsl/backward_attention.wgsl): dQ, dK and dV
of lab.ops.attention's forward (GQA, sliding window, logit soft-cap, a scale) for the step's t queries at positions
pos .. pos + t - 1 over keys 0 .. pos + t - 1, given Q, K, V, the forward's output O and its gradient dO.

The probabilities are recomputed, never stored: a first pass (attn_stats) walks each query row's keys once for its
max m and sum l and takes D = dO . O; then attn_dq (one invocation per query row) and attn_dkv (one per key row and
KV head, summing over the group's query heads and the queries in a fixed order) recompute each P = exp(s - m) / l.
A GPU takes the same math in tiles (`tiles`): attn_dq_tiles (the statistics and dQ, a workgroup per 64 query rows of a
head) and attn_dkv_tiles (a workgroup per 32 keys of a KV head), each row of Q, K, V and dO loaded once a tile.
Conventions as lab/ops/backward.py's: gradients of inputs are written; every sum runs in a fixed order, so the pass
is bit-reproducible. lab/host/reference/grads_attention.py holds the float64 oracle (attention_grad) and the
tolerances; tests/kernels/test_backward_attention.py checks the kernels against it.

Rows: each tensor is a Buffer of compact rows or a tuple (buffer, offset, stride) in floats, row r's head h at
offset + r * stride + h * head_dim: q, o, do, dq have the step's t rows (compact stride n_head * head_dim; q may be
the forward's fused [q | k | v] row), k, v, dk, dv one row a key position (compact stride n_kv_head * head_dim: the
f32 KV cache is such a buffer).
"""

from __future__ import annotations

import math
import struct

from lab import gpu
from lab.ops import Op, groups_1d

WG = 64                  # a CPU adapter's workgroup: 64 rows of one lane
LANES_MAX = 64           # a GPU's lanes a row (fewer where HD floats a lane pass the workgroup memory: `default_lanes`)
STATS = struct.Struct("<4f")       # per (query row, head): m, 1 / l, D, unused
_PARAMS = struct.Struct("<20I2f2I")  # 8 (off, stride) pairs: q o do dq k v dk dv; n_head n_kv group window scale cap
# lavapipe stops an invocation's loops silently past 32,768 iterations (65,535 over nested loops together:
# tests/kernels/test_loop_budget.py); an invocation's iterations in all stay below this on such an adapter.
LOOP_LIMIT = 32_767


def stats_bytes(max_tokens: int, n_head: int) -> int:
    """Bytes of the statistics buffer: one vec4 (m, 1 / l, D, 0) per (query row, head)."""
    return STATS.size * max_tokens * n_head


def _rows(arg, width: int) -> tuple[gpu.Buffer, int, int]:
    """(buffer, offset, stride) of a Buffer of compact rows of `width` floats or of such a tuple."""
    if isinstance(arg, tuple):
        buf, off, stride = arg
        return buf, int(off), int(stride)
    return arg, 0, width


def loop_iterations(head_dim: int, n_keys: int, n_terms: int, lanes: int = 1) -> int:
    """The most loop iterations one invocation runs: attn_stats and attn_dq walk up to n_keys keys, each a q.k, a
    dO.v and an accumulation of head_dim / 4 vec4s (stats: q.k only, then D), attn_dkv up to n_terms (query, head)
    terms of the same work; `lanes` a row share them (and add the tree's adds)."""
    per = 3 * (head_dim // 4) + 1
    walk = -(-max(n_keys, n_terms) // lanes)
    tree = 0 if lanes == 1 else (lanes.bit_length() + 1) * 2 * (head_dim // 4)
    return walk * per + 2 * (head_dim // 4) + -(-n_terms // lanes) + tree


# The tiles' shapes (wgsl/backward_attention.wgsl: BQ, BK, DC and their workgroup memory)
TILE_Q, TILE_K, TILE_D = 64, 32, 8
TILE_SCRATCH = 2 * (TILE_Q + TILE_K) * (TILE_D + 1)     # floats: the chunks of Q, dO, K and V
TILE_BYTES = 4 * (TILE_SCRATCH + TILE_Q * TILE_K + 4 * TILE_Q)
TILE_HD_MAX = 256        # an invocation keeps 4 HD / 16 dQ or 2 HD / 8 dK and dV sums in registers


def tile_sub(head_dim: int) -> int:
    """Rows of K, dO or Q the tiles' products read at a time: the most, a power of two up to TILE_K, whose head_dim
    floats each fit the scratch."""
    sub = 1
    while sub * 2 <= TILE_K and sub * 2 * head_dim <= TILE_SCRATCH:
        sub *= 2
    return sub


def can_tile(device: gpu.Device, head_dim: int) -> bool:
    """Whether the tiles run at this head_dim on this device: a multiple of 16 up to TILE_HD_MAX, and the workgroup
    memory for them."""
    return (head_dim % 16 == 0 and head_dim <= TILE_HD_MAX
            and TILE_BYTES <= device.info.limits["max_compute_workgroup_storage_size"])


def tile_iterations(head_dim: int, n_keys: int, n_rows: int, group: int, n_ctx: int, max_tokens: int) -> int:
    """The most loop iterations an invocation of the tiles runs (to first order, every loop counted): attn_dq_tiles
    walks the keys its TILE_Q rows see (a row's n_keys and TILE_Q - 1 more, at most n_ctx) twice, attn_dkv_tiles the
    query rows that see its TILE_K keys (a key's n_rows and TILE_K - 1 more, at most max_tokens) of each of the
    group's heads; a tile's products (HD / 8 chunks), its loads and the dQ, dK, dV sums."""
    sub, chunks = tile_sub(head_dim), head_dim // TILE_D
    products = chunks * (1 + 3 + TILE_D * 4 * 3)
    dq = -(-min(n_keys + TILE_Q - 1, n_ctx) // TILE_K) * (2 * products + 8 + (TILE_K // sub) * (
        -(-sub * head_dim // 256) + sub * 4 * (1 + head_dim // 16)))
    dkv = group * -(-min(n_rows + TILE_K - 1, max_tokens) // TILE_Q) * (products + 8 + 2 * (TILE_Q // sub) * (
        -(-sub * head_dim // 256) + sub * (1 + head_dim // 8)))
    return max(dq + 4 * 9 + head_dim, dkv)


def default_lanes(device: gpu.Device, head_dim: int) -> int:
    """Lanes a row: 1 on a CPU adapter (wgsl/backward_attention.wgsl says why), else the most, up to LANES_MAX and a
    power of two, whose head_dim floats a lane fit the workgroup memory."""
    if device.info.software:
        return 1
    room = device.info.limits["max_compute_workgroup_storage_size"] // (4 * head_dim)
    lanes = 1
    while lanes * 2 <= min(LANES_MAX, room):
        lanes *= 2
    return lanes


def attention_back(device: gpu.Device, kernels, q, k, v, o, do, dq, dk, dv, stats: gpu.Buffer, step: gpu.Buffer, *,
                   n_head: int, n_kv_head: int, head_dim: int, n_ctx: int, max_tokens: int,
                   scale: float | None = None, window: int = 0, softcap: float = 0.0,
                   label: str = "attention_back", lanes: int | None = None, tiles: bool | None = None) -> list[Op]:
    """dq (the step's t rows), dk and dv (rows 0 .. pos + t - 1; keys no query sees get 0) of the attention of
    lab.ops.attention with these `scale` (default 1 / sqrt(head_dim)), `window` (W > 0: keys with qpos - k < W) and
    `softcap` (c > 0: scores c tanh(s / c)), for steps of t <= max_tokens tokens with pos + t <= n_ctx. `stats` is
    scratch of stats_bytes(max_tokens, n_head). Rows as the module's docstring says. Three ops in this order:
    attn_stats, attn_dq, attn_dkv (one compute pass: each dispatch sees the one before). dq, dk and dv are written,
    each a buffer other than the inputs (dk and dv may share one, dq too: a fused gradient row). `lanes` (a power of
    two) splits each row's walk (default_lanes: 1 on a CPU adapter, up to 64 on a GPU; tests force it). `tiles`
    (default: on a GPU where can_tile, unless `lanes` is given) runs the tiles instead, two ops: attn_dq_tiles,
    attn_dkv_tiles."""
    qd, kvd = n_head * head_dim, n_kv_head * head_dim
    rows = dict(q=_rows(q, qd), o=_rows(o, qd), do=_rows(do, qd), dq=_rows(dq, qd),
                k=_rows(k, kvd), v=_rows(v, kvd), dk=_rows(dk, kvd), dv=_rows(dv, kvd))
    lanes, tiles = _path(device, head_dim, lanes, tiles, label)
    _check(device, label, rows, stats, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim, n_ctx=n_ctx,
           max_tokens=max_tokens, window=window, softcap=softcap, lanes=lanes, tiles=tiles)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    packed = [x for name in ("q", "o", "do", "dq", "k", "v", "dk", "dv") for x in rows[name][1:]]
    params = device.uniform(_PARAMS.pack(*packed, n_head, n_kv_head, n_head // n_kv_head, window, scale,
                                         float(softcap), 0, 0), f"{label}.params")
    b = {name: r[0] for name, r in rows.items()}
    # dk and dv in one buffer (a fused gradient row) are bound once: WebGPU refuses two writable bindings of one
    # buffer with overlapping ranges in a dispatch (Dawn does; wgpu-native let it pass), and fused rows interleave
    fused = b["dk"] is b["dv"]
    layouts = {"attn_stats": [b["q"], b["k"], b["o"], b["do"], stats, params, step],
               "attn_dq": [b["q"], b["k"], b["v"], b["do"], stats, params, step, b["dq"]],
               "attn_dkv": [b["q"], b["k"], b["v"], b["do"], stats, params, step, b["dk"]] + ([] if fused else
                                                                                           [b["dv"]])}
    per = WG if lanes == 1 else 1                                  # rows a workgroup
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    g_rows = lambda t: groups_1d(max(1, t) * n_head, per, max_dim)  # noqa: E731  (a row per query row and head)
    g_keys = groups_1d(n_ctx * n_kv_head, per, max_dim)             # a row per key and KV head: every pos + t fits
    grids = {"attn_stats": g_rows, "attn_dq": g_rows, "attn_dkv": lambda t: g_keys,
             "attn_dq_tiles": lambda t: (-(-max(1, t) // TILE_Q), n_head, 1),
             "attn_dkv_tiles": lambda t: (-(-n_ctx // TILE_K), n_kv_head, 1)}    # tiles past pos + t: nothing
    if tiles:
        layouts = {"attn_dq_tiles": [b["q"], b["k"], b["v"], b["do"], stats, params, step, b["dq"], b["o"]],
                   "attn_dkv_tiles": layouts["attn_dkv"]}
    sub = tile_sub(head_dim)
    consts = dict(HEAD_DIM=head_dim, ROWS=per, LANES=lanes, RED=1 if lanes == 1 else lanes * head_dim // 4,
                  RED_ML=lanes, SUB=sub, SC=max(TILE_SCRATCH, sub * head_dim))
    ops = []
    for entry, res in layouts.items():
        # DV: the buffer attn_dkv writes dV to (the others never read it: "dv" keeps them one pipeline each)
        kern = kernels.get("backward_attention", entry, **consts,
                           DV="dk" if fused and entry.startswith("attn_dkv") else "dv")
        ops.append(Op(kern, device.bind(kern, res, f"{label}.{entry}"), grids[entry]))
    return ops


def _path(device: gpu.Device, head_dim: int, lanes: int | None, tiles: bool | None, label: str) -> tuple[int, bool]:
    """(lanes, tiles) as attention_back takes them: the tiles on a GPU where they run unless lanes are given (tests
    force the lanes on any adapter), else the lanes (default_lanes); each checked against the device."""
    if tiles is None:
        tiles = lanes is None and not device.info.software and can_tile(device, head_dim)
    if tiles and not can_tile(device, head_dim):
        raise ValueError(f"{label}: the tiles need head_dim a multiple of 16 up to {TILE_HD_MAX} (not {head_dim}) "
                         f"and {TILE_BYTES} bytes of workgroup memory")
    lanes = 1 if tiles else default_lanes(device, head_dim) if lanes is None else int(lanes)
    if lanes < 1 or lanes & (lanes - 1) or lanes * 4 * head_dim > device.info.limits[
            "max_compute_workgroup_storage_size"]:
        raise ValueError(f"{label}: {lanes} lanes a row: a power of two whose {head_dim} floats each fit the "
                         f"workgroup memory")
    return lanes, tiles


def _need(buf: gpu.Buffer, floats: int, what: str) -> None:
    if buf.size < 4 * floats:
        raise ValueError(f"{what}: buffer {buf.label} has {buf.size} bytes, needs {4 * floats}")


def _check(device: gpu.Device, label: str, rows: dict, stats: gpu.Buffer, *, n_head: int, n_kv_head: int,
           head_dim: int, n_ctx: int, max_tokens: int, window: int, softcap: float, lanes: int,
           tiles: bool) -> None:
    """attention_back's checks: the shapes, the grid and, on an adapter with a loop budget, each invocation's
    iterations; then distinct buffers for what is written and every buffer long enough."""
    if n_kv_head <= 0 or n_head % n_kv_head:
        raise ValueError(f"{label}: n_head {n_head} is not a multiple of n_kv_head {n_kv_head}")
    if head_dim <= 0 or head_dim % 4:
        raise ValueError(f"{label}: head_dim {head_dim} is not a multiple of 4")
    if not 0 < max_tokens <= n_ctx or window < 0 or softcap < 0:
        raise ValueError(f"{label}: max_tokens {max_tokens} of n_ctx {n_ctx}, window {window}, softcap {softcap}")
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    if max(n_ctx * n_kv_head, max_tokens * n_head) > max_dim * max_dim:
        raise gpu.GpuError(f"{label}: {n_ctx} keys x {n_kv_head} KV heads exceed the grid")
    keys = min(n_ctx, window) if window else n_ctx
    terms = min(max_tokens, keys) * (n_head // n_kv_head)
    if tiles:
        if device.info.loop_budget and tile_iterations(head_dim, keys, min(max_tokens, keys), n_head // n_kv_head,
                                                       n_ctx, max_tokens) > LOOP_LIMIT:
            raise gpu.GpuError(f"{label}: {keys} keys at head_dim {head_dim} run the tiles past {LOOP_LIMIT:,} loop "
                               f"iterations an invocation, where {device.info.name} stops loops")
    elif device.info.loop_budget and loop_iterations(head_dim, keys, terms, lanes) > LOOP_LIMIT:
        raise gpu.GpuError(f"{label}: {keys} keys or {terms} query terms at head_dim {head_dim} run past "
                           f"{LOOP_LIMIT:,} loop iterations an invocation, where {device.info.name} stops loops")
    inputs = {rows[n][0] for n in ("q", "k", "v", "o", "do")}
    if any(rows[n][0] in inputs | {stats} for n in ("dq", "dk", "dv")) or stats in inputs:
        raise ValueError(f"{label}: dq, dk, dv and stats must be buffers other than the inputs (WebGPU refuses one "
                         f"buffer bound read-only and writable in one dispatch)")
    for name, (buf, off, stride) in rows.items():
        heads, n_rows = (n_kv_head, n_ctx) if name in ("k", "v", "dk", "dv") else (n_head, max_tokens)
        if stride < heads * head_dim:
            raise ValueError(f"{label}: {name}'s stride {stride} is shorter than its row")
        _need(buf, off + (n_rows - 1) * stride + heads * head_dim, f"{label} {name}")
    _need(stats, stats_bytes(max_tokens, n_head) // 4, f"{label} stats")
