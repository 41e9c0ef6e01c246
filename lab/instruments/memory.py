"""The memory card's data: what a model keeps between tokens, layer by layer, read from the GPU.

A layer keeps one of three things (`kinds`):
- attention: its K and V rows, one per position, growing with the conversation (the KV picture is
  lab/instruments/kvview.py's);
- conv (lfm2's short-conv blocks, and the causal conv in front of qwen35's delta-net): the inputs of its last
  l_cache - 1 positions, which the next token's conv reads;
- delta (qwen35's gated delta-net): besides its conv inputs, a d_k x d_v matrix per value head, rewritten at every
  token, the same size whatever the length.
Besides the model's own states the engine keeps snapshots of them (qwen35: lab/engine/scratch.py SNAPSHOTS copies of
every recurrent state and whole conv ring), so a turn can resume where a greedy block ended; they are conversation
data like the states, and the card counts them and shows Forget clearing them.

- `describe(engine)`: each layer's kind and the bytes each kind keeps, with the factors of the product, for the page
  to write the arithmetic out (sent once, with the load).
- `MemoryView(engine)`: `conv_rows(pos)` reads the conv rows a token at `pos` reads from each layer's ring
  (lab/engine/scratch.py: row q % conv_ring holds position q); `delta_norms()` computes every delta-net head's
  Frobenius norm on the GPU (wgsl/statenorm.wgsl: one dispatch per layer in one pass) and reads n_delta x H floats,
  never the states; `delta_head(layer, head)` reads one head's matrix.
- `reuse_note(...)`: what a hybrid's turn reused besides the K/V rows, for the chat's reuse line.
- `StateAfter`: the same pictures computed in Python from the bytes Forget read back after its wipe
  (lab/instruments/forget.py `wipe(on_after=...)`), sharing nothing with the kernel: a wrong kernel cannot make a
  dirty state look clean.

What it does not know: tokens or text, sessions (the caller says at which position the conversation stands and what a
turn reused), the wipe itself (lab/instruments/forget.py), the KV picture (lab/instruments/kvview.py).
"""

from __future__ import annotations

import math
import struct
import time
from array import array

from lab import gpu
from lab.engine.scratch import conv_ring
from lab.gpu.shaders import subgroup_consts
from lab.instruments.kvview import row_norms

ATTENTION, CONV, DELTA = "attention", "conv", "delta"
WG = 64
_PARAMS = struct.Struct("<4I")       # struct Params { slot, H, n, _ } in wgsl/statenorm.wgsl


def kinds(engine) -> list[str]:
    """Per layer what it keeps: ATTENTION (a KV cache), CONV (a conv state) or DELTA (a conv and a recurrent state)."""
    cfg = engine.cfg
    return [DELTA if cfg.is_delta(il) else CONV if cfg.is_conv(il) else ATTENTION for il in range(cfg.n_layer)]


def recurrent_buffers(engine) -> dict[int, gpu.Buffer]:
    """{layer: recurrent state} of the delta-net layers (f32 [H, d_k, d_v]); none in a model without them."""
    return engine.recurrent_buffers if engine.cfg.delta_layers else {}


def describe(engine) -> dict:
    """Each layer's kind and, per kind, the bytes it keeps and the factors that multiply to them (the states' values
    f32; the KV cache's the engine's kv_type, f32 or f16)."""
    cfg, f32, kvb = engine.cfg, 4, engine.kv_value_bytes
    out = {"layers": kinds(engine), "bytes_per_value": f32,
           "kv": {"layers": list(engine.kv_layers), "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
                  "bytes_per_value": kvb, "kv_type": engine.kv_type,
                  "bytes_per_token": cfg.kv_bytes_per_token(kvb), "n_ctx": engine.n_ctx},
           "conv": None, "delta": None, "snapshots": None}
    if cfg.conv_layers:
        out["conv"] = {"layers": list(cfg.conv_layers), "rows": cfg.l_cache - 1, "channels": cfg.conv_channels,
                       "ring": conv_ring(cfg), "bytes": cfg.conv_state_bytes(f32)}
    if cfg.delta_layers:
        out["delta"] = {"layers": list(cfg.delta_layers), "heads": cfg.ssm_v_heads, "d_k": cfg.ssm_head_dim,
                        "d_v": cfg.ssm_head_dim, "bytes": cfg.delta_state_bytes(f32)}
        snaps = engine.scratch.snapshots
        # each a copy of every recurrent state and every whole conv ring (not only its l_cache - 1 rows)
        out["snapshots"] = {"count": len(snaps), "bytes": snaps[0].size,
                            "ring_bytes": sum(b.size for b in engine.state_buffers.values())}
    return out


