"""The two step plans of an engine: `Prefill` (t tokens through matmuls) and `Decode` (one token through matvecs).

Both run the same layer sequence, written once in `PlanBuilder.build`; each subclass says only how its kind of
step projects, feeds the GLU, attends and picks the rows of the output head. Decode folds what it can into its
matvecs (the RMSNorm before a projection, the GLU before the down projection, the biases after QKV, and the RoPE
rotation, adjacent or NeoX pairs, with the KV write after QKV), because a decode step on a GPU is bound by the
number of dependent kernels, not by bytes (docs/performance.md).

The layer sequence is the blocks' (lab.engine.blocks): `build` hands each its turn, and a block adds its ops and
records its `Traced` points under llama.cpp's eval-callback names (attn_norm-0, kqv_out-3, l_out-29, ...), the names
lab/host/reference/forward.py traces and the panels key their data by; each block's docstring lists its own.

What it does not know: files, tokens, sessions. It reads the engine's weights and scratch buffers, and builds ops.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from lab import gpu, ops
from lab.engine.lora import members as lora_members
from lab.ops import elementwise, glu, matmul, norm, rope


@dataclass(frozen=True)
class Traced:
    """An activation recorded under llama.cpp's eval-callback name after op `after` of a plan."""
    name: str
    after: int              # index into the plan's op list
    buffer: gpu.Buffer
    width: int              # floats per token row
    stride: int             # floats between rows
    offset: int = 0         # floats before the first element of row 0
    rows: str = "tokens"    # "tokens" (t rows) or "one" (a single row)
    dtype: str = "f32"      # what the words hold: "f32", or "u32" (a routed layer's chosen experts, ffn_moe_topk-L)


@dataclass(frozen=True)
class Tails:
    """The ops that end a step by picking the next token, one list per kind of step."""
    greedy: list[ops.Op] = field(default_factory=list)    # argmax into ids[0]: the next decode step's input
    sampled: list[ops.Op] = field(default_factory=list)   # top-k candidates into topk, for the CPU's sampler


@dataclass
class Plan:
    ops: list[ops.Op] = field(default_factory=list)
    trace: list[Traced] = field(default_factory=list)
    tails: Tails = field(default_factory=Tails)

    def with_tail(self, sampled: bool) -> list[ops.Op]:
        """The whole op list of a step: the plan's ops, then the tail that picks its token."""
        return self.ops + (self.tails.sampled if sampled else self.tails.greedy)

    def at(self, name: str) -> int:
        """Index of the op after which the traced tensor `name` is complete."""
        for tr in self.trace:
            if tr.name == name:
                return tr.after
        raise KeyError(f"no traced tensor {name!r} in this plan")


ENGINES = object()      # a builder's `lora` by default: the engine's own adapter (Engine.set_lora), or none


