"""Attention and the KV-cache write (wgsl/attention.wgsl, wgsl/kv.wgsl).

KV cache, one layer: two buffers, K and V, each [n_ctx, n_kv_head * head_dim] row-major values, f32 or (`kv="f16"`,
KV_TYPES) f16; row p holds the key (value) of the token at position p, heads side by side (head g at columns
g*head_dim ..). `kv_write` fills rows pos .. pos+t-1 of a step from any token-major source (the kernel checks'
attention cases use it; the engine's plans write the cache in their rope op, lab/ops/rope.py `cache=`, or in
decode's QKV projection, QkvRope); `attention` reads rows 0 .. pos+t-1.

Attention, for token j of the step (position qpos = pos + j) and query head h, with GROUP = n_head / n_kv_head:
    kv = h // GROUP;  s_k = cap(scale * q . k_k), cap(x) = c * tanh(x / c) when softcap c > 0
    key k visible iff k <= qpos and (window W == 0 or qpos - k < W)      (llama.cpp's standard sliding window)
    out[j, h*hd : (h+1)*hd] = sum_k softmax(s)_k v_k                      (out is [t, n_head * head_dim])

Probe (optional): the attention probabilities, f32 [t, n_head, n_ctx]: P(token j, head h, key k) at
(j * n_head + h) * n_ctx + k, zero for keys the token does not see; each row sums to 1. A separate pipeline
variant (constant PROBE); without a probe the kernel has no probe binding and no probe code.

Decode is split-K ("flash decoding"): `decode_split` runs one workgroup per (chunk of keys, block of HPW query heads
sharing a KV head, token), each writing its chunk's softmax state (max, sum, unnormalised V sum) to a scratch buffer
the builder allocates (kind CONVERSATION, sized for n_ctx); `decode_combine`, the next dispatch of the same pass,
merges the chunks of each (head, token) with the log-sum-exp rescaling. The grid (n_chunks workgroups per head block
and token) is fixed at plan time for n_ctx; each step cuts its own visible keys into that many chunks of whole tiles
(so 2,048 keys of a 32k cache still fill the grid), chunks past them exit at once and the combine reads only the
chunks that hold visible keys. With a probe,
a third dispatch `decode_probs` writes the probabilities from the global max and sum the combine left.
`prefill` is one workgroup per block of query rows of one KV head, K/V tiles shared by the rows (see the WGSL header).
Both are correct for any t (decode for t up to `max_tokens`, its scratch's size); `attention(mode="auto")` returns
the decode ops and the prefill op with complementary grids, so that a step of one token runs only decode and a longer
step only prefill (the other ops' grids are (0, 0, 0): no-op dispatches).
"""

from __future__ import annotations

import math
import struct

from lab import gpu
from lab.gpu.shaders import subgroup_consts
from lab.ops import ATTENTION, KV_WRITE, Op, groups_1d

KV_WG = 64
WG = 64            # threads per attention workgroup (a power of two)
TK = 64            # decode: keys per tile (one key per thread)
MAX_CHUNKS = 256   # decode: the default chunk splits n_ctx into at most this many chunks (a multiple of TK keys each)
                   # Qwen2.5 on the H200, decode at 8,192 / 32,768 keys of a 32k cache: 64 452 / 262 tok/s, 128
                   # 501 / 347, 256 559 / 408, 512 563 / 357 (docs/results/h200_long_contexts/max_chunks)
WHOLE_KEYS = 128   # decode on a GPU: steps with at most this many keys run "whole" (one dispatch; the split and its
                   # combine cost two dispatches, each ~2 us of switching on an H200, against two tiles walked serially)
WG_BYTES = 16384   # workgroup memory the kernels may use (WebGPU's default limit); decode's HPW is chosen to fit
Q_FLOATS = 1024    # prefill: floats of Q per workgroup (BQ = Q_FLOATS / head_dim rows, at most 16)
KV_FLOATS = 1024   # prefill: floats of one K or V tile (BK = KV_FLOATS / head_dim keys, at most 32); both tiles
                   # are held at once, within WG_BYTES
# narrow prefill tiles (GPUs): SmolLM2's 512-token prefill attention took 13.1 ms on an H200 with the tiles
# above, 7.2 ms with 4 rows and 1,024 floats of keys; Gemma 3's (head 256) the same either way.
NARROW_ROWS = 4
NARROW_KV_FLOATS = 1024
# prefill_rows (GPUs with subgroups, no probe): WG / 4 query rows a workgroup, four lanes a row; K and V tiles of RK
# keys fill WG_BYTES between them. SmolLM2's 512-token prefill attention on the H200: 163 us a layer with the narrow
# tiles above, 99 us with these (docs/performance.md).
ROWS_LANES = 4