def reuse_note(cfg, reused: int, cached: int, live: int) -> str:
    """What a turn of a model with conv or recurrent states reused besides the K/V rows ('' for any other model), for
    the chat's reuse line. `reused`: the prompt tokens not run again (Result.reused, Engine.resume_point's choice);
    `cached`: those the session held at their positions, at most the prompt's length - 1 (one must run); `live`: the
    position the live states stood at before the turn (Engine.held[1]). A KV cache is cut to `cached`; the states are
    either the live ones (stepped back within the conv rings), a snapshot (qwen35), or nothing (position 0)."""
    if not cfg.recurrent:
        return ""
    kinds = " and ".join(k for k, has in (("conv", cfg.conv_layers), ("delta-net", cfg.delta_layers)) if has)
    if not reused:
        if not cached:
            return "nothing of this text was run before: the whole prompt ran from position 0"
        return (f"the {kinds} states cannot be cut back to position {cached} like the KV cache, and no copy of them "
                f"stands at or before it, so the whole prompt ran from position 0")
    if reused == live:
        what = f"the {kinds} states as the last turn left them"
    elif cfg.delta_layers:
        what = f"the {kinds} states from the snapshot the engine kept after position {reused - 1}"
    else:
        what = f"the {kinds} states, stepped back within their rings to position {reused}"
    span = f"position {reused}" if cached - reused == 1 else f"positions {reused}..{cached - 1}"
    again = f"; {span}, which the KV cache held, ran again: a recurrent state cannot be stepped back" if reused < cached \
        else ""
    return f"the K/V rows of those tokens, and {what}{again}"



def conv_span(engine, pos: int) -> tuple[int, int]:
    """Positions [a, pos) whose conv inputs a token at `pos` reads: the last l_cache - 1 (fewer near the start)."""
    return max(0, pos - (engine.cfg.l_cache - 1)), pos


def ring_rows(raw: bytes, ring: int, a: int, b: int) -> bytes:
    """The rows of positions a .. b-1 out of a conv ring's bytes (row q % ring holds position q), in position order."""
    width = len(raw) // ring
    return b"".join(raw[(q % ring) * width:(q % ring + 1) * width] for q in range(a, b))


def head_norms(raw: bytes, heads: int) -> list[float]:
    """The Frobenius norm of each head's matrix in a recurrent state's bytes (f32 [heads, d_k, d_v]), in Python (it
    runs in Pyodide): only for a state Forget found non-zero."""
    values = array("f", raw)
    n = len(values) // heads
    return [math.sqrt(math.fsum(x * x for x in values[h * n:(h + 1) * n])) for h in range(heads)]


class StateNorms:
    """The norms pass over some recurrent states (each f32 [heads, n] as heads x d_k x d_v): one dispatch a state in
    one pass, into an [len(states), heads] buffer of its own; `close` frees it."""

    def __init__(self, device: gpu.Device, kernels, states: dict[int, gpu.Buffer], heads: int, n: int) -> None:
        self.device = device
        kernel = kernels.get("statenorm", WG=WG, **subgroup_consts(device))
        self.dispatches = []
        with device.owning(self):
            # norms of the states are conversation data: Forget wipes and checks them too
            self.out = device.buffer(4 * len(states) * heads, gpu.CONVERSATION, "memory.state norms [n_delta, H]")
            for slot, (il, buf) in enumerate(states.items()):
                params = device.uniform(_PARAMS.pack(slot, heads, n, 0), f"statenorm layer {il}")
                bound = device.bind(kernel, [buf, self.out, params], f"statenorm layer {il}")
                self.dispatches.append(gpu.Dispatch(kernel, bound, (heads, 1, 1)))

    def close(self) -> None:
        self.device.free(self)
        self.dispatches = []

    async def norms(self) -> bytes:
        """f32 [len(states), heads], computed on the GPU now."""
        self.device.run(self.dispatches)
        return await self.device.read(self.out)