class PlanBuilder:
    """One step's plan over the engine's weights and scratch, with `lora`'s terms after the projections it names: by
    default the engine's own adapter; another (or None) makes a plan for a caller of its own, the engine's plans left
    as they are (the retrieval card's tuned embedder, lab/instruments/retrieval.py `Index(adapter=)`)."""
    batched: bool

    def __init__(self, engine, lora=ENGINES) -> None:
        self.eng = engine
        self.cfg = engine.cfg
        self.dev = engine.device
        self.kernels = engine.kernels
        self.scratch = engine.scratch
        self.weights = engine.weights
        # a LoRA adapter whose terms follow the projections it names, or None
        self.lora = engine.lora if lora is ENGINES else lora
        self.starts = {t.offset: t.name for t in engine.header.tensors}     # the file's tensors, where each starts
        self.plan = Plan()

    @property
    def max_rows(self) -> int:
        """The most rows a step of this plan runs: the batched projections' inputs and outputs, and the adapter's terms,
        are checked against it (the engine's step; a training step's window, lab.engine.backward, whose own rows hold
        no more)."""
        return self.eng.max_batch

    # -- recording ------------------------------------------------------------------------------------------
    def add(self, op_list, name=None, buf=None, width=0, stride=None, offset=0, rows="tokens") -> None:
        self.plan.ops.extend(op_list)
        if name:
            self.trace(name, buf, width, stride, offset, rows)

    def trace(self, name, buf, width, stride=None, offset=0, rows="tokens", dtype="f32") -> None:
        """Record `name` as complete after the last op added so far."""
        self.plan.trace.append(Traced(name, len(self.plan.ops) - 1, buf, width, stride or width, offset, rows, dtype))

    def adapted(self, name: str, x: gpu.Buffer, y: gpu.Buffer, y_offset: int = 0,
                y_stride: int | None = None) -> list[ops.Op]:
        """The LoRA terms of the tensors of projection `name` (one tensor, or a run of stacked ones) added to their
        output rows, where the engine's adapter names them."""
        if self.lora is None:
            return []
        stride = y_stride or self.weights.matrices[name].rows
        return [op for member, pieces in lora_members(name, self.weights.tensors, self.starts)
                if member in self.lora.targets
                for op in self.lora.forward(self.kernels, member, x, y, self.scratch.step, y_offset=y_offset,
                                            y_stride=stride, max_tokens=self.max_rows, pieces=pieces)]

    def lora_on(self, *names: str) -> bool:
        """Whether the adapter names a tensor of these projections (single or stacked runs)."""
        return self.lora is not None and any(m in self.lora.targets for n in names
                                             for m, _ in lora_members(n, self.weights.tensors, self.starts))

    # -- what differs between prefill and decode ------------------------------------------------------------
    def mm(self, name: str, x: gpu.Buffer, y: gpu.Buffer, **opts) -> list[ops.Op]:
        raise NotImplementedError

    def normed_proj(self, key: str, norm_w: str, y: gpu.Buffer, width: int, bias: str | None,
                    rotary: rope.QkvRope | None = None) -> list[list[ops.Op]]:
        """RMSNorm of x, then the stacked projections `key` into rows of `width` floats of y (plus a bias over the
        whole row; `rotary`: rotated, K and V cached, see qkv_rope). Returns op lists; the first one leaves xn (the
        normed x) written."""
        raise NotImplementedError

    def qkv_rope(self, il: int, base: float) -> rope.QkvRope | None:
        """RoPE for layer il's QKV projection to apply in its own epilogue, or None for the rope op after it."""
        return None

    def glu_then(self, act: str, n_ff: int) -> tuple[gpu.Buffer, dict]:
        """The GLU of the [gate | up] rows of 2 n_ff: (the down projection's input, its fused options)."""
        raise NotImplementedError

    def head(self) -> bool:
        """Add the output head's ops; returns whether its logits are one row per token of the step (else one row,
        the last token's)."""
        raise NotImplementedError

    # -- the layer sequence ---------------------------------------------------------------------------------
    def build(self) -> Plan:
        """The embedding (and the per-layer inputs), then each layer's mixer, feed-forward and tail, then the head:
        the whole step, each part added by the block that owns it (lab.engine.blocks)."""
        blocks = self.eng.blocks
        blocks.embedding.build(self)
        if blocks.tail:
            blocks.tail.inputs(self)
        for il in range(self.cfg.n_layer):
            blocks.mixers[il].build(self, il)
            blocks.ffn_of(il).build(self, il)
            if blocks.tail:
                blocks.tail.build(self, il)
        blocks.head.build(self)
        return self.plan

    # -- what the blocks share ------------------------------------------------------------------------------
    def add_normed(self, op_lists, name) -> None:
        """normed_proj's op lists, the normed x traced as `name` after the first."""
        self.add(op_lists[0], name, self.scratch.xn, self.cfg.n_embd)
        for o in op_lists[1:]:
            self.add(o)

    def residual(self, weight: str, x_in: gpu.Buffer, post_norm: str, il: int, post_name: str, out_name: str,
                 mm_name: str | None = None, **opts) -> None:
        """A branch's output projection `weight` of x_in added to the residual x, traced as `out_name`: the add folded
        into the projection, or, where the config has post-norms, the projection into tmp (traced as `mm_name`),
        RMS-normed by layer il's `post_norm` (traced as `post_name`), whose op adds it."""
        cfg, s, E = self.cfg, self.scratch, self.cfg.n_embd
        if not cfg.post_norms:
            self.add(self.mm(weight, x_in, s.x, accumulate=True, **opts), out_name, s.x, E)
            return
        self.add(self.mm(weight, x_in, s.tmp, **opts), mm_name, s.tmp, E)
        self.add(norm.rms_norm(self.dev, self.kernels, s.tmp, self.weights.vectors[f"blk.{il}.{post_norm}"], s.tmp,
                               s.step, E, cfg.eps, residual=s.x), post_name, s.tmp, E)
        self.trace(out_name, s.x, E)

    def set_tails(self, greedy: list[ops.Op], sampled: list[ops.Op]) -> None:
        self.plan.tails = Tails(greedy=greedy, sampled=sampled)


