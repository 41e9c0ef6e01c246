"""Probes: what the lab's panels show, computed on the GPU only when a panel asks for it.

- `embedding(token_id)`: the token's embedding row (the table's own get_rows, dequantized on the GPU), its L2 norm,
  and its nearest neighbours by cosine over the whole quantized table: a matvec of the table with the row gives
  every dot product; row norms come from one kernel run once per model (wgsl/row_norms.wgsl; at every query where
  training moves the weights, a model made or fully fine-tuned in the tab, whose norms are then its kind too,
  CONVERSATION); the cosine kernel
  divides, and the sampler's top_k picks the best. A model with per-layer embeddings (gemma4) also gets the token's
  row of `per_layer_token_embd` by the same get_rows (from whichever part of the split table holds it), with each
  layer slice's L2 norm; no neighbours over that table: it is n_layer x width wide (5.8x the main table for E2B),
  so a query would read that much more for a cosine over a row no layer reads whole.
- `inspect(ids, cached, start, end)`: runs positions start .. end-1 of the conversation again through a probe
  variant of the engine's own plans and keeps what the panels need: attention probabilities with queries and keys
  in that window (every layer and head, plus each query's mass on keys before the window), the residual norm after
  every layer at each of those positions, and the logit lens (each layer's residual through the final norm and the
  output head; the top tokens at the last `lens` positions).
- `rope_inputs(ids, cached, pos, layer)`: a layer's queries at `pos` and keys at 0 .. pos, every head, as its rope op
  reads them (after the bias and the q/k norms, before the rotation), with the engine's own attention probabilities
  of that query, for the page's RoPE demo to rotate both ways (web/rope.js). Positions 0 .. pos run through the
  engine's prefill plan (decode's may rotate inside its QKV projection) cut right before that layer's rope op; the
  fused QKV rows are read there; the chunk holding `pos` then runs on through the rope, the KV write and the probe
  variant of that layer's attention.

Layers without attention (lfm2's short-conv blocks, qwen35's delta-net layers; `engine.kv_layers` lists the others)
have no attention to probe: their slots of the attention output stay 0, and `rope_inputs` refuses them. The residual
and the lens read every layer (`l_out-L` is traced for every kind).

Decode pays nothing: the probe variants are separate op lists, built the first time a panel asks, and run only
between turns; the decode plan is never touched.

The chat is not disturbed either. Earlier positions are not recomputed: their K/V sit in the cache, which is all
attention needs. Positions the cache already holds run without the kv_write ops, so the probe sees the K/V the chat
used and leaves them as they were; only positions past the session's cache are written (the last generated token,
never fed back), where the session's next turn writes anyway.
A hybrid's conv and recurrent states are another matter: a layer's state at a position is everything before it folded
together, so it cannot be read at an earlier position, nor stepped back. For a model with them the pass runs from
position 0 (every layer recomputed; attention still reads the chat's K/V for the positions the cache holds), with the
states copied aside before it and back after it (GPU copies, as lab/instruments/experiments.py `kept` does), so the
next turn finds them as the chat left them.

Cost: the pass costs what a prefill of the window costs (positions before it are not recomputed; a request for the
lens alone runs only its own positions and those the cache lacks); the lens adds one output-head projection per
layer over the lens rows (30 x 28 M multiply-adds per row for SmolLM2, 24 x 136 M for Qwen2.5 0.5B, 18 x 168 M for
Gemma 3 270M), the dominant term on a CPU device, hence the number of lens positions is a parameter. The work each
request did comes back with its timings (`neighbours_work`, `lens_work`), for the page to show. Measured numbers:
docs/panels.md.

What it does not know: text, the page, sessions (the caller says how many leading ids the cache holds).
"""

from __future__ import annotations

import itertools
import math
import struct
import time
from dataclasses import dataclass
from typing import NamedTuple

from lab import gpu, ops
from lab.instruments.memory import recurrent_buffers
from lab.ops import attention as attn_ops
from lab.ops import embed, matmul, norm, sample, softmax
from lab.ops.rows import Rows
from lab.ops.weights import dequant_consts

