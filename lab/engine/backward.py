"""Training's step on the GPU (issue #43): one window of t tokens forward, the loss, and every gradient back to
the trained parameters, as one list of ops in one compute pass.

    TrainScratch.alloc(...)   the step's own buffers (kind CONVERSATION: they hold the user's text's activations)
    Backward(engine, ...)     .step_ops(): the engine's own forward (its blocks' `build`, through the prefill plan's
                              projections, LoRA terms included), each layer's input kept (`saved`); the final norm, the
                              head fused with the cross-entropy (lab.ops.backward_head); then per layer, last first:
                              what the layer's backward reads (`kept`: the forward's own rows, copied aside in the
                              forward and back now; or, where they would pass KEEP_BYTES, the layer's forward again
                              from its saved input: recomputation, one layer's activations live at a time), and its
                              blocks' `build_backward`, which take the gradient of the residual stream (`dx`)
                              through the layer and add the parameters' gradients into their buffers.
                              .loss_ops(): the forward and the loss alone (held-out windows).

The gradients are added in (a step of several windows sums them); the caller clears them at a step's start. What
the blocks' backward needs of the builder: `proj_back` (a projection's input gradient through the quantized base,
and its LoRA factors' gradients, or in full fine-tuning its own dW), `stacked_back` (the same over a fused row's
parts), `norm_back` (and a norm's dw in full fine-tuning) and `bias_back` (a bias's gradient, full fine-tuning's).

What it does not know: data, optimizers, files (lab.instruments.training strings the steps together).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from lab import gpu, ops
from lab.engine.blocks import MIXERS
from lab.engine.blocks.feedforward import FeedForward
from lab.engine.lora import Lora
from lab.engine.lora import members as lora_members
from lab.engine.plans import Prefill
from lab.format.model import expected_tensors, is_flat
from lab.ops import WeightPart, backward_attention, backward_head, backward_matmul, elementwise, norm
from lab.ops.backward import embed_back, rms_norm_back
from lab.ops.backward_deltanet import DeltaScratch


# Kept activations (TrainScratch.kept): per layer the rows its mixer's backward reads (an attention layer's fused
# [q | k | v] row with Q and K rotated and its output; a short-conv layer's in_proj row [B | C | x] and C * conv; a
# delta-net layer's in-projection row, its conv's output and its gated norm's), x after the mixer, the feed-forward's normed input, its [gate | up] row and the GLU's output, t rows each. At
# most this many bytes in all; past it the backward computes each layer's forward again (that second forward cost
# SmolLM2's window on the H100 45.0 against 38.0 ms at T = 128, 87.6 against 71.3 at T = 512: docs/performance.md).
# SmolLM2 at T = 512 keeps 448 MB, Qwen2.5-0.5B 905 MB; Llama-3.1-8B would keep 4 GB and recomputes.
KEEP_BYTES = 1 << 30


def kept_widths(cfg, il: int) -> dict[str, int]:
    """Floats a token of each row layer il keeps (the Scratch field each is copied from, ts.mid for "mid"), in the
    order the forward leaves them: its mixer's (Block.kept), "mid", the feed-forward's."""
    return {**MIXERS[cfg.mixer(il)].kept(cfg, il), "mid": cfg.n_embd, **FeedForward.kept(cfg, il)}


def kept_bytes(cfg, T: int) -> int:
    """Bytes of every layer's kept rows for windows of T tokens."""
    return 4 * T * sum(sum(kept_widths(cfg, il).values()) for il in range(cfg.n_layer))


class TrainError(ValueError):
    """A training run this engine cannot do, in words a user reads."""


# The mixers whose blocks have a backward (Block.build_backward): attention, lfm2's short conv and qwen35's gated
# delta-net (its recurrence's backward carries the state's gradient back through every token of the window:
# lab.ops.backward_deltanet).
TRAINED_MIXERS = ("attention", "shortconv", "deltanet")