GLU_APART = 8192        # decode: FFNs at least this wide run their GLU as its own op (Decode.glu_then)


class Prefill(PlanBuilder):
    """t tokens: a norm op, matmuls, a bias op, a GLU op; the head on the last row (every row for logits_all)."""
    batched = True

    def mm(self, name, x, y, *, y_offset=0, y_stride=None, accumulate=False):
        w, s = self.weights.matrices[name], self.scratch
        if self.eng.int8_prefill and w.type.name in matmul.I8_TYPES:
            base = matmul.matmul_i8(self.dev, self.kernels, w, x, y, s.step, s.xq, s.xd,
                                    max_tokens=self.max_rows, accumulate=accumulate, y_offset=y_offset,
                                    y_stride=y_stride)
        else:
            base = matmul.matmul(self.dev, self.kernels, w, x, y, s.step, max_tokens=self.max_rows,
                                 accumulate=accumulate, y_offset=y_offset, y_stride=y_stride)
        return base + self.adapted(name, x, y, y_offset, y_stride)

    def normed_proj(self, key, norm_w, y, width, bias, rotary=None):
        s, cfg, vec = self.scratch, self.cfg, self.weights.vectors
        out = [norm.rms_norm(self.dev, self.kernels, s.x, vec[norm_w], s.xn, s.step, cfg.n_embd, cfg.eps)]
        out += [self.mm(w.name, s.xn, y, y_offset=col, y_stride=width) for w, col in self.weights.stacked[key]]
        if bias:
            out.append(elementwise.add_bias(self.dev, self.kernels, y, vec[bias], s.step, width, stride=width,
                                            offset=0))
        return out

    def glu_then(self, act, n_ff):
        s = self.scratch
        self.add(glu.glu(self.dev, self.kernels, s.gate_up, None, s.h, s.step, n_ff, act=act))
        return s.h, {}

    def head(self):
        s, cfg = self.scratch, self.cfg
        if self.eng.logits_all:
            self.add(matmul.matmul(self.dev, self.kernels, self.weights.head, s.xn, s.logits, s.step,
                                   max_tokens=self.eng.max_batch))
            return True
        self.add(elementwise.last_row(self.dev, self.kernels, s.xn, s.last, s.step, cfg.n_embd))
        self.add(matmul.matvec(self.dev, self.kernels, self.weights.head, s.last, s.logits, s.step))
        return False