# The resources of each entry, in binding order (binding i = the i-th one; the probe only in the probe variant).
RESOURCES = ("q_src", "k_cache", "v_cache", "out", "step", "params", "scratch", "probe")
ENTRY_RESOURCES = {
    "decode_split": ("q_src", "k_cache", "v_cache", "step", "params", "scratch"),
    "decode_combine": ("out", "step", "params", "scratch"),
    "decode_probs": ("q_src", "k_cache", "step", "params", "scratch", "probe"),
    "decode_whole": ("q_src", "k_cache", "v_cache", "out", "step", "params"),
    "prefill": ("q_src", "k_cache", "v_cache", "out", "step", "params", "probe"),
    "prefill_rows": ("q_src", "k_cache", "v_cache", "out", "step", "params"),
}

# The cache's element types, by name -> bytes a value. "f32" is exact (what the parity with llama.cpp's F32 runs
# needs); "f16" halves the cache's memory and the bytes attention reads a key (llama.cpp's default cache type). The
# f16 values are IEEE halves two to a u32 word, written with pack2x16float and read with unpack2x16float, both core
# WGSL: the f16 cache works on every adapter, shader-f16 or not (the page on NVIDIA/Linux has no shader-f16 without a
# browser flag, SwiftShader none at all). Every kernel that binds a cache has both forms (kv_consts) and computes in
# f32: only the stored values are rounded.
KV_TYPES = {"f32": 4, "f16": 2}

_KV_PARAMS = struct.Struct("<8I")
_ATTN_PARAMS = struct.Struct("<5I2f5I")


def kv_cache_bytes(n_ctx: int, n_kv_head: int, head_dim: int, kv: str = "f32") -> int:
    """Bytes of one of a layer's two caches (K or V) of element type `kv`."""
    return KV_TYPES[kv] * n_ctx * n_kv_head * head_dim


def kv_consts(kv: str) -> dict:
    """The line switches of a kernel that binds a KV cache of element type `kv`: lines prefixed `{{KV32}}` are live
    for an f32 cache, `{{KV16}}` for an f16 one (the other prefix becomes `// `), as subgroup_consts switches SG."""
    if kv not in KV_TYPES:
        raise ValueError(f"KV cache type {kv!r}: one of {', '.join(KV_TYPES)}")
    return {"KV32": "" if kv == "f32" else "// ", "KV16": "" if kv == "f16" else "// "}


def probe_bytes(max_tokens: int, n_head: int, n_ctx: int) -> int:
    """Bytes of a probe buffer for steps of up to `max_tokens` tokens."""
    return 4 * max_tokens * n_head * n_ctx