NEIGHBOURS = 10        # nearest tokens listed by the embedding inspector
WINDOW = 48            # most positions one inspection covers (attention heatmap rows and columns)
LENS_POSITIONS = 16    # most logit-lens positions one inspection covers
LENS_K = 5             # logit lens: candidates per cell (top-1 shown, the rest on hover)
CHUNK = 64             # most tokens per step of a probe pass: the attention probe holds [CHUNK, n_head, n_ctx]
                       # floats (an engine with 512-token prefill steps would need 268 MB of it for an 8B at 4,096)
WG = 64
_WINDOW = struct.Struct("<4I")   # struct Window { w0, wn, l0, ln } in wgsl/probes.wgsl
_PARAMS = struct.Struct("<4I")


@dataclass
class Embedding:
    id: int
    values: bytes                          # f32 [n_embd]: the dequantized embedding row (unscaled)
    norm: float                            # its L2 norm, from the per-model row norms
    neighbours: list[tuple[int, float]]    # (token id, cosine), best first, the token itself left out
    ms: float                              # GPU work and read-back
    macs: int = 0                          # multiply-adds and weight bytes read: neighbours_work
    weight_bytes: int = 0
    per_layer: bytes | None = None         # gemma4: f32 [n_layer, width], the token's row of per_layer_token_embd as
                                           #   stored (before x sqrt(width) and the mix with the projection); else None
    per_layer_norms: list[float] | None = None     # each layer slice's L2 norm
    per_layer_table_bytes: int = 0         # what a neighbours query over that table would read (not run)


@dataclass
class Inspection:
    start: int                      # window: positions start .. end-1, as queries and as keys
    end: int
    lens_start: int                 # logit lens positions lens_start .. end-1
    attention: bytes | None         # f32 [n_layer, n_head, w, w + 1], w = end - start; [il, h, q, 0]: mass on keys
                                    #   before the window; [il, h, q, 1 + k]: key start + k (0 past q)
    residual: bytes | None          # f32 [n_layer + 1, w]: row 0 the embeddings (inp_embd, or gemma3's
                                    #   inp_scaled), row il+1 after layer il
    lens: list | None               # [n_layer][end - lens_start] -> [(id, p), ...] LENS_K best, p = softmax prob
    ms: dict                        # wall-clock milliseconds: "pass", "lens" (each up to its first read), "total"
    lens_macs: int = 0              # the lens's multiply-adds and weight bytes read: lens_work
    lens_bytes: int = 0

    @property
    def width(self) -> int:
        return self.end - self.start


@dataclass
class RopeInputs:
    """What the RoPE demo needs to redo one layer's attention scores for one query, and the engine's own answer."""
    pos: int                # the query position; keys are positions 0 .. pos
    layer: int
    n_head: int
    n_head_kv: int          # K head of query head h: h // (n_head / n_head_kv) (GQA)
    q: bytes                # f32 [n_head, head_dim]: the query at pos before RoPE, every head
    k: bytes                # f32 [pos + 1, n_head_kv, head_dim]: the keys at 0 .. pos before RoPE
    probs: bytes            # f32 [n_head, pos + 1]: the engine's attention probabilities of that query
    head_dim: int
    n_rot: int              # rotated dims of each head (the rest pass through)
    freq_base: float        # the layer's RoPE base (gemma3's sliding layers: 10000)
    freq_scale: float       # position multiplier (1 / linear scaling factor)
    factors: list | None    # llama 3's rope_freqs: pair i turns by theta_i / factors[i]; None: no factors
    neox: bool              # pairs (i, i + n_rot/2); else adjacent (2i, 2i + 1)
    scale: float            # score = scale * q.k (then soft-capped when softcap > 0)
    window: int             # keys visible to the query: pos - key < window (0: all)
    softcap: float
    ms: float


@dataclass(frozen=True)
class Variant:
    """Which probe variant of the engine's plan a chunk of the pass runs (the variants are cached by it)."""
    batched: bool       # the prefill plan (else decode's, with its split attention)
    write_kv: bool      # keep the ops' KV writes (positions past the session's cache) or leave the cache as it is
    attention: bool     # each layer's attention through its probe twin, gathered into the window
    lens: bool          # each layer's residual copied for the logit lens
    residual: bool      # the residual's norm after the embedding and after every layer


