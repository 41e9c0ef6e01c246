"""The GPU forward pass: weights resident, a KV cache, and two prebuilt plans (prefill of t tokens,
decode of one), each run as one compute pass with one submit.

    Config (lab.format.model)  ->  Engine: weights (lab.ops.weights.ModelWeights: GGUF blocks on the GPU),
                                    blocks (lab.engine.blocks: each kind of layer part, its buffers and ops),
                                    scratch (lab.engine.scratch.Scratch: activations, KV cache, states),
                                    plans (lab.engine.plans: Prefill and Decode, lists of Ops with bind groups
                                    built once at load), step

Per step the CPU writes only the step uniform (position, token count) and, for prefill or a sampled
token, the ids; a greedy step reads back one u32 (the argmax writes the next token id straight into
the ids buffer, so the following decode step needs no write of it).

A KV cache can be stepped from any position it holds; a block's states may not: a conv state holds the inputs of the
latest positions (a ring of conv_ring rows, lab/engine/scratch.py), a recurrent state the sum of every token so far
(only the position it was left at, or a snapshot's: `snapshot=` of `step`). The engine keeps the span of positions the
live states hold (`held`) and the snapshots' (`snaps`), asks each block whether a step may start at a position
(`Block.resumes`), refuses one that would read what they do not hold, restores a snapshot when a step starts at its
position, and says where a step may start (`resume_point`).

What it does not know: text (lab.text.tokenizer), turns and KV reuse (lab.engine.session), files (`weights.uploads`
says which file bytes go where; `weights.upload_file` and the browser's JS helper move them).
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Awaitable

from lab import gpu, ops
from lab.engine import blocks, budget
from lab.engine.lora import members as lora_members
from lab.engine.plans import Decode, Plan, Prefill, with_whole_attention
from lab.engine.scratch import AHEAD, DEFAULT_BATCH, SNAPSHOTS, Scratch, conv_ring
from lab.format.gguf import Header
from lab.format.model import Config, from_gguf, host_tensors, tensor_views
from lab.gpu.shaders import KernelCache
from lab.ops import attention as attn_ops
from lab.ops import sample
from lab.ops.weights import ModelWeights
from lab.settings import DEFAULT_CTX, MAX_CANDIDATES, MIN_CTX

MAX_PLANS = 32          # prepared dispatch lists kept (one per prefill length seen, plus decode)


class EngineError(RuntimeError):
    """A request the loaded engine cannot serve (context full, bad token id); the message says what to do."""


def read_host_values(path, header: Header, cfg: Config) -> dict[str, bytes]:
    """Native hosts: the bytes of the few tensors the engine needs as values (lab.format.model.HOST_TENSORS)."""
    out = {}
    with open(path, "rb") as f:
        for t in host_tensors(cfg, header):
            f.seek(t.offset)
            out[t.name] = f.read(t.nbytes)
    return out


class Engine:
    """weights (GGUF blocks on the GPU) -> scratch (activations, KV cache) -> plans (prefill, decode) -> step."""

    def __init__(self, device: gpu.Device, header: Header, cfg: Config | None = None, *,
                 n_ctx: int = DEFAULT_CTX, max_batch: int = DEFAULT_BATCH, logits_all: bool = False,
                 host_values: dict[str, bytes] | None = None, int8_prefill: bool = False, kv: str = "f32",
                 counted: budget.Budget | None = None, weights_kind: str = gpu.WEIGHTS) -> None:
        """host_values: the raw bytes of the tensors lab.format.model.host_tensors names (llama 3's rope_freqs), read by
        the caller from the file (`read_host_values` natively; one File.slice in the browser worker).
        int8_prefill: prefill's projections of the types lab.ops.matmul.I8_TYPES run on the tensor cores with 8-bit
        inputs (wgsl/matmul_i8.wgsl), on adapters with AdapterInfo.int8_matrix only; decode is unchanged.
        kv: the KV cache's element type, "f32" (exact) or "f16" (half the memory and the bytes attention reads, each
        cached value rounded to f16 as llama.cpp's default cache does; on any adapter: lab/ops/attention.py KV_TYPES).
        counted: the memory budget the caller already counted for these arguments (a page load counts once, to
        show it on the model card); without it the engine counts its own.
        weights_kind: the kind of the weights' buffers (lab.ops.weights ModelWeights): CONVERSATION for a model made
        in the page from the user's text, which Forget wipes."""
        self.device = device
        self.header = header
        self.cfg = cfg = cfg or from_gguf(header)
        if n_ctx < MIN_CTX or max_batch < 1:
            raise EngineError(f"context {n_ctx} (at least {MIN_CTX}) and batch {max_batch} must be positive")
        self._read_host_values(host_values or {})
        self.n_ctx = n_ctx
        self.max_batch = max_batch
        # decode steps with at most this many keys run attention in one dispatch (plans.with_whole_attention); on a
        # CPU adapter every step does, since its split has a single chunk anyway and the combine is pure overhead
        self.whole_keys = n_ctx if device.info.software else attn_ops.WHOLE_KEYS
        # an adapter that stops long loops silently (lavapipe) gets wrong attention past this many keys: refused
        self.max_keys = attn_ops.budget_keys(device.info.loop_budget, cfg.head_dim)
        self.logits_all = logits_all
        if int8_prefill and not device.info.int8_matrix:
            raise EngineError(f"{device.info.name}: no int8 subgroup matrices, so no int8 prefill")
        self.int8_prefill = int8_prefill
        if kv not in attn_ops.KV_TYPES:
            raise EngineError(f"KV cache type {kv!r}: one of {', '.join(attn_ops.KV_TYPES)}")
        self.kv_type = kv
        self.kernels = KernelCache(device)
        self._prepared: dict[tuple[str, int, bool], object] = {}
        self.blocks = blocks.for_config(cfg)
        self._stateful = any(b.state_fields for b in self.blocks.all)
        self._snapshotting = any(b.snapshots for b in self.blocks.all)
        # [lo, hi): the positions whose inputs the conv states hold, as the steps run so far left them; the recurrent
        # states hold the state after position hi - 1
        self.held = (0, 0)
        # per snapshot slot, the `held` of the states it copied (None: empty), and the slot the next one takes
        self.snaps: list[tuple[int, int] | None] = [None] * SNAPSHOTS
        self._next_snap = 0
        self.budget = self._checked(counted)
        self.lora = None        # a LoRA adapter every plan adds (set_lora), or None
        with device.owning(self):
            try:
                self.weights = ModelWeights(device, cfg, tensor_views(cfg, {t.name: t for t in header.tensors}),
                                            weights_kind)
                self.scratch = Scratch.alloc(device, cfg, self.blocks, n_ctx, max_batch, logits_all, int8_prefill, kv)
                self._build_plans()
            except BaseException:
                device.free(self)
                raise

    def _build_plans(self) -> None:
        self.prefill: Plan = Prefill(self).build()
        self.decode: Plan = Decode(self).build()
        self.decode_whole: Plan = with_whole_attention(self.decode, self.cfg.attention_layers,
                                                       lambda il: self.attention_op(il, False, whole=True))
        self._prepared.clear()

    def _adaptable(self) -> set[str]:
        """The file's tensors whose LoRA terms the plans add: every member of a projection they run through `mm`
        (the head and the embedding are read by their own ops)."""
        starts = {t.offset: t.name for t in self.header.tensors}
        skip = {self.weights.head.name, "token_embd.weight"}
        return {m for run in self.weights.matrices if run not in skip
                for m, _ in lora_members(run, self.weights.tensors, starts)}

    def set_lora(self, lora) -> None:
        """Every step from now on with this LoRA adapter's terms (lab.engine.lora.Lora, made on this engine's device
        for steps of max_batch rows), or without any (None). The plans are built again; the KV cache the earlier
        steps left was computed without it, so a caller starts the conversation again (the session does)."""
        self._check_lora(lora)
        self.lora = lora
        with self.device.owning(self):      # the plans' uniforms are the engine's, whoever asks for the adapter
            self._build_plans()

    def plans_with(self, lora) -> tuple[Plan, Plan]:
        """(prefill, decode) plans with this adapter's terms (None: none), the engine's own plans and adapter left as
        they are: for a caller that runs the model with an adapter the chat does not use (the retrieval card's tuned
        embedder, lab.instruments.retrieval `Index(adapter=)`). The buffers the plans make (uniforms, attention
        scratch) belong to the caller's `device.owning`."""
        self._check_lora(lora)
        return Prefill(self, lora).build(), Decode(self, lora).build()

    def _check_lora(self, lora) -> None:
        if lora is not None and lora.max_tokens < self.max_batch:
            raise EngineError(f"the adapter was made for steps of {lora.max_tokens} rows, this engine runs "
                              f"{self.max_batch}")
        if lora is not None:
            missing = [n for n in lora.targets if n not in self._adaptable()]
            if missing:
                raise EngineError(f"the adapter adapts {missing[0]}" + (f" and {len(missing) - 1} more tensors"
                                  if len(missing) > 1 else "") + ": the lab adapts the layers' projections only (not "
                                  "the output head or the embedding yet)")

    def _read_host_values(self, host_values: dict[str, bytes]) -> None:
        """The values of the tensors the plans take as constants: rope_freqs' [n_rot/2] frequency factors
        (theta_i / factor_i), and each layer's output scale (`out_scale`: layer -> scale)."""
        self.rope_freqs = None
        self.out_scale: dict[int, float] = {}
        for t in host_tensors(self.cfg, self.header):
            raw = host_values.get(t.name)
            if raw is None or len(raw) != t.nbytes:
                raise EngineError(f"tensor {t.name}: its {t.nbytes} bytes were not read from the file (the engine "
                                  f"needs its values before it builds the plans)")
            values = array("f", bytes(raw)).tolist()
            if t.name == "rope_freqs.weight":
                self.rope_freqs = values
            else:
                self.out_scale[int(t.name.split(".")[1])] = values[0]

    def _checked(self, counted: budget.Budget | None) -> budget.Budget:
        """Every buffer's size against the adapter's limits before the first is made (lab/engine/budget.py): a
        refusal names the buffer, its bytes and the limit, and leaves nothing allocated. `counted`, where the caller
        counted already, must be for this engine's arguments."""
        key = (self.n_ctx, self.max_batch, self.logits_all, self.int8_prefill, self.kv_type)
        if counted is None:
            counted = budget.count(self.device.info.limits, self.header, self.cfg, self.n_ctx,
                                   max_batch=self.max_batch, logits_all=self.logits_all, int8=self.int8_prefill,
                                   kv=self.kv_type)
        elif counted.counted_for != key:
            raise EngineError(f"the memory budget was counted for (n_ctx, max_batch, logits_all, int8, kv) = "
                              f"{counted.counted_for}, not {key}")
        return budget.check(counted, bounded=False)

    def close(self) -> None:
        """Free every buffer this engine made (weights, activations, caches, parameters)."""
        self.device.free(self)
        self._prepared.clear()

    # -- what the probes and panels use --------------------------------------------------------------------
    @property
    def kv_buffers(self) -> list[tuple[gpu.Buffer, gpu.Buffer]]:
        """(K, V) cache buffers of each layer with attention (`kv_layers`), each [n_ctx, n_head_kv * head_dim] of
        `kv_type` (f32 or f16)."""
        return [(self.scratch.k_cache[il], self.scratch.v_cache[il]) for il in self.kv_layers]

    @property
    def kv_value_bytes(self) -> int:
        """Bytes of one cached value: 4 (f32) or 2 (f16)."""
        return attn_ops.KV_TYPES[self.kv_type]

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers whose K/V `kv_buffers` lists, in order: every layer but lfm2's short-conv blocks, qwen35's
        delta-net layers and gemma4's shared-KV layers (which read an earlier layer's: Config.kv_source)."""
        return tuple(il for il in self.cfg.attention_layers if self.cfg.has_kv(il))

    @property
    def state_buffers(self) -> dict[int, gpu.Buffer]:
        """{layer: conv state} of the conv layers (lfm2's short-conv, qwen35's delta-net), each [conv_ring rows,
        conv_channels] f32, row q % rows holding the conv input of position q (`held` says which positions)."""
        return {il: self.scratch.conv_state[il] for il in self.cfg.conv_layers}

    @property
    def recurrent_buffers(self) -> dict[int, gpu.Buffer]:
        """{layer: recurrent state} of qwen35's delta-net layers, each [ssm_v_heads, d_k, d_v] f32 with
        state[(h d_k + r) d_v + c] = S_h[r][c], the state after position held[1] - 1."""
        return {il: self.scratch.recurrent[il] for il in self.cfg.delta_layers}

    # -- the conv and recurrent states (lfm2, qwen35) --------------------------------------------------------
    def can_resume(self, pos: int) -> bool:
        """Whether a step at `pos` finds what every block reads (Block.resumes: a conv state's l_cache - 1 rows before
        it, as the steps so far wrote them; a recurrent state left at pos, live or in a snapshot). Before position 0
        there is nothing: a step there always can; so can any step of a model with a KV cache only (read up to pos,
        whatever lies past it)."""
        return pos == 0 or all(b.resumes(self.held, self.snaps, pos) for b in self.blocks.all)

    def resume_point(self, n: int) -> int:
        """The latest position at or before n a step can start from (0 at worst): n itself where the states allow it,
        else where the live states or a snapshot stand (the positions from there to n run again)."""
        held = [h[1] for h in (self.held, *self.snaps) if h is not None]
        return max(p for p in (0, n, *held) if p <= n and self.can_resume(p))

    def _advance(self, pos: int, t: int) -> None:
        """Refuse a step the states cannot serve, restore the snapshot it starts from (qwen35), and record the positions
        they hold after it: the step's rows are written, and a row of the ring is overwritten by the position `ring`
        after it. Snapshots of positions past pos belong to another continuation and are dropped."""
        if not self._stateful:
            return
        if not self.can_resume(pos):
            raise EngineError(f"a step at position {pos}: the conv and recurrent states hold position "
                              f"{self.held[1]} and cannot be cut back like a KV cache; run from position 0")
        if self._snapshotting:
            if pos and self.held[1] != pos:
                slot = next(i for i, h in enumerate(self.snaps) if h is not None and h[1] == pos)
                self.device.run([], (), self._snapshot_copies(slot, restore=True))
                self.held = self.snaps[slot]
            self.snaps = [h if h is not None and h[1] <= pos else None for h in self.snaps]
        lo = 0 if pos == 0 else self.held[0]
        self.held = (max(lo, pos + t - conv_ring(self.cfg)), pos + t)

    def _snapshot_copies(self, slot: int, restore: bool = False) -> list[tuple]:
        """The copies between the live states the blocks snapshot (Block.snapshotted) and snapshot `slot`: into it, or
        back out of it with restore=True."""
        out, off, snap = [], 0, self.scratch.snapshots[slot]
        for buf in (b for block in self.blocks.all for b in block.snapshotted(self.scratch)):
            out.append((snap, off, buf, 0, buf.size) if restore else (buf, 0, snap, off, buf.size))
            off += buf.size
        return out

    def _take_snapshot(self) -> list[tuple]:
        """The copies that keep the states as the step being submitted leaves them, in the next slot (round robin)."""
        slot = self._next_snap
        self._next_snap = (slot + 1) % SNAPSHOTS
        self.snaps[slot] = self.held
        return self._snapshot_copies(slot)

    def plan_for(self, batched: bool) -> Plan:
        """The plan the probes and panels build on: prefill, or decode with its split attention."""
        return self.prefill if batched else self.decode

    def step_plan(self, t: int, pos: int) -> Plan:
        """The plan a step of t tokens at `pos` runs: decode steps with at most `whole_keys` keys take the
        one-dispatch attention (`decode_whole`), the others the split."""
        if t > 1:
            return self.prefill
        return self.decode_whole if pos + 1 <= self.whole_keys else self.decode

    def attention_op(self, il: int, batched: bool, probe: gpu.Buffer | None = None,
                     whole: bool = False) -> list[ops.Op]:
        """Layer il's attention over the cache, as the plans run it (role ATTENTION); lab.instruments.probes builds it
        again with a `probe` buffer (attention probabilities), so the probe variant can never drift from the plans'."""
        return self.blocks.of(blocks.Attention).op(self, il, batched, probe, whole)

    def step_writes(self, ids: list[int] | None, pos: int, t: int) -> list[tuple[gpu.Buffer, int, bytes]]:
        """The CPU's only writes of a step: the step uniform, and the ids unless the previous argmax feeds it."""
        writes = [(self.scratch.step, 0, ops.step_bytes(pos, t, self.n_ctx))]
        if ids is not None:
            writes.append((self.scratch.ids, 0, struct.pack(f"<{t}I", *ids)))
        return writes

    # -- plans ----------------------------------------------------------------------------------------------
    def ops_for(self, t: int, sampled: bool = False, pos: int = 0) -> list[ops.Op]:
        return self.step_plan(t, pos).with_tail(sampled)

    def prepared(self, t: int, sampled: bool = False, pos: int = 0):
        """The backend's prepared dispatch list for a step of t tokens at `pos` (prefill for t > 1), cached per
        (plan, t, sampled)."""
        plan = self.step_plan(t, pos)
        key = ("prefill" if t > 1 else "whole" if plan is self.decode_whole else "decode", t, sampled)
        p = self._prepared.get(key)
        if p is None:
            p = self.device.prepare(ops.dispatches(plan.with_tail(sampled), t))
            if len(self._prepared) > MAX_PLANS:
                self._prepared.pop(next(iter(k for k in self._prepared if k[0] == "prefill")))
            self._prepared[key] = p
        return p

    # -- steps ------------------------------------------------------------------------------------------
    def check_ids(self, ids, error: type[Exception] = EngineError, prefix: str = "") -> None:
        """Refuse ids outside the vocabulary: raises `error` naming the first one (its message after `prefix`).
        Every path that writes ids for the GPU checks here: a step, the probes, perplexity."""
        bad = next((i for i in ids if not 0 <= i < self.cfg.n_vocab), None)
        if bad is not None:
            raise error(f"{prefix}token id {bad} is outside the vocabulary of {self.cfg.n_vocab}")

    def check_step(self, ids, pos: int) -> None:
        """Refuse a step of these ids at `pos` that this engine cannot run: its token count, the context made at load,
        the adapter's loop budget, the vocabulary (EngineError, the words a user reads)."""
        t = len(ids)
        if not 1 <= t <= self.max_batch:
            raise EngineError(f"a step takes 1 to {self.max_batch} tokens, not {t}")
        if pos + t > self.n_ctx:
            raise EngineError(f"the conversation would reach {pos + t} tokens, past the context of {self.n_ctx} "
                              f"made at load: start a new chat, or load with a larger context")
        if self.max_keys is not None and pos + t > self.max_keys:
            raise EngineError(f"{self.device.info.name} stops a shader's loops after {self.device.info.loop_budget:,} "
                              f"iterations without a word, so attention over more than {self.max_keys:,} keys would "
                              f"be wrong on it (this step reaches {pos + t:,}): start a new chat, or use a GPU")
        self.check_ids(ids)

    def step(self, ids: list[int] | None, pos: int, t: int | None = None, sampled: bool = False,
             keep: int | None = None, edit=None, snapshot: bool = False) -> None:
        """Submit one step of t tokens at `pos`. ids=None reuses ids[0] (the previous greedy argmax).
        sampled=True ends the step with top-k (read with `top_k`) instead of argmax (read with `argmax`).
        keep=i also copies the argmax to slot i of `kept`, so that several greedy steps can run before
        one read-back (`kept_ids`): each overwrites ids[0].
        edit(plan, t, pos, tail) -> (dispatches, writes): the step run with an experiment's ops in a copy of the plan
        (lab/instruments/interventions.py `Interventions.editor`); the engine's own plans stay as they are.
        snapshot=True: the recurrent and conv states after this step are also copied aside (qwen35; a no-op for other
        models), so that a later step can start from here (`resume_point`) whatever ran after."""
        t = len(ids) if ids is not None else (t or 1)
        self.check_step(ids if ids is not None else [0] * t, pos)
        self._advance(pos, t)
        s = self.scratch
        copies = []
        if keep is not None:
            if sampled or not 0 <= keep < AHEAD:
                raise EngineError(f"keep={keep}: greedy steps only, slots 0..{AHEAD - 1}")
            copies = [(s.ids, 0, s.kept, 4 * keep, 4)]
        if snapshot and self._snapshotting:
            copies += self._take_snapshot()
        writes = self.step_writes(ids, pos, t)
        if edit is None:
            self.device.run(self.prepared(t, sampled, pos), writes, copies)
            return
        plan = self.step_plan(t, pos)
        run, more = edit(plan, t, pos, plan.tails.sampled if sampled else plan.tails.greedy)
        self.device.run(run, writes + more, copies)

    def kept_ids(self, n: int) -> Awaitable[list[int]]:
        """The first n kept greedy ids, as of the steps submitted so far (the read is ordered here, see
        Device.read: steps submitted before the await do not change them)."""
        raw = self.device.read(self.scratch.kept, 0, 4 * n)

        async def ids() -> list[int]:
            return list(struct.unpack(f"<{n}I", await raw))
        return ids()

    async def argmax(self) -> int:
        return struct.unpack("<I", await self.device.read(self.scratch.ids, 0, 4))[0]

    async def top_k(self) -> list[tuple[int, float]]:
        raw = await self.device.read(self.scratch.topk, 0, 8 * MAX_CANDIDATES)
        pairs = [sample.PAIR.unpack_from(raw, 8 * i) for i in range(MAX_CANDIDATES)]
        return [(i, v) for i, v in pairs if i != sample.NONE]

    async def traced(self, ids: list[int], pos: int, names=None) -> dict[str, bytes]:
        """Run one step op by op and read every traced activation (or those in `names`): {name: raw bytes, [rows,
        width] of the trace's dtype (f32; u32 for a routed layer's chosen experts)}."""
        t = len(ids)
        self.check_step(ids, pos)
        op_list, trace = self.ops_for(t, pos=pos), self.step_plan(t, pos).trace
        if names is not None:
            wanted = set(names)
            trace = [tr for tr in trace if tr.name in wanted]
            if len(trace) != len(wanted):
                missing = sorted(wanted - {tr.name for tr in trace})
                raise EngineError(f"no traced tensor {', '.join(missing)} in a {t}-token step")
        self._advance(pos, t)       # after the names are checked: a refused request runs nothing
        out: dict[str, bytes] = {}
        done = 0
        writes = self.step_writes(ids, pos, t)
        for tr in sorted(trace, key=lambda r: r.after):
            if tr.after >= done:
                self.device.run(ops.dispatches(op_list[done:tr.after + 1], t), writes)
                writes, done = [], tr.after + 1
            rows = 1 if tr.rows == "one" else t
            raw = await self.device.read(tr.buffer, 4 * tr.offset, 4 * ((rows - 1) * tr.stride + tr.width))
            out[tr.name] = b"".join(raw[4 * r * tr.stride: 4 * (r * tr.stride + tr.width)] for r in range(rows))
        if done < len(op_list):
            self.device.run(ops.dispatches(op_list[done:], t), writes)
        return out

    async def first_nonfinite(self, ids: list[int], pos: int) -> str | None:
        """Replay a step of `ids` at `pos` op by op and name the first traced tensor, in plan order, that holds a NaN
        or an infinity (None if all are finite): where a broken weight or setting first shows."""
        u32 = {tr.name for tr in self.step_plan(len(ids), pos).trace if tr.dtype != "f32"}    # ids hold no floats
        for name, raw in (await self.traced(ids, pos)).items():
            if name not in u32 and not all(map(math.isfinite, array("f", raw))):
                return name
        return None

    def dispatches_per_step(self, t: int, sampled: bool = False, pos: int = 0) -> int:
        """Dispatches of a step of t tokens at `pos` (decode: at pos 0 the short-context plan)."""
        return len(ops.dispatches(self.ops_for(t, sampled, pos), t))