class MemoryView:
    """The conv-row reads and the state-norms pass of one engine; built once, `close` frees its buffers."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.device = engine.device
        cfg = engine.cfg
        self.ring = conv_ring(cfg) if cfg.conv_layers else 0
        self.conv = engine.state_buffers               # {layer: [ring, channels] f32}
        self.recurrent = recurrent_buffers(engine)     # {layer: [H, d_k, d_v] f32}
        self.heads, self.dk = cfg.ssm_v_heads, cfg.ssm_head_dim
        self.pass_ = (StateNorms(self.device, engine.kernels, self.recurrent, self.heads, self.dk * self.dk)
                      if self.recurrent else None)

    def close(self) -> None:
        if self.pass_ is not None:
            self.pass_.close()

    async def conv_rows(self, pos: int) -> dict | None:
        """The conv inputs a token at `pos` reads, every conv layer: {start, end, values: f32 [n_conv, end - start,
        channels]}; None when there are none to read (position 0, no conv layer) or the rings no longer hold them
        (another run overwrote them: the page says so rather than show rows of another text)."""
        a, b = conv_span(self.engine, pos)
        lo, hi = self.engine.held          # the positions the live rings hold (greedy steps may have run past pos)
        if not self.conv or a == b or not lo <= a < b <= hi:
            return None
        parts = [ring_rows(await self.device.read(buf), self.ring, a, b) for buf in self.conv.values()]
        return {"start": a, "end": b, "layers": list(self.conv), "values": b"".join(parts)}

    async def delta_norms(self) -> bytes:
        """f32 [n_delta, H]: the Frobenius norm of every delta-net head's state, computed on the GPU."""
        return await self.pass_.norms()

    async def delta_head(self, layer: int, head: int) -> bytes:
        """f32 [d_k, d_v]: one head's recurrent state as the GPU holds it."""
        if layer not in self.recurrent or not 0 <= head < self.heads:
            raise ValueError(f"no delta-net state at layer {layer}, head {head} (delta-net layers "
                             f"{list(self.recurrent)}, {self.heads} heads)")
        size = 4 * self.dk * self.dk
        return await self.device.read(self.recurrent[layer], head * size, size)

    async def view(self, pos: int) -> dict:
        """The card's message body at `pos` (the session's cached length): the conv rows and the state norms, with
        the milliseconds the reads took. `state_pos`: the positions the states have taken in (greedy steps may run
        ahead of the session's `pos`)."""
        t0 = time.perf_counter()
        body = {"pos": pos, "state_pos": self.engine.held[1], "conv": await self.conv_rows(pos),
                "delta": await self.delta_norms() if self.pass_ is not None else None,
                # the position each snapshot holds the states after (None: empty), Engine.snaps
                "snaps": [None if h is None else h[1] for h in self.engine.snaps] if self.pass_ is not None else None}
        body["ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        return body


class StateAfter:
    """Collects, from Forget's read-back after the wipe, the conv and recurrent states and their snapshots as the GPU
    then holds them.

    Pass it as (part of) `wipe(device, on_after=...)`. `span`: the conv positions the card showed, whose rows it
    redraws from the read-back; any other row of a ring still non-zero is counted too. `pick`: the (layer, head)
    whose matrix the card showed, redrawn from the read-back."""

    def __init__(self, engine, span: tuple[int, int], pick: tuple[int, int] | None) -> None:
        self.ring, self.span, self.pick = (conv_ring(engine.cfg) if engine.cfg.conv_layers else 0), span, pick
        self.heads, self.dk = engine.cfg.ssm_v_heads, engine.cfg.ssm_head_dim
        self._conv = {id(b): il for il, b in engine.state_buffers.items()}
        self._delta = {id(b): il for il, b in recurrent_buffers(engine).items()}
        self._snap = {id(b): slot for slot, b in enumerate(engine.scratch.snapshots)} if engine.cfg.delta_layers else {}
        self.snaps: dict[int, int] = {}           # snapshot slot -> non-zero words it holds, as read back
        self.conv: dict[int, bytes] = {}          # layer -> f32 [span, channels] as read back
        self.conv_lit: dict[int, int] = {}        # layer -> rows of its whole ring still non-zero
        self.norms: dict[int, list[float]] = {}   # layer -> each head's norm, as read back
        self.head: bytes | None = None            # the picked head's matrix, as read back
        self.labels: list[str] = []               # the state buffers still holding data
        self.checked = self.before = self.after = 0

    def __call__(self, buf: gpu.Buffer, raw: bytes, before: int, after: int) -> None:
        il = self._conv.get(id(buf), self._delta.get(id(buf), self._snap.get(id(buf))))
        if il is None:
            return
        self.checked += 1
        self.before += before
        self.after += after
        if after:
            self.labels.append(buf.label)
        if id(buf) in self._snap:
            self.snaps[il] = after
            return
        if id(buf) in self._conv:
            self.conv[il] = ring_rows(raw, self.ring, *self.span)
            self.conv_lit[il] = len(row_norms(raw, len(raw) // (4 * self.ring), self.ring)) if after else 0
            return
        self.norms[il] = head_norms(raw, self.heads) if after else [0.0] * self.heads
        if self.pick is not None and self.pick[0] == il:
            size = 4 * self.dk * self.dk
            self.head = raw[self.pick[1] * size:(self.pick[1] + 1) * size]

    def picture(self) -> dict:
        """The card's message body: the conv rows and the delta norms and head, all as read back, and the counts."""
        conv = None
        if self.conv:
            layers = sorted(self.conv)
            conv = {"start": self.span[0], "end": self.span[1], "layers": layers,
                    "values": b"".join(self.conv[il] for il in layers), "lit_rows": [self.conv_lit[il] for il in layers]}
        delta = None
        if self.norms:
            layers = sorted(self.norms)
            delta = {"layers": layers, "norms": array("f", [x for il in layers for x in self.norms[il]]).tobytes(),
                     "head": None if self.head is None else {"layer": self.pick[0], "head": self.pick[1],
                                                             "values": self.head}}
        snaps = [self.snaps[slot] for slot in sorted(self.snaps)] if self.snaps else None
        return {"checked": self.checked, "before": self.before, "after": self.after, "lit": sorted(self.labels),
                "conv": conv, "delta": delta, "snaps": snaps}