class Sites(NamedTuple):
    """Where the probe ops go in one of the engine's plans (op indices), with the probe twins of its attention."""
    embd: int                                   # the op leaving the residual that enters layer 0
    attention: dict[int, tuple[int, bool]]      # each ATTENTION op -> (its layer, whether it is the layer's last)
    l_out: dict[int, int]                       # the op leaving a layer's output -> that layer
    probed: dict[int, list[ops.Op]]             # per attention layer: its attention with the probe buffer bound


def neighbours_work(table) -> tuple[int, int]:
    """(multiply-adds, weight bytes read) of one neighbours query: the matvec reads the whole quantized table once,
    n_vocab x n_embd multiply-adds (the row norms, made on the first query only, cost about as much again)."""
    return table.rows * table.cols, table.rows * table.row_bytes


def lens_work(n_layer: int, head, rows: int) -> tuple[int, int]:
    """(multiply-adds, weight bytes read) of the lens over `rows` positions: one head projection per layer,
    n_layer x rows x n_vocab x n_embd multiply-adds, the head read once per layer whatever `rows` is. (The matmul
    computes whole tiles of matmul.MATMUL_TT rows; the useful work is counted.)"""
    return n_layer * rows * head.rows * head.cols, n_layer * head.rows * head.row_bytes


def _pairs(raw: bytes, offset: int, count: int) -> list[tuple[int, float]]:
    out = [sample.PAIR.unpack_from(raw, offset + 8 * i) for i in range(count)]
    return [(i, v) for i, v in out if i != sample.NONE]