def untrainable(cfg) -> str | None:
    """Why a model's layers have no backward yet (None: they all have one)."""
    kinds = sorted({cfg.mixer(il) for il in range(cfg.n_layer)} - set(TRAINED_MIXERS))
    parts = [f"{k} layers" for k in kinds]
    if cfg.routed_layers:           # lab/engine/blocks/moe.py has no backward yet (issue #48)
        parts.append("routed experts")
    for flag, what in (("v_norm", "a V norm"), ("block_tail", "per-layer inputs")):
        if getattr(cfg, flag):
            parts.append(what)
    if any(not cfg.has_kv(il) for il in range(cfg.n_layer) if cfg.mixer(il) == "attention"):
        parts.append("layers that share an earlier layer's KV cache")
    if not parts:
        return None
    return (f"{cfg.arch}: training has no backward yet for its {', '.join(parts)} (llama, qwen2, qwen3, phi3, "
            f"smollm3, gemma2, gemma3, lfm2 and qwen35 have one)")


def untrainable_full(cfg, matrix_types) -> str | None:
    """Why full fine-tuning cannot run on this model (None: it can), besides `untrainable`'s reasons. The weights are
    the master copy the optimizer moves, so every matrix must be F32. A parameter whose gradient is not built would be
    refused here by name rather than left frozen unsaid (none is left: the Q/K/V biases' came last)."""
    quant = sorted(set(matrix_types) - {"F32"})
    if quant:
        return (f"full fine-tuning trains the weights themselves in f32, and this file's matrices are {', '.join(quant)}:"
                f" train a LoRA adapter on it, or make an F32 copy of it and train that (`lab f32-copy MODEL --out FILE`:"
                f" every tensor dequantized)")
    return None


def trained_vectors(cfg) -> list[str]:
    """The parameters full fine-tuning trains that the engine holds as vectors (ModelWeights.vectors), by the
    engine's names, in the file's order: every norm's weight (each layer's input norms, the per-head Q/K norms and the
    post-norms where the architecture has them, the final norm; qwen35's gated norm ssm_norm), the conv kernels read
    whole (lfm2's shortconv.conv.weight [n_embd, l_cache], qwen35's ssm_conv1d.weight [conv channels, l_cache],
    lab.format.model is_flat), qwen35's per-head dt bias and A (ssm_dt.bias, ssm_a) and, with qkv_bias, each layer's
    fused [q | k | v] bias (lab.ops.weights: "blk.N.attn_qkv.bias", the file's three biases side by side, in
    attn_q.bias's place); rope_freqs is a constant."""
    out = []
    for name, shape in expected_tensors(cfg).items():
        if (len(shape) == 1 and name.endswith(("norm.weight", ".ssm_dt.bias", ".ssm_a"))) or is_flat(name):
            out.append(name)
        elif name.endswith(".attn_q.bias"):
            out.append(name.removesuffix("attn_q.bias") + "attn_qkv.bias")
    return out