class Decode(PlanBuilder):
    """One token: matvecs with the norm, the GLU and the bias folded in; the head on the one row."""
    batched = False

    def mm(self, name, x, y, *, y_offset=0, accumulate=False, **fused):
        # the LoRA term reads the projection's real input: the normed x a fused norm leaves in xn
        lora_x = fused["xn"] if "norm" in fused else x
        base = matmul.matvec(self.dev, self.kernels, self.weights.matrices[name], x, y, self.scratch.step,
                             y_offset=y_offset, accumulate=accumulate, **fused)
        return base + self.adapted(name, lora_x, y, y_offset)

    def normed_proj(self, key, norm_w, y, width, bias, rotary=None):
        s, vec = self.scratch, self.weights.vectors
        return [self.mm(w.name, s.x, y, y_offset=col, norm=(vec[norm_w], self.cfg.eps), xn=s.xn,
                        write_xn=i == 0, **({"bias": vec[bias], "bias_offset": col} if bias else {}),
                        **({"rope": rotary} if rotary else {}))
                for i, (w, col) in enumerate(self.weights.stacked[key])]

    def qkv_rope(self, il, base):
        # A decode step is bound by its dependent dispatches: the rotation and the KV write ride in the projection's
        # epilogue where a workgroup's 4 rows can hold whole pairs (adjacent pairs; NeoX pairs, half the rotation
        # apart, where every part starts on a head and n_rot is a multiple of 4: wgsl/matvec.wgsl rope_rows), nothing
        # sits between projection and rotation (q/k norms), and the adapter allows the bindings.
        cfg, s = self.cfg, self.scratch
        stacked = self.weights.stacked[f"blk.{il}.qkv"]
        limit = self.dev.info.limits["max_storage_buffers_per_shader_stage"]
        unit = cfg.head_dim if cfg.rope_neox else 2
        # a LoRA term on Q, K or V is added after the projection, so the rotation must come after it too
        if cfg.qk_norm or self.lora_on(*(w.name for w, _ in stacked)) or cfg.n_rot // 2 > rope.MAX_FUSED_PAIRS \
                or cfg.rope_neox and (cfg.n_rot % 4 or cfg.head_dim % 4) \
                or any(matmul.matvec_storage(w.type.name, norm=True, bias=cfg.qkv_bias, rope=True) > limit
                       for w, _ in stacked) \
                or any((col + p.first_row) % unit for w, col in stacked for p in w.parts):
            return None
        freqs = rope.frequencies(cfg.n_rot, base, cfg.rope_scale, self.eng.rope_freqs)
        return rope.QkvRope(cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_rot, tuple(freqs), s.step,
                            s.k_cache[il], s.v_cache[il], self.eng.n_ctx, self.eng.kv_type, neox=cfg.rope_neox)

    def glu_then(self, act, n_ff):
        # Folded into ffn_down's matvec, the GLU is recomputed by every workgroup of it: at Llama-3.1-8B's
        # 14,336-wide FFN that made ffn_down 46 us a layer on the H200. FFNs that wide take one GLU op first;
        # narrower ones keep the fold, which saves a dispatch where dispatches bound the step.
        s = self.scratch
        # a LoRA term on ffn_down reads the GLU's output, so it must be in a buffer
        if n_ff >= GLU_APART or self.lora_on(*(n for n in self.weights.matrices if n.endswith("ffn_down.weight"))):
            self.add(glu.glu(self.dev, self.kernels, s.gate_up, None, s.h, s.step, n_ff, act=act))
            return s.h, {}
        return s.gate_up, {"glu": act}

    def head(self):
        s = self.scratch
        self.add(matmul.matvec(self.dev, self.kernels, self.weights.head, s.xn, s.logits, s.step))
        return False


def with_whole_attention(decode: Plan, layers: tuple[int, ...], whole) -> Plan:
    """The decode plan with each attention layer's run of ATTENTION ops (split, combine) replaced by `whole(il)` (one
    decode_whole op): the engine's plan for steps with few keys. Every other op is the same object; the traced
    points move with their ops. The probes keep using the split plan (its combine leaves what their pass reads)."""
    last = {decode.at(f"kqv_out-{il}"): il for il in layers}
    ops_out: list[ops.Op] = []
    index: dict[int, int] = {}
    for i, op in enumerate(decode.ops):
        if op.role == ops.ATTENTION:
            if i in last:
                ops_out += whole(last[i])
        else:
            ops_out.append(op)
        index[i] = len(ops_out) - 1
    trace = [dataclasses.replace(tr, after=index[tr.after]) for tr in decode.trace]
    return Plan(ops_out, trace, decode.tails)