class Probes:
    """Probe plans for one engine, built lazily (the embedding plan on the first `embedding`, the pass on the
    first `inspect`); `close` frees every buffer they made."""

    def __init__(self, engine, window: int = WINDOW, lens_positions: int = LENS_POSITIONS) -> None:
        self.chunk = min(engine.max_batch, CHUNK)
        if not 1 <= lens_positions <= self.chunk:
            raise ValueError(f"lens positions {lens_positions} must be 1 .. {self.chunk}")
        self.engine = engine
        self.device = engine.device
        self.window = window
        self.lens_positions = lens_positions
        self._emb = None
        self._pass = None
        self._variants: dict[Variant, list[ops.Op]] = {}
        self._rope_cuts: dict[tuple, tuple[list[ops.Op], list[ops.Op]]] = {}

    def close(self) -> None:
        self.device.free(self)
        self._emb = self._pass = None
        self._variants.clear()
        self._rope_cuts.clear()

    @property
    def buffers(self) -> list[gpu.Buffer]:
        return self.device.owned_by(self)

    # -- embedding inspector -----------------------------------------------------------------------------
    def _build_embedding(self) -> None:
        with self.device.owning(self):
            self._emb = self._embedding_ops()

    def _embedding_ops(self) -> list[ops.Op]:
        eng, dev, kc, cfg = self.engine, self.device, self.engine.kernels, self.engine.cfg
        table = eng.weights.embedding
        step = eng.scratch.step
        V, E, conv = cfg.n_vocab, cfg.n_embd, gpu.CONVERSATION
        self.q_id = dev.buffer(4, conv, "probe.query id [1] u32")
        self.q_row = dev.buffer(4 * E, conv, "probe.query row [n_embd]")
        self.sims = dev.buffer(4 * V, conv, "probe.cosine [n_vocab]")
        self.nb = dev.buffer(8 * NEIGHBOURS, conv, "probe.neighbours [k] (u32, f32)")
        # Derived from the weights alone: the weights' kind. A file's (WEIGHTS): not wiped by Forget, made once per
        # model. Weights that training moves (a model made or fully fine-tuned here: CONVERSATION, the user's data):
        # wiped with them, and made again at every query, since each step changes them (`_norm_ops`).
        self.norms = dev.buffer(4 * V, eng.weights.kind, "probe.embedding row norms [n_vocab]")
        max_dim = dev.info.limits["max_compute_workgroups_per_dimension"]
        k = kc.get("row_norms", WG=WG, DQ=dequant_consts(table.type)["DQ"])
        norm_ops = []
        for part in table.parts:
            params = dev.uniform(_PARAMS.pack(part.first_row, part.n_rows, table.cols // 8, table.row_bytes),
                                 f"{part.buffer.label}.row_norms")
            bound = dev.bind(k, [part.buffer, self.norms, params], f"{part.buffer.label}.row_norms")
            norm_ops.append(gpu.Dispatch(k, bound, ops.groups_1d(part.n_rows, WG, max_dim)))
        dev.run(norm_ops)
        self._norm_ops = norm_ops if eng.weights.kind == gpu.CONVERSATION else []
        kcos = kc.get("probes", "cosine", WG=WG)
        params = dev.uniform(_PARAMS.pack(V, 0xFF800000, 0, 0), "probe.cosine.params")   # V, -inf as bits
        cos = ops.Op(kcos, dev.bind(kcos, [self.sims, self.norms, self.q_id, params], "probe.cosine"),
                     lambda t, g=ops.groups_1d(V, WG, max_dim): g)
        per_layer = []
        if cfg.n_embd_per_layer:
            self.q_per_layer = dev.buffer(4 * cfg.n_layer * cfg.n_embd_per_layer, conv,
                                          "probe.query per-layer row [n_layer x per-layer width]")
            per_layer = embed.get_rows(dev, kc, eng.weights.per_layer_embedding, self.q_id, self.q_per_layer, step)
        return (embed.get_rows(dev, kc, table, self.q_id, self.q_row, step)
                + per_layer
                + matmul.matvec(dev, kc, table, self.q_row, self.sims)
                + [cos]
                + sample.top_k(dev, kc, self.sims, self.nb, step, V, NEIGHBOURS, rows=Rows.fixed(1)))

    async def embedding(self, token_id: int) -> Embedding:
        eng, dev = self.engine, self.device
        eng.check_ids([token_id], ValueError)
        if self._emb is None:
            self._build_embedding()
            await dev.flush_errors()         # the browser reports shader problems late: name them now
        t0 = time.perf_counter()
        if self._norm_ops:                   # weights that training moves: their norms as they are now
            dev.run(self._norm_ops)
        dev.run(ops.dispatches(self._emb, 1),
                eng.step_writes(None, 0, 1) + [(self.q_id, 0, struct.pack("<I", token_id))])
        values = await dev.read(self.q_row)
        nb = _pairs(await dev.read(self.nb), 0, NEIGHBOURS)
        (norm_,) = struct.unpack("<f", await dev.read(self.norms, 4 * token_id, 4))
        per_layer, norms, table_bytes = None, None, 0
        cfg = eng.cfg
        if cfg.n_embd_per_layer:
            n, P = cfg.n_layer * cfg.n_embd_per_layer, cfg.n_embd_per_layer
            per_layer = (await dev.read(self.q_per_layer))[:4 * n]
            row = struct.unpack(f"<{n}f", per_layer)
            # n_layer x width floats: a few thousand for E2B, summed here in double rather than by another kernel
            norms = [math.sqrt(math.fsum(v * v for v in row[il * P:(il + 1) * P])) for il in range(cfg.n_layer)]
            table_bytes = neighbours_work(eng.weights.per_layer_embedding)[1]
        return Embedding(token_id, values[:4 * cfg.n_embd], norm_, nb, (time.perf_counter() - t0) * 1e3,
                         *neighbours_work(eng.weights.embedding), per_layer, norms, table_bytes)

    # -- the inspection pass ------------------------------------------------------------------------------
    def _build_pass(self) -> None:
        with self.device.owning(self):
            self._build_pass_owned()
        self._pass = True

    def _build_pass_owned(self) -> None:
        eng, dev, kc, cfg = self.engine, self.device, self.engine.kernels, self.engine.cfg
        step, x = eng.scratch.step, eng.scratch.x
        L, H, E, V, B, P = cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_vocab, self.chunk, self.lens_positions
        conv = gpu.CONVERSATION
        max_dim = dev.info.limits["max_compute_workgroups_per_dimension"]
        cols = self.window + 1
        # uniforms rewritten per request with positions: conversation data
        self.win = dev.uniform(bytes(_WINDOW.size), "probe.window {w0, wn, l0, ln}", kind=conv)
        self.lens_step = ops.make_step(dev, "probe.lens step")
        self.attn_probe = dev.buffer(attn_ops.probe_bytes(B, H, eng.n_ctx), conv, "probe.attention [B, n_head, n_ctx]")
        self.attn = dev.buffer(4 * L * H * self.window * cols, conv, "probe.attention window [n_layer, n_head, w, w+1]")
        self.resid = dev.buffer(4 * (L + 1) * self.window, conv, "probe.residual norms [n_layer + 1, w]")
        self.lens_x = dev.buffer(4 * L * P * E, conv, "probe.lens residuals [n_layer, P, n_embd]")
        self.lens_xn = dev.buffer(4 * L * P * E, conv, "probe.lens normed [n_layer, P, n_embd]")
        self.lens_logits = dev.buffer(4 * P * V, conv, "probe.lens logits [P, n_vocab]")
        align = max(256, dev.info.limits["min_storage_buffer_offset_alignment"])
        self.lens_stride = -(-8 * P * LENS_K // align) * align     # bytes per layer: top_k binds a slice each
        self.lens_top = dev.buffer(L * self.lens_stride, conv, "probe.lens top-k [n_layer, P, k] (u32, f32)")

        def small(entry: str, resources: list, params: tuple, n_threads, label: str) -> ops.Op:
            k = kc.get("probes", entry, WG=WG)
            u = dev.uniform(_PARAMS.pack(*params), f"{label}.params")
            return ops.Op(k, dev.bind(k, resources + [step, self.win, u], label),
                          lambda t: ops.groups_1d(max(1, n_threads(t)), WG, max_dim))

        self._gather = {il: small("attn_gather", [self.attn_probe, self.attn], (H, eng.n_ctx, il, cols),
                                  lambda t: t * H * cols, f"probe.attn_gather {il}") for il in eng.kv_layers}
        self._copy = [small("lens_copy", [x, self.lens_x], (E, il, P, 0), lambda t: t * E, f"probe.lens_copy {il}")
                      for il in range(L)]
        self._norm = [small("row_norm", [x, self.resid], (E, slot, 0, 0), lambda t: t, f"probe.row_norm {slot}")
                      for slot in range(L + 1)]
        # The lens: per layer, the kept rows through the final norm, the head, softmax, top-k into the layer's slice
        # of lens_top. The head is one matmul, so its weights are read once per layer, not once per row; but the
        # matmul computes a whole tile of matmul.MATMUL_TT rows, so one row goes through the decode path's matvec
        # instead (the same single read, 1/MATMUL_TT of the arithmetic). Measured with the earlier 16-token tiles,
        # 30 layers: lavapipe 22 s for any count up to 16 (one tile), a matvec 2.2 s per position; SwiftShader in
        # Chromium: matvecs for 8 positions took minutes.
        self.head = eng.weights.head
        self._lens, self._lens_one = [], []
        for il in range(L):
            off = il * P * E
            normed = norm.rms_norm(dev, kc, self.lens_x, eng.weights.vectors[cfg.output_norm], self.lens_xn,
                                   self.lens_step, E, cfg.eps, in_offset=off, out_offset=off)
            top = (softmax.softmax(dev, kc, self.lens_logits, self.lens_logits, self.lens_step, V)
                   + sample.top_k(dev, kc, self.lens_logits,
                                  gpu.Slice(self.lens_top, il * self.lens_stride, self.lens_stride),
                                  self.lens_step, V, LENS_K, rows=Rows.per_token(P)))
            self._lens += normed + matmul.matmul(dev, kc, self.head, self.lens_xn, self.lens_logits, self.lens_step,
                                                 max_tokens=P, x_offset=off) + top
            self._lens_one += normed + matmul.matvec(dev, kc, self.head, self.lens_xn, self.lens_logits,
                                                     x_offset=off) + top
        # a hybrid's states, copied aside and back around each pass (the module's docstring)
        self._states = [(buf, dev.buffer(buf.size, conv, f"probe.kept {buf.label}"))
                        for buf in list(eng.state_buffers.values()) + list(recurrent_buffers(eng).values())]
        self._sites = {batched: self._find_sites(batched) for batched in (True, False)}
        self._plans = (eng.prefill, eng.decode)     # the plans the sites were found in

    def _follow_plans(self) -> None:
        """The engine builds its plans again when an adapter goes on or off (Engine.set_lora): the sites found in the
        old ones, and the variants cut from them, are found and cut again from the new ones."""
        eng = self.engine
        if self._plans[0] is eng.prefill and self._plans[1] is eng.decode:
            return
        with self.device.owning(self):
            self._sites = {batched: self._find_sites(batched) for batched in (True, False)}
        self._plans = (eng.prefill, eng.decode)
        self._variants.clear()
        self._rope_cuts.clear()

    def _find_sites(self, batched: bool) -> Sites:
        """Where the probe ops go in the engine's plan, found by the trace names the plans record and the ops'
        roles. A layer's attention may be several ops (split-K decode: split, combine); `kqv_out-il` names its last
        one, and the run of ATTENTION ops ending there is what the probe variant replaces."""
        eng, n_layer = self.engine, self.engine.cfg.n_layer
        plan = eng.plan_for(batched)
        attention = {}
        for il in eng.kv_layers:
            last = first = plan.at(f"kqv_out-{il}")
            if plan.ops[last].role != ops.ATTENTION:
                raise RuntimeError(f"probes: op {last} of the engine's plan is {plan.ops[last].kernel.label}, "
                                   f"not the attention its trace names")
            while first > 0 and plan.ops[first - 1].role == ops.ATTENTION:
                first -= 1
            attention.update({i: (il, i == last) for i in range(first, last + 1)})
        # the residual entering layer 0 is llama.cpp's inp_scaled where the model scales the embedding (gemma3)
        return Sites(embd=plan.at("inp_scaled" if eng.cfg.embd_scale != 1.0 else "inp_embd"), attention=attention,
                     l_out={plan.at(f"l_out-{il}"): il for il in range(n_layer)},
                     probed={il: eng.attention_op(il, batched, self.attn_probe) for il in eng.kv_layers})

    def _variant(self, v: Variant) -> list[ops.Op]:
        plan = self._variants.get(v)
        if plan is not None:
            return plan
        base = self.engine.plan_for(v.batched).ops
        sites = self._sites[v.batched]
        end = max(sites.l_out) + 1        # the residual after the last layer; the output head is not needed
        plan = []
        for i, op in enumerate(base[:end]):
            if not v.write_kv and op.role == ops.KV_WRITE:
                if op.without_kv is not None:
                    plan.append(op.without_kv)
                continue
            if v.attention and i in sites.attention:
                il, last = sites.attention[i]
                if last:
                    plan += sites.probed[il] + [self._gather[il]]
                continue
            plan.append(op)
            if v.residual and i == sites.embd:
                plan.append(self._norm[0])
            if i in sites.l_out:
                il = sites.l_out[i]
                if v.residual:
                    plan.append(self._norm[il + 1])
                if v.lens:
                    plan.append(self._copy[il])
        self._variants[v] = plan
        return plan

    def _rope_variant(self, batched: bool, write_kv: bool, layer: int) -> tuple[list[ops.Op], list[ops.Op]]:
        """The engine's plan up to layer `layer`'s attention, split right before its rope op: (the ops that leave
        the un-rotated q, k in the fused QKV rows, the rope + KV write + probed attention of that layer)."""
        key = (batched, write_kv, layer)
        cut = self._rope_cuts.get(key)
        if cut is not None:
            return cut
        plan = self.engine.plan_for(batched)
        at_rope = plan.at(f"Qcur_rope-{layer}")      # the one op that rotates the layer's Q and K heads
        sites = self._sites[batched]
        first_attn = min(i for i, (il, _) in sites.attention.items() if il == layer)
        def keep(part: list[ops.Op]) -> list[ops.Op]:
            if write_kv:
                return part
            return [o for o in (op.without_kv if op.role == ops.KV_WRITE else op for op in part) if o is not None]

        cut = (keep(plan.ops[:at_rope]), keep(plan.ops[at_rope:first_attn]) + sites.probed[layer])
        self._rope_cuts[key] = cut
        return cut

    async def rope_inputs(self, ids: list[int], cached: int, pos: int, layer: int) -> RopeInputs:
        """Layer `layer`: every head's query at `pos` and keys at 0 .. pos before RoPE, and the engine's attention
        probabilities of that query. cached: as for `inspect` (positions the cache lacks are written).

        Cost: a prefill of positions 0 .. pos through layers 0 .. layer (the cache holds rotated keys only, and the
        pre-RoPE ones are recomputed, not derived from them by rotating back: that would assume the pairing the
        demo is there to show)."""
        eng, dev, cfg = self.engine, self.device, self.engine.cfg
        if not 0 <= pos < len(ids) <= eng.n_ctx:
            raise ValueError(f"rope: position {pos} of {len(ids)} (context {eng.n_ctx})")
        if not 0 <= layer < cfg.n_layer:
            raise ValueError(f"rope: layer {layer} of {cfg.n_layer}")
        if layer not in eng.kv_layers:
            raise ValueError(f"rope: layer {layer} of this {cfg.arch} model has no attention (its memory is a "
                             f"{'delta-net' if cfg.is_delta(layer) else 'short-conv'} state, with no query or key "
                             f"to rotate); attention layers: {', '.join(map(str, eng.kv_layers))}")
        if not cfg.rotates(layer):
            raise ValueError(f"rope: layer {layer} of this {cfg.arch} model has no rotary position embedding (NoPE): "
                             f"its q and k are used as projected, so there is no pairing to show; pick another layer")
        eng.check_ids(ids[:pos + 1], ValueError, "rope: ")
        if self._pass is None:
            self._build_pass()
            await dev.flush_errors()
        self._follow_plans()
        W, Q, KV, H = eng.scratch.qkv_width, cfg.q_dim, cfg.kv_dim, cfg.n_head
        end, cached = pos + 1, max(0, min(cached, pos + 1))
        t0 = time.perf_counter()
        keys, q, probs = [], b"", b""
        # chunks as in `inspect`: at most self.chunk, never straddling `cached` (K/V written only from there on)
        bounds = sorted(set(range(0, cached, self.chunk)) | set(range(cached, end, self.chunk)) | {end})
        self._set_aside()
        for a, b in itertools.pairwise(bounds):
            t, last = b - a, b == end
            # the batched plan even for one position: decode's projection may rotate in its epilogue (Decode.qkv_rope)
            before, after = self._rope_variant(True, a >= cached, layer)
            dev.run(ops.dispatches(before, t), eng.step_writes(ids[a:b], a, t))
            rows = await dev.read(eng.scratch.qkv, 0, 4 * t * W)          # fused [q | k | v] rows, not yet rotated
            keys += [rows[4 * (r * W + Q): 4 * (r * W + Q + KV)] for r in range(t)]
            if last:
                q = rows[4 * (t - 1) * W: 4 * ((t - 1) * W + Q)]
            if last or a >= cached:       # later chunks attend to this one's K: write them to the cache first
                dev.run(ops.dispatches(after, t))
            if last:                      # the probe holds P(token j, head h, key k) at (j * n_head + h) * n_ctx + k
                raw = await dev.read(self.attn_probe, 4 * (t - 1) * H * eng.n_ctx, 4 * H * eng.n_ctx)
                probs = b"".join(raw[4 * h * eng.n_ctx: 4 * (h * eng.n_ctx + end)] for h in range(H))
        self._put_back()
        sliding = cfg.sliding[layer]
        return RopeInputs(pos, layer, H, cfg.n_head_kv, q, b"".join(keys), probs, cfg.head_dim, cfg.n_rot,
                          cfg.rope_base_local if sliding else cfg.rope_base, cfg.rope_scale, eng.rope_freqs,
                          cfg.rope_neox, cfg.attn_scale, cfg.sliding_window if sliding else 0, cfg.attn_softcap,
                          round((time.perf_counter() - t0) * 1e3, 1))

    def _set_aside(self) -> None:
        """Copy a hybrid's conv and recurrent states aside before a pass that recomputes them from position 0."""
        if self._states:
            self.device.run([], (), [(buf, 0, kept, 0, buf.size) for buf, kept in self._states])

    def _put_back(self) -> None:
        """The states as the chat left them (ordered after the pass: the next submit finds them restored)."""
        if self._states:
            self.device.run([], (), [(kept, 0, buf, 0, buf.size) for buf, kept in self._states])

    def _run(self, plan: list[ops.Op], ids: list[int], pos: int) -> None:
        t = len(ids)
        self.device.run(ops.dispatches(plan, t), self.engine.step_writes(ids, pos, t))

    async def inspect(self, ids: list[int], cached: int = 0, start: int | None = None, end: int | None = None, *,
                      attention: bool = True, residual: bool = True, lens: int = 0) -> Inspection:
        """Probe positions start .. end-1 of the conversation `ids` (default: the last WINDOW positions).

        cached: how many leading ids the KV cache holds at their positions (the session's); their K/V are used as
        they are. Positions from `cached` on up to `end` are computed and written first, whatever `start` is.
        attention / residual: collect those over the window; lens: the logit lens of the last `lens` positions."""
        eng, dev, cfg = self.engine, self.device, self.engine.cfg
        n = len(ids)
        end = n if end is None else end
        start = max(0, end - self.window) if start is None else start
        if not 0 <= start < end <= n <= eng.n_ctx:
            raise ValueError(f"inspect: window {start} .. {end} of {n} positions (context {eng.n_ctx})")
        if end - start > self.window:
            raise ValueError(f"inspect: a window of {end - start} positions; at most {self.window}")
        if not 0 <= lens <= min(self.lens_positions, end):
            raise ValueError(f"inspect: {lens} lens positions; at most {min(self.lens_positions, end)}")
        eng.check_ids(ids[:end], ValueError, "inspect: ")
        if self._pass is None:
            self._build_pass()
            await dev.flush_errors()
        self._follow_plans()
        L, H, w = cfg.n_layer, cfg.n_head, end - start
        cached = max(0, min(cached, end))
        l0 = end - lens
        # the window's positions are recomputed only for attention or residual norms; the lens needs its own rows;
        # a hybrid's states hold no earlier position, so its pass starts at 0 (the module's docstring)
        first = 0 if self._states else min(start if attention or residual else end, cached, l0 if lens else end)
        t0 = time.perf_counter()
        dev.write(self.win, _WINDOW.pack(start, w, l0, lens))
        # 1. the pass: chunks of at most self.chunk that never straddle `cached` (K/V written only from there), each
        #    through the variant of the plan the engine itself would run (decode for one token, else prefill)
        bounds = sorted(set(range(first, cached, self.chunk)) | set(range(max(first, cached), end, self.chunk))
                        | {end})
        self._set_aside()
        for a, b in zip(bounds, bounds[1:]):
            plan = self._variant(Variant(batched=b - a > 1, write_kv=a >= cached, attention=attention,
                                         lens=bool(lens), residual=residual))
            self._run(plan, ids[a:b], a)
        self._put_back()
        # (native submits return at once: the first read waits for the GPU, so it closes the pass's timing)
        att = await dev.read(self.attn, 0, 4 * L * H * w * (w + 1)) if attention else await dev.read(self.win)
        t1 = time.perf_counter()
        # 2. the lens on the rows the pass kept
        top = None
        if lens:
            plan = self._lens_one if lens == 1 else self._lens
            dev.run(ops.dispatches(plan, lens), [(self.lens_step, 0, ops.step_bytes(0, lens, eng.n_ctx))])
            raw = await dev.read(self.lens_top, 0, L * self.lens_stride)
            top = [[_pairs(raw, il * self.lens_stride + 8 * LENS_K * q, LENS_K) for q in range(lens)]
                   for il in range(L)]
        t2 = time.perf_counter()
        res = await dev.read(self.resid, 0, 4 * (L + 1) * w) if residual else None
        t3 = time.perf_counter()
        return Inspection(start, end, l0, att if attention else None, res, top, {"pass": round((t1 - t0) * 1e3, 1),
                                                          "lens": round((t2 - t1) * 1e3, 1),
                                                          "total": round((t3 - t0) * 1e3, 1)},
                          *(lens_work(L, self.head, lens) if lens else (0, 0)))