@dataclass(frozen=True)
class TrainScratch:
    """A step's buffers for windows of up to T tokens."""
    T: int
    saved: tuple            # per layer [T, n_embd] its input (a buffer each: no binding grows with the layers)
    mid: gpu.Buffer         # [T, n_embd] the layer's x after its mixer: the feed-forward's input
    dx: gpu.Buffer          # [T, n_embd] the loss's gradient with respect to the residual stream
    dxn: gpu.Buffer         # [T, n_embd] ... to a normed x
    dqkv: gpu.Buffer        # [T, qkv_width] ... to the fused [q | k | v] row
    datt: gpu.Buffer        # [T, max(q, ssm_inner)] ... to the attention's output (a delta-net's gated norm's)
    dgu: gpu.Buffer         # [T, 2 n_ff] ... to the [gate | up] row
    dh: gpu.Buffer          # [T, n_ff] ... to the GLU's output
    rs: gpu.Buffer          # [T, n_head] the norm backward's 1 / rms (a row's, or each head's)
    sums: gpu.Buffer        # the input gradients' partial sums (lab.ops.backward_matmul.dx_back)
    stats: gpu.Buffer       # the attention backward's per-row statistics
    targets: gpu.Buffer     # [T] u32 the next token of each position (n_vocab: none)
    one: gpu.Buffer | None = None       # [1] f32 1.0: a bias's gradient is dy^T 1 (full fine-tuning with qkv_bias)
    du: tuple = ()          # (u, du) [T, max rank] each: the LoRA backward's
    grads: gpu.Buffer | None = None     # the LoRA parameters' gradients, laid out as Lora.params
    wgrads: dict = None     # full fine-tuning: per matrix its gradient in f32 parts of the weight's rows
    vgrads: dict = None     # ... per trained vector (trained_vectors) its gradient
    qkv_pre: gpu.Buffer | None = None   # [T, qkv_width] the fused row before the per-head Q/K norms (qk_norm)
    dqkv_pre: gpu.Buffer | None = None  # [T, qkv_width] ... its gradient
    branch: gpu.Buffer | None = None    # [T, n_embd] a branch's output before its post-norm (post_norms)
    dbranch: gpu.Buffer | None = None   # [T, n_embd] ... its gradient
    dbcx: gpu.Buffer | None = None      # [T, 3 n_embd] the gradient at a short-conv layer's in_proj row [B | C | x]
    ddelta: gpu.Buffer | None = None    # [T, delta_width] ... at a delta-net layer's in-projection row
    dconv: gpu.Buffer | None = None     # [T, conv_channels] ... at its conv's output (q, k, v)
    delta: DeltaScratch | None = None   # the delta-net backward's own (lab.ops.backward_deltanet.scratch_floats)
    kept: tuple = ()        # per layer {name: buffer [T, kept_widths]}: the forward's rows its backward reads; ()
                            # where they are computed again (recomputation)

    @property
    def full(self) -> bool:
        return self.wgrads is not None

    @classmethod
    def alloc(cls, dev: gpu.Device, cfg, weights, lora: Lora | None, T: int, qkv_width: int,
              keep: bool | None = None) -> TrainScratch:
        """The buffers; `keep` the forward's rows (default: where kept_bytes is at most KEEP_BYTES). lora=None: full
        fine-tuning, a gradient for every weight (`wgrads`, `vgrads`) instead of the adapter's."""
        conv, E = gpu.CONVERSATION, cfg.n_embd
        sums = max(backward_matmul.dx_scratch_floats(w, T) for w in weights.matrices.values())
        rows = lambda n, what: dev.buffer(4 * T * n, conv, f"train {what} [T, {n}]")   # noqa: E731
        qk = {"qkv_pre": rows(qkv_width, "qkv before q/k norms"),
              "dqkv_pre": rows(qkv_width, "dqkv before q/k norms")} if cfg.qk_norm else {}
        post = {"branch": rows(E, "branch before post-norm"),
                "dbranch": rows(E, "dbranch before post-norm")} if cfg.post_norms else {}
        shortconv = {"dbcx": rows(3 * E, "dbcx")} if any(map(cfg.is_conv, range(cfg.n_layer))) else {}
        delta = {"ddelta": rows(cfg.delta_width, "d delta-net in-projection"),
                 "dconv": rows(cfg.conv_channels, "d delta-net conv out"),
                 "delta": DeltaScratch.alloc(dev, T, cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_head_dim,
                                             label="train delta-net backward")} \
            if any(map(cfg.is_delta, range(cfg.n_layer))) else {}
        saved = tuple(dev.buffer(4 * T * E, conv, f"train layer input {il} [T, {E}]") for il in range(cfg.n_layer))
        if keep is None:
            keep = kept_bytes(cfg, T) <= KEEP_BYTES
        kept = tuple({name: dev.buffer(4 * T * n, conv, f"train layer {il} kept {name} [T, {n}]")
                      for name, n in kept_widths(cfg, il).items()} for il in range(cfg.n_layer)) if keep else ()
        return cls(T=T, saved=saved, kept=kept,
                   mid=rows(E, "x mid"), dx=rows(E, "dx"), dxn=rows(E, "dxn"), dqkv=rows(qkv_width, "dqkv"),
                   datt=rows(max(cfg.q_dim, cfg.ssm_inner if delta else 0), "datt"), dgu=rows(2 * cfg.n_ff, "dgate|up"),
                   dh=rows(cfg.n_ff, "dh"), rs=rows(max(1, cfg.n_head, cfg.n_head_kv), "1/rms"),
                   sums=dev.buffer(4 * sums, conv, "train dx partial sums"), **qk, **post, **shortconv, **delta,
                   stats=dev.buffer(backward_attention.stats_bytes(T, cfg.n_head), conv, "train attention stats"),
                   targets=dev.buffer(4 * T, conv, "train targets [T] u32"), **cls._grads(dev, cfg, weights, lora, rows))

    @staticmethod
    def _grads(dev: gpu.Device, cfg, weights, lora: Lora | None, rows) -> dict:
        """The trained parameters' gradients: the adapter's (and its u, du rows), or every weight's, each matrix's in
        parts of the weight's own rows (a part within the binding limit, as the weight's)."""
        conv = gpu.CONVERSATION
        if lora is not None:
            return {"du": (rows(lora.max_rank, "lora u"), rows(lora.max_rank, "lora du")),
                    "grads": dev.buffer(4 * lora.n_params, conv, f"lora gradients [{lora.n_params}]")}
        wgrads = {name: tuple(WeightPart(dev.buffer(4 * p.n_rows * w.cols, conv, f"grad {name} rows {p.first_row}+"
                                                    f"{p.n_rows}"), p.first_row, p.n_rows) for p in w.parts)
                  for name, w in weights.matrices.items()}
        vgrads = {name: dev.buffer(weights.vectors[name].size, conv, f"grad {name}") for name in trained_vectors(cfg)}
        out = {"wgrads": wgrads, "vgrads": vgrads}
        if cfg.qkv_bias:    # a constant, not the user's data: Forget leaves it (the Trainer is closed after one)
            out["one"] = dev.buffer(4, gpu.CONSTANT, "train one [1] (a bias's gradient: dy^T 1)")
            dev.write(out["one"], struct.pack("<f", 1.0))
        return out