def kv_write(device: gpu.Device, kernels, src, k_cache, v_cache, step, *, n_kv_head: int, head_dim: int,
             src_stride: int, k_offset: int, v_offset: int, n_ctx: int, kv: str = "f32",
             label: str = "kv_write") -> list[Op]:
    """Copy the step's t K rows (at src[j*src_stride + k_offset ..]) and V rows (at v_offset) into cache rows
    pos .. pos+t-1 of caches of element type `kv`. Strides and offsets are in floats."""
    kvd = n_kv_head * head_dim
    for buf, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if buf.size < kv_cache_bytes(n_ctx, n_kv_head, head_dim, kv):
            raise ValueError(f"{label}: {name} holds {buf.size} bytes, "
                             f"needs {kv_cache_bytes(n_ctx, n_kv_head, head_dim, kv)}")
    if max(k_offset, v_offset) + kvd > src_stride:
        raise ValueError(f"{label}: K/V columns run past the source row ({src_stride} floats)")
    if kvd % 2:
        raise ValueError(f"{label}: a cache row of {kvd} values (the kernel copies pairs)")
    kernel = kernels.get("kv", "kv_write", WG=KV_WG, **kv_consts(kv))
    params = device.uniform(_KV_PARAMS.pack(kvd, src_stride, k_offset, v_offset, n_ctx, 0, 0, 0), f"{label}.params")
    bound = device.bind(kernel, [src, k_cache, v_cache, step, params], label)
    max_dim = device.info.limits["max_compute_workgroups_per_dimension"]
    return [Op(kernel, bound, lambda t: groups_1d(t * kvd // 2, KV_WG, max_dim), KV_WRITE)]     # a pair each


def decode_chunk(n_ctx: int) -> int:
    """Keys per decode_split workgroup: TK times the fewest tiles that cut n_ctx into at most MAX_CHUNKS chunks."""
    return TK * max(1, -(-n_ctx // (TK * MAX_CHUNKS)))


def budget_keys(loop_budget: int, head_dim: int) -> int | None:
    """The most keys attention may walk on an adapter whose shader invocations stop looping after `loop_budget`
    iterations (AdapterInfo.loop_budget; None: no limit). Measured on lavapipe (budget 65,535): the CPU adapters'
    prefill tiles, the first kernel cut, lose keys past about 6,800 with heads of 64 and 2,160 with heads of 256
    (tests/kernels/test_loop_budget.py); this keeps 6,400 keys at heads of 64, in proportion to the budget and
    inversely to the head size (1,600 at 256)."""
    if not loop_budget:
        return None
    return 6_400 * loop_budget // 65_535 * 64 // head_dim


def scratch_bytes(max_tokens: int, n_head: int, head_dim: int, n_chunks: int) -> int:
    """Bytes of decode's scratch: per (token, head) a stats vec4, then per chunk (m, l) and the V sum."""
    return 16 * max_tokens * n_head * (1 + n_chunks * (1 + head_dim // 4))


def _tiles(head_dim: int, narrow: bool = False) -> tuple[int, int, int, int]:
    """(HD4, NP, BQ, BK) for a head size: vec4s per head, decode's key parts, prefill's rows and keys per tile.
    narrow: prefill tiles of NARROW_ROWS rows and NARROW_KV_FLOATS of keys, for GPUs (more workgroups)."""
    hd4 = head_dim // 4
    if narrow:
        return hd4, max(1, WG // hd4), NARROW_ROWS, max(1, min(32, NARROW_KV_FLOATS // head_dim))
    return hd4, max(1, WG // hd4), max(1, min(16, Q_FLOATS // head_dim)), max(1, min(32, KV_FLOATS // head_dim))


def rows_keys(head_dim: int) -> int:
    """prefill_rows' keys per tile: its K and V tiles fill WG_BYTES (at most 32 keys)."""
    return max(1, min(32, WG_BYTES // (2 * 4 * head_dim)))


def workgroup_bytes(head_dim: int, hpw: int = 1, narrow: bool = False) -> dict[str, int]:
    """Workgroup memory of each entry, for the limit check (WebGPU's default limit is 16 KiB)."""
    hd4, n_parts, bq, bk = _tiles(head_dim, narrow)
    q = 16 * hpw * hd4
    split = q + 4 * hpw * TK + 4 * hpw * WG + 16 * hpw * hd4 * n_parts
    return {"decode_split": split,
            "decode_whole": split,
            "decode_combine": 0,
            "decode_probs": q,
            "prefill": 16 * bq * hd4 + 2 * 16 * bk * hd4 + 4 * bq * bk + 8 * bq,
            "prefill_rows": 2 * 16 * rows_keys(head_dim) * hd4}


def heads_per_workgroup(head_dim: int, group: int, limit: int = WG_BYTES) -> int:
    """Decode's HPW: the largest divisor of the GQA group whose split workgroup fits `limit` bytes (at least 1)."""
    fits = [d for d in range(1, group + 1) if group % d == 0 and workgroup_bytes(head_dim, d)["decode_split"] <= limit]
    return max(fits, default=1)


def _bound(entry: str, probe: bool) -> list[str]:
    """The resources an entry binds, in binding order: ENTRY_RESOURCES, the probe only in the probe variant."""
    return [r for r in ENTRY_RESOURCES[entry] if r != "probe" or probe]


def _consts(head_dim: int, group: int, n_kv_head: int, probe: bool, entry: str = "prefill",
            hpw: int | None = None, narrow: bool = False, sg: dict | None = None, kv: dict | None = None) -> dict:
    """The WGSL constants of one entry's variant, its binding numbers included: the resources the entry uses are
    0, 1, .. in ENTRY_RESOURCES order; every other resource gets a number past them that no layout asks for."""
    hd4, n_parts, bq, bk = _tiles(head_dim, narrow)
    hpw = heads_per_workgroup(head_dim, group) if hpw is None else hpw
    used = _bound(entry, probe)
    unused = [r for r in RESOURCES if r not in used]
    binding = {r: i for i, r in enumerate(used)} | {r: len(RESOURCES) + i for i, r in enumerate(unused)}
    return dict(HEAD_DIM=head_dim, GROUP=group, N_KV_HEAD=n_kv_head, WG=WG, TK=TK, HPW=hpw,
                NP=n_parts, DPT=-(-(hd4 * n_parts) // WG), BQ=bq, BK=bk, ACC=-(-(bq * hd4) // WG),
                PROBE=probe, PROBE_OFF="" if probe else "//", RK=rows_keys(head_dim),
                **(sg or {"SG_ENABLE": "", "SG": "// ", "NOSG": ""}), **(kv or kv_consts("f32")),
                **{f"B_{r.upper()}": n for r, n in binding.items()})


def attention(device: gpu.Device, kernels, q_src, k_cache, v_cache, out, step, *, n_head: int, n_kv_head: int,
              head_dim: int, q_stride: int, q_offset: int, n_ctx: int, scale: float | None = None,
              window: int = 0, softcap: float = 0.0, probe=None, mode: str = "auto", max_tokens: int = 1,
              chunk: int | None = None, narrow: bool = False, rows: bool | None = None, kv: str = "f32",
              label: str = "attention") -> list[Op]:
    """Attention of the step's t queries (Q of token j, head h at q_src[j*q_stride + q_offset + h*head_dim ..])
    over cache rows 0 .. pos+t-1, into `out` [t, n_head*head_dim]. `scale` defaults to 1/sqrt(head_dim);
    `window` W > 0 keeps keys with qpos - k < W; `softcap` c > 0 maps each scaled score s to c*tanh(s/c);
    `probe`, a buffer of probe_bytes(max t, n_head, n_ctx), receives the probabilities.
    `mode`: "decode" or "prefill" forces that entry for every t; "auto" uses decode for t == 1, prefill otherwise;
    "whole" is decode in one dispatch (decode_whole: one workgroup per head block walks every key; no probe).
    Decode: `max_tokens` is the most tokens a decode step may have (its scratch is sized for them); `chunk` the keys
    per split workgroup when all n_ctx are visible (default decode_chunk(n_ctx)), which sets the grid's
    n_chunks = ceil(n_ctx / chunk); a step with fewer keys cuts them into as many chunks. Prefill: `narrow` tiles
    (NARROW_ROWS query rows per workgroup) spread a prompt over more workgroups: what a GPU wants, while a CPU
    adapter pays per workgroup.
    `rows`: the prefill_rows entry (four lanes a query row, subgroup shuffles); default: narrow, no probe, the
    device has subgroups and head_dim is a multiple of 16. `kv`: the caches' element type (KV_TYPES).
    Returns the ops in dispatch order: decode_split, decode_combine, [decode_probs,] then prefill, as `mode` keeps
    (decode_whole alone for "whole")."""
    _check_arguments(label, k_cache, v_cache, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim,
                     q_stride=q_stride, q_offset=q_offset, n_ctx=n_ctx, probe=probe, mode=mode, kv=kv)
    group = n_head // n_kv_head
    chunk = decode_chunk(n_ctx) if chunk is None else int(chunk)
    if chunk < 1 or max_tokens < 1:
        raise ValueError(f"{label}: chunk {chunk} and max_tokens {max_tokens} must be positive")
    n_chunks = -(-n_ctx // chunk)

    # 1. The variant: the entries that run, and how many query heads a decode workgroup takes within the limit.
    hpw, entries = _variant(device, label, mode=mode, probe=probe is not None, narrow=narrow, rows=rows,
                            head_dim=head_dim, group=group)

    # 2. What the entries bind: the parameters, and decode's scratch (sized for max_tokens).
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    params = device.uniform(_ATTN_PARAMS.pack(q_stride, q_offset, n_head, n_ctx, window, scale, float(softcap),
                                              chunk, n_chunks, 0, 0, 0), f"{label}.params")
    res = dict(q_src=q_src, k_cache=k_cache, v_cache=v_cache, out=out, step=step, params=params, probe=probe)
    if mode in ("auto", "decode"):
        res["scratch"] = device.buffer(scratch_bytes(max_tokens, n_head, head_dim, n_chunks), gpu.CONVERSATION,
                                       f"{label}.scratch [{max_tokens}, n_head, 1 + {n_chunks} chunks * (1 + hd/4)]")

    # 3. One op per entry: its kernel variant, its bind group and its grid.
    grids = _grids(label, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim, narrow=narrow, hpw=hpw,
                   n_ctx=n_ctx, n_chunks=n_chunks, max_tokens=max_tokens)
    sg, kvc = subgroup_consts(device), kv_consts(kv)
    ops = []
    for entry in entries:
        kernel = kernels.get("attention", entry, **_consts(head_dim, group, n_kv_head, probe is not None, entry, hpw,
                                                               narrow, sg, kvc))
        bound = device.bind(kernel, [res[r] for r in _bound(entry, probe is not None)], f"{label}.{entry}")
        grid = grids[entry]
        if mode == "auto":
            grid = _auto(grid, decode=not entry.startswith("prefill"))
        ops.append(Op(kernel, bound, grid, ATTENTION))
    return ops


def _check_arguments(label: str, k_cache, v_cache, *, n_head: int, n_kv_head: int, head_dim: int, q_stride: int,
                     q_offset: int, n_ctx: int, probe, mode: str, kv: str = "f32") -> None:
    """attention's checks of its arguments, before anything is built."""
    if n_head % n_kv_head:
        raise ValueError(f"{label}: n_head {n_head} is not a multiple of n_kv_head {n_kv_head}")
    if head_dim % 4:
        raise ValueError(f"{label}: head_dim {head_dim} is not a multiple of 4")
    if mode not in ("auto", "decode", "prefill", "whole"):
        raise ValueError(f"{label}: unknown mode {mode!r}")
    if mode == "whole" and probe is not None:
        raise ValueError(f"{label}: the whole decode has no probe variant (the probes use the split)")
    for buf, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if buf.size < kv_cache_bytes(n_ctx, n_kv_head, head_dim, kv):
            raise ValueError(f"{label}: {name} is smaller than {n_ctx} rows of {kv}")
    if q_offset + n_head * head_dim > q_stride:
        raise ValueError(f"{label}: Q columns run past the source row ({q_stride} floats)")


def _variant(device: gpu.Device, label: str, *, mode: str, probe: bool, narrow: bool, rows: bool | None,
             head_dim: int, group: int) -> tuple[int, list[str]]:
    """Decode's query heads a workgroup (HPW) and the entries attention dispatches, each checked against the device's
    workgroup memory (at most WG_BYTES, what the tiles are sized for)."""
    limit = min(WG_BYTES, device.info.limits["max_compute_workgroup_storage_size"])
    hpw = heads_per_workgroup(head_dim, group, limit)
    entries = _entries(device, mode, probe, narrow, rows, head_dim, label)
    need = workgroup_bytes(head_dim, hpw, narrow)
    for entry in entries:
        if need[entry] > limit:
            raise gpu.GpuError(f"{label}: {entry} needs {need[entry]} bytes of workgroup memory, the limit is {limit}")
    return hpw, entries


def _entries(device: gpu.Device, mode: str, probe: bool, narrow: bool, rows: bool | None, head_dim: int,
             label: str) -> list[str]:
    """The entries attention dispatches, in order: decode_whole alone for mode "whole"; else decode_split,
    decode_combine (and decode_probs with a probe) unless mode is "prefill", then prefill or prefill_rows unless
    mode is "decode" (`rows` as attention's docstring says)."""
    if mode == "whole":
        return ["decode_whole"]
    has_sg = "subgroups" in device.info.features
    if rows is None:
        rows = narrow and not probe and has_sg and head_dim % 16 == 0
    elif rows and (probe or not has_sg or head_dim % 16):
        raise ValueError(f"{label}: prefill_rows needs subgroups, no probe and head_dim a multiple of 16")
    decode = ["decode_split", "decode_combine"] + (["decode_probs"] if probe else [])
    prefill = ["prefill_rows" if rows else "prefill"]
    return ([] if mode == "prefill" else decode) + ([] if mode == "decode" else prefill)


def _grids(label: str, *, n_head: int, n_kv_head: int, head_dim: int, narrow: bool, hpw: int, n_ctx: int,
           n_chunks: int, max_tokens: int) -> dict:
    """Each entry's workgroups for a step of t tokens; the split decode refuses more tokens than its scratch holds."""
    group = n_head // n_kv_head
    bq = _tiles(head_dim, narrow)[2]

    def decode_t(t: int) -> int:
        if t > max_tokens:
            raise ValueError(f"{label}: a decode step of {t} tokens, its scratch holds {max_tokens}")
        return t

    return {
        "decode_split": lambda t: (n_chunks, n_head // hpw, decode_t(t)),
        "decode_combine": lambda t: (n_head, decode_t(t), 1),
        "decode_probs": lambda t: (-(-n_ctx // WG), n_head // hpw, decode_t(t)),
        "decode_whole": lambda t: (1, n_head // hpw, t),
        "prefill": lambda t: (-(-(t * group) // bq), n_kv_head, 1),
        "prefill_rows": lambda t: (-(-(t * group) // (WG // ROWS_LANES)), n_kv_head, 1),
    }


def _auto(grid, decode: bool):
    """mode "auto": a decode entry works on steps of one token, a prefill entry on longer ones; the other steps
    dispatch nothing (a grid of (0, 0, 0))."""
    return lambda t: grid(t) if (t == 1) == decode else (0, 0, 0)
