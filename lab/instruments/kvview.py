"""The KV panel's picture: how large each cached K and V row is, per layer and position, read from the GPU.

- `KvView(engine).norms(a, b)`: the L2 norm of every layer's K row and V row at positions a .. b-1 (over all KV heads
  x head_dim of the layer), computed on the GPU by wgsl/kvview.wgsl: one dispatch per layer in one pass, then one
  read of 2 x n_layer x (b - a) floats. The chat calls it as tokens arrive, so the picture grows with the cache.
- `AfterPicture`: the same picture computed in Python from the bytes Forget read back after its wipe
  (lab/instruments/forget.py `wipe(on_after=...)`), so the page can redraw the heatmap from what the GPU holds once
  the cache is cleared. It shares nothing with the kernel: a wrong kernel cannot make a dirty cache look clean.

Layout of a picture: f32 [positions, n_layer, 2], [p, l, 0] = |K| and [p, l, 1] = |V| of layer l at position p. A
layer without attention (lfm2's short-conv blocks, qwen35's delta-net layers: `engine.kv_layers` lists the others)
has no cache: its cells stay 0, and the page draws no row for it (its memory is lab/instruments/memory.py's).

What it does not know: tokens or text (the page labels positions), sessions (the caller says which positions are
filled), the wipe itself (lab/instruments/forget.py).
"""

from __future__ import annotations

import math
import struct
import time
from array import array

from lab import gpu, ops
from lab.instruments.forget import nonzero_words
from lab.ops.attention import kv_consts

COLS = 256             # positions one pass covers: the output is [COLS, n_layer, 2] f32 (61 KB for SmolLM2)
WG = 64
_SPAN = struct.Struct("<4I")      # struct Span { a, n, _, _ } in wgsl/kvview.wgsl
_LAYER = struct.Struct("<4I")     # struct LayerParams { layer, n_layer, kvd, _ }


class KvView:
    """The norms pass for one engine's cache; built once, `close` frees its buffers."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.device = dev = engine.device
        cfg = engine.cfg
        self.n_layer, self.kvd = cfg.n_layer, cfg.kv_dim
        self.kernel = engine.kernels.get("kvview", WG=WG, **kv_consts(engine.kv_type))
        self._max_dim = dev.info.limits["max_compute_workgroups_per_dimension"]
        conv = gpu.CONVERSATION      # norms of the cache are conversation data: Forget wipes and checks them too
        with dev.owning(self):
            self.out = dev.buffer(4 * COLS * self.n_layer * 2, conv, f"kvview.norms [{COLS}, n_layer, 2]")
            self.span = dev.uniform(bytes(_SPAN.size), "kvview.span (a, n)", kind=conv)
            self.bound = []
            for il, (k, v) in zip(engine.kv_layers, engine.kv_buffers):
                params = dev.uniform(_LAYER.pack(il, self.n_layer, self.kvd, 0), f"kvview.layer {il}")
                self.bound.append(dev.bind(self.kernel, [k, v, self.out, self.span, params], f"kvview layer {il}"))

    def close(self) -> None:
        self.device.free(self)
        self.bound = []

    async def norms(self, a: int, b: int) -> bytes:
        """f32 [b - a, n_layer, 2]: |K| and |V| of every layer at positions a .. b-1, COLS positions per pass."""
        if not 0 <= a <= b <= self.engine.n_ctx:
            raise ValueError(f"positions {a}..{b} are outside the cache of {self.engine.n_ctx}")
        parts = []
        for lo in range(a, b, COLS):
            n = min(COLS, b - lo)
            groups = ops.groups_1d(2 * n, WG, self._max_dim)
            self.device.run([gpu.Dispatch(self.kernel, bd, groups) for bd in self.bound],
                            [(self.span, 0, _SPAN.pack(lo, n, 0, 0))])
            parts.append(await self.device.read(self.out, 0, 4 * n * self.n_layer * 2))
        return b"".join(parts)

    async def columns(self, a: int, b: int) -> dict:
        """The panel's message body for positions a .. b-1, with the milliseconds the pass and read took."""
        t0 = time.perf_counter()
        raw = await self.norms(a, b)
        return {"start": a, "end": b, "n_layer": self.n_layer, "norms": raw,
                "ms": round((time.perf_counter() - t0) * 1e3, 2)}


def cache_values(raw: bytes, value_bytes: int) -> list[float]:
    """The values of a cache's bytes: f32 (value_bytes 4) or f16 (2), little-endian (pure Python: it runs in
    Pyodide, whose array module has no f16 type; struct's "e" reads IEEE half)."""
    if value_bytes == 4:
        return array("f", raw).tolist()
    return list(struct.unpack(f"<{len(raw) // 2}e", raw))


def row_norms(raw: bytes, kvd: int, rows: int, value_bytes: int = 4) -> dict[int, float]:
    """{row: L2 norm} of the rows among the first `rows` of a cache's bytes (values of `value_bytes`: 4 f32, 2 f16)
    that hold a non-zero word, computed from the bytes alone (pure Python: it runs in Pyodide). Rows are skipped at C
    speed by `nonzero_words`; only the non-zero ones are summed."""
    width = value_bytes * kvd
    lit = {}
    for r in range(min(rows, len(raw) // width)):
        row = raw[r * width:(r + 1) * width]
        if nonzero_words(row):
            lit[r] = math.sqrt(math.fsum(x * x for x in cache_values(row, value_bytes)))
    return lit


class AfterPicture:
    """Collects, from Forget's read-back after the wipe, the norm of every K and V row still non-zero.

    Pass it as `wipe(device, on_after=picture)`. A buffer whose read-back holds no non-zero word has every row at
    zero, so only a buffer that failed to clear is scanned row by row (the whole cache: a stray row anywhere shows)."""

    def __init__(self, engine) -> None:
        self.n_layer, self.kvd, self.n_ctx = engine.cfg.n_layer, engine.cfg.kv_dim, engine.n_ctx
        self.value_bytes = engine.kv_value_bytes
        self._where = {}                      # id(buffer) -> (layer, 0 for K or 1 for V)
        for il, (k, v) in zip(engine.kv_layers, engine.kv_buffers):
            self._where[id(k)], self._where[id(v)] = (il, 0), (il, 1)
        self.lit: dict[tuple[int, int], dict[int, float]] = {}   # (layer, w) -> {row: norm}
        self.labels: dict[tuple[int, int], str] = {}
        self.checked = 0                      # KV buffers seen in the read-back
        self.before = self.after = 0          # non-zero words of the KV buffers, before and after the wipe

    def __call__(self, buf: gpu.Buffer, raw: bytes, before: int, after: int) -> None:
        where = self._where.get(id(buf))
        if where is None:
            return
        self.checked += 1
        self.before += before
        self.after += after
        if after:
            self.lit[where] = row_norms(raw, self.kvd, self.n_ctx, self.value_bytes)
            self.labels[where] = buf.label

    def picture(self, rows: int) -> dict:
        """The panel's message body: positions 0 .. width-1, width = max(rows, the last lit row + 1)."""
        width = max([rows] + [r + 1 for cells in self.lit.values() for r in cells])
        norms = array("f", bytes(4 * width * self.n_layer * 2))
        for (il, w), cells in self.lit.items():
            for r, x in cells.items():
                norms[(r * self.n_layer + il) * 2 + w] = x
        return {"start": 0, "end": width, "n_layer": self.n_layer, "norms": norms.tobytes(),
                "checked": self.checked, "before": self.before, "after": self.after,
                "lit_cells": sum(len(c) for c in self.lit.values()),
                "lit": sorted(self.labels.values())}