class Backward(Prefill):
    """The training step's ops for an engine (prefill plans of at least T rows, an f32 KV cache, the LoRA adapter
    set on it), the scratch `ts` and the fused head `ce` (lab.ops.backward_head.head_ce for T rows).
    rows_total: the positions with a target in the whole step (all its windows), the loss's divisor; loss_params: the
    loss's uniform (lab.ops.backward_head.loss_params) when the caller rewrites that divisor a step (masked windows).
    pooled: no head and no next-token loss; the loss's gradient at the final norm's output (`ts.dxn`, t rows) is
    the caller's, written before the step runs (a contrastive loss over pooled embeddings: lab.instruments
    .contrastive), and the step's backward starts from it."""

    def __init__(self, engine, ts: TrainScratch, ce: backward_head.HeadCE | None, rows_total: int,
                 pooled: bool = False, loss_params: gpu.Buffer | None = None) -> None:
        super().__init__(engine)
        self.ts, self.ce, self.rows_total, self.pooled = ts, ce, rows_total, pooled
        self.loss_params = loss_params
        self.T = ts.T

    @property
    def max_rows(self) -> int:
        """A window's T rows, not the engine's step: the projections the backward computes again write rows of T
        (ts.qkv_pre, ts.branch) on engines whose steps run more."""
        return self.T

    def loss_ops(self) -> list[ops.Op]:
        """The forward and the loss alone (held-out windows: nothing is kept, no gradient taken)."""
        cfg, s = self.cfg, self.scratch
        blocks = self.eng.blocks
        blocks.embedding.build(self)
        for il in range(cfg.n_layer):
            blocks.mixers[il].build(self, il)
            blocks.ffn_of(il).build(self, il)
        self.add(norm.rms_norm(self.dev, self.kernels, s.x, self.weights.vectors[cfg.output_norm], s.xn, s.step,
                               cfg.n_embd, cfg.eps))
        self.add(backward_head.head_loss(self.dev, self.kernels, self.ce, s.xn, self.ts.targets, s.step,
                                         rows_total=self.rows_total, params=self.loss_params))
        return self.plan.ops

    def step_ops(self) -> list[ops.Op]:
        cfg, s, ts, E = self.cfg, self.scratch, self.ts, self.cfg.n_embd
        blocks = self.eng.blocks
        blocks.embedding.build(self)
        for il in range(cfg.n_layer):
            self.add(elementwise.copy_rows(self.dev, self.kernels, s.x, ts.saved[il], s.step, E))
            blocks.mixers[il].build(self, il)
            self._keep(il, (*blocks.mixers[il].kept(cfg, il), "mid"))
            blocks.ffn_of(il).build(self, il)
            self._keep(il, tuple(blocks.ffn_of(il).kept(cfg, il)))
        self._head()
        for il in reversed(range(cfg.n_layer)):
            if ts.kept:
                self._keep(il, tuple(kept_widths(cfg, il)), back=True)
            else:
                self.restore(il)
                blocks.mixers[il].build(self, il)
                self.add(elementwise.copy_rows(self.dev, self.kernels, s.x, ts.mid, s.step, E))
                blocks.ffn_of(il).build(self, il)
            blocks.ffn_of(il).build_backward(self, il)
            blocks.mixers[il].build_backward(self, il)
        if ts.full:     # dx is the loss's gradient at the embedding's output now: into the table's rows of the ids
            self.add(embed_back(self.dev, self.kernels, ts.wgrads[self.weights.embedding.name], E, s.ids, ts.dx,
                                s.step, scale=cfg.embd_scale))
        return self.plan.ops

    def _keep(self, il: int, names: tuple, back: bool = False) -> None:
        """Copy layer il's rows `names` (kept_widths) aside (the forward), or back where its backward reads them (into
        the scratch's fields, "mid" into ts.mid). Nothing where the step recomputes."""
        if not self.ts.kept:
            return
        widths = kept_widths(self.cfg, il)
        for name in names:
            if name == "mid":               # x after the attention: the scratch's x now, ts.mid for the backward
                live = self.ts.mid if back else self.scratch.x
            else:
                live = getattr(self.scratch, name)
            aside = self.ts.kept[il][name]
            src, dst = (aside, live) if back else (live, aside)
            self.add(elementwise.copy_rows(self.dev, self.kernels, src, dst, self.scratch.step, widths[name]))

    def _head(self) -> None:
        """The final norm, the loss and its gradient into dx (the residual stream's, written); pooled: the norm's
        backward alone, from the caller's dxn."""
        cfg, s, ts = self.cfg, self.scratch, self.ts
        w = self.weights.vectors[cfg.output_norm]
        if not self.pooled:
            self.add(norm.rms_norm(self.dev, self.kernels, s.x, w, s.xn, s.step, cfg.n_embd, cfg.eps))
            self.add(backward_head.head_loss(self.dev, self.kernels, self.ce, s.xn, ts.targets, s.step,
                                             rows_total=self.rows_total, params=self.loss_params))
            self.add(backward_head.head_back(self.dev, self.kernels, self.ce, s.xn, ts.targets, ts.dxn, s.step,
                                             dw=ts.wgrads[self.weights.head.name] if ts.full else None))
        self.add(rms_norm_back(self.dev, self.kernels, s.x, w, ts.dxn, ts.dx, self.vgrad(cfg.output_norm), ts.rs,
                               s.step, cfg.n_embd, cfg.eps))

    def vgrad(self, name: str) -> gpu.Buffer | None:
        """A trained vector's gradient buffer in full fine-tuning (None: the vector is not trained)."""
        return self.ts.vgrads[name] if self.ts.full else None

    # -- what the blocks' backward uses -------------------------------------------------------------------------
    def restore(self, il: int) -> None:
        """x = layer il's saved input."""
        E = self.cfg.n_embd
        self.add(elementwise.copy_rows(self.dev, self.kernels, self.ts.saved[il], self.scratch.x, self.scratch.step, E))

    def proj_back(self, name: str, x: gpu.Buffer, dy: gpu.Buffer, dx: gpu.Buffer, *, dy_offset: int = 0,
                  dy_stride: int | None = None, accumulate: bool = False) -> None:
        """Projection `name` (input rows x, compact) given its output's gradient dy: dx (+)= W^T dy through the base
        as stored, and, where the adapter names it, its factors' gradients and their share of dx; in full
        fine-tuning (ts.full) the weight's own gradient, dW += dy^T x."""
        w, ts = self.weights.matrices[name], self.ts
        self.add(backward_matmul.dx_back(self.dev, self.kernels, w, dy, dx, ts.sums, self.scratch.step,
                                         max_tokens=self.T, accumulate=accumulate, dy_offset=dy_offset,
                                         dy_stride=dy_stride))
        if ts.full:
            self.add(backward_matmul.dw_back(self.dev, self.kernels, ts.wgrads[name], w.cols, x, dy,
                                             self.scratch.step, max_tokens=self.T, dy_offset=dy_offset,
                                             dy_stride=dy_stride))
        if self.lora is None:
            return
        ys = dy_stride or w.rows
        for member, pieces in lora_members(name, self.weights.tensors, self.starts):
            if member not in self.lora.targets:
                continue
            t, p, g = self.lora.targets[member], self.lora.params, ts.grads
            self.add(backward_matmul.lora_back(self.dev, self.kernels, ((p, t.a), (p, t.b)), ((g, t.a), (g, t.b)),
                                               ts.du, x, dy, dx, self.scratch.step, n_in=t.n_in, n_out=t.n_out,
                                               rank=t.rank, scale=self.lora.scale(member), max_tokens=self.T,
                                               dy_offset=dy_offset, dy_stride=ys,
                                               pieces=[(q.row, q.at, q.rows) for q in pieces]))

    def stacked_back(self, key: str, x: gpu.Buffer, dy: gpu.Buffer, width: int, dx: gpu.Buffer) -> None:
        """The fused projections `key` (rows of `width` floats of dy, each part from its column): dx written."""
        for i, (w, col) in enumerate(self.weights.stacked[key]):
            self.proj_back(w.name, x, dy, dx, dy_offset=col, dy_stride=width, accumulate=i > 0)

    def bias_back(self, name: str, dy: gpu.Buffer, width: int) -> None:
        """In full fine-tuning, the fused bias `name`'s gradient: += the column sums of dy (rows of `width` floats, the
        gradient at the biased projection's output) over the step's tokens. Nothing in LoRA training (a constant)."""
        if self.ts.full:
            self.add(backward_matmul.bias_back(self.dev, self.kernels, self.ts.vgrads[name], self.ts.one, dy,
                                               self.scratch.step, width=width, max_tokens=self.T))

    def branch_back(self, name: str, x: gpu.Buffer, post_norm: str) -> gpu.Buffer:
        """The gradient at the output of a branch's projection `name` (input rows x): dx itself, or, where the config
        has post-norms, through the post-norm `post_norm` of the projection's output, computed again (ts.branch)."""
        cfg, ts = self.cfg, self.ts
        if not cfg.post_norms:
            return ts.dx
        self.add(self.mm(name, x, ts.branch))
        self.add(rms_norm_back(self.dev, self.kernels, ts.branch, self.weights.vectors[post_norm], ts.dx, ts.dbranch,
                               self.vgrad(post_norm), ts.rs, self.scratch.step, cfg.n_embd, cfg.eps))
        return ts.dbranch

    def norm_back(self, x: gpu.Buffer, weight: str, dxn: gpu.Buffer) -> None:
        """dx += the gradient through RMSNorm of x (compact rows of n_embd) by `weight`, given dxn."""
        cfg, ts = self.cfg, self.ts
        self.add(rms_norm_back(self.dev, self.kernels, x, self.weights.vectors[weight], dxn, ts.dx,
                               self.vgrad(weight), ts.rs, self.scratch.step, cfg.n_embd, cfg.eps, accumulate=True))
