"""The two step plans of an engine: `Prefill` (t tokens through matmuls) and `Decode` (one token through matvecs).

Both run the same layer sequence, written once in `PlanBuilder.build`; each subclass says only how its kind of
step projects, feeds the GLU, attends and picks the rows of the output head. Decode folds what it can into its
matvecs (the RMSNorm before a projection, the GLU before the down projection, the biases after QKV, and the RoPE
rotation, adjacent or NeoX pairs, with the KV write after QKV), because a decode step on a GPU is bound by the
number of dependent kernels, not by bytes (docs/performance.md).

Every plan records `Traced` points under llama.cpp's eval-callback names (attn_norm-0, kqv_out-3, l_out-29, ...),
the names lab/host/reference/forward.py traces and the panels key their data by. An lfm2 short-conv layer takes the
place of attention with attn_norm-L, shortconv_bcx-L (in_proj's [B | C | x]), shortconv_y-L (C * conv, out_proj's
input) and ffn_inp-L; its conv state is read and written by the one shortconv op, in prefill and decode alike. A
qwen35 delta-net layer records attn_norm-L, linear_attn_qkv_mixed-L (the in-projection's q, k, v), conv_output_silu-L,
final_output-L (the gated norm of the recurrence's output, ssm_out's input) and ffn_inp-L; its conv and recurrent
states are each read and written by one op. A qwen35 attention layer adds attn_gated-L (the output after its
sigmoid gate).

What it does not know: files, tokens, sessions. It reads the engine's weights and scratch buffers, and builds ops.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from lab import gpu, ops
from lab.engine.scratch import conv_ring, qkv_width
from lab.ops import attention as attn_ops
from lab.ops import deltanet, elementwise, embed, glu, matmul, norm, rope, sample, shortconv
from lab.ops.rows import Rows
from lab.settings import MAX_CANDIDATES


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


class PlanBuilder:
    batched: bool

    def __init__(self, engine) -> None:
        self.eng = engine
        self.cfg = engine.cfg
        self.dev = engine.device
        self.kernels = engine.kernels
        self.scratch = engine.scratch
        self.weights = engine.weights
        self.plan = Plan()

    # -- recording ------------------------------------------------------------------------------------------
    def add(self, op_list, name=None, buf=None, width=0, stride=None, offset=0, rows="tokens") -> None:
        self.plan.ops.extend(op_list)
        if name:
            self.trace(name, buf, width, stride, offset, rows)

    def trace(self, name, buf, width, stride=None, offset=0, rows="tokens") -> None:
        """Record `name` as complete after the last op added so far."""
        self.plan.trace.append(Traced(name, len(self.plan.ops) - 1, buf, width, stride or width, offset, rows))

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
        """Embedding, then each layer's attention (or short-conv) and feed-forward blocks, then the output: the whole
        step."""
        self._embedding()
        if self.cfg.n_embd_per_layer:
            self._per_layer_inputs()
        for il in range(self.cfg.n_layer):
            if self.cfg.is_conv(il):
                self._shortconv(il)
            elif self.cfg.is_delta(il):
                self._delta(il)
            else:
                self._attention(il)
            self._feed_forward(il)
            if self.cfg.block_tail:
                self._block_tail(il)
        self._output()
        return self.plan

    def _embedding(self) -> None:
        # inp_embd: token rows, scaled by sqrt(n_embd) for gemma3
        cfg, s = self.cfg, self.scratch
        self.add(embed.get_rows(self.dev, self.kernels, self.weights.embedding, s.ids, s.x, s.step,
                                scale=cfg.embd_scale),
                 "inp_embd" if cfg.embd_scale == 1.0 else "inp_scaled", s.x, cfg.n_embd)

    def _per_layer_inputs(self) -> None:
        """gemma4's per-layer inputs, once a step (project_per_layer_inputs): the token's rows of per_layer_token_embd
        times sqrt(width), plus the scaled embedding through per_layer_model_proj times 1/sqrt(n_embd), RMS-normed per
        layer slice (per_layer_proj_norm); the sum times 1/sqrt(2). Layer il reads its slice in _block_tail."""
        cfg, dev, kernels, s = self.cfg, self.dev, self.kernels, self.scratch
        P = cfg.n_embd_per_layer
        N = cfg.n_layer * P
        self.add(embed.get_rows(dev, kernels, self.weights.per_layer_embedding, s.ids, s.per_layer,
                                s.step, scale=math.sqrt(P)), "inp_per_layer_selected", s.per_layer, N)
        self.add(self.mm("per_layer_model_proj.weight", s.x, s.per_layer_proj))
        self.add(elementwise.scale(dev, kernels, s.per_layer_proj, s.step, N, 1.0 / math.sqrt(cfg.n_embd)))
        self.add(norm.rms_norm(dev, kernels, s.per_layer_proj, self.weights.vectors["per_layer_proj_norm.weight"],
                               s.per_layer_proj, s.step, N, cfg.eps, group=P, residual=s.per_layer),
                 "per_layer_proj", s.per_layer_proj, N)
        self.add(elementwise.scale(dev, kernels, s.per_layer, s.step, N, 1.0 / math.sqrt(2.0)),
                 "inp_per_layer", s.per_layer, N)

    def _block_tail(self, il: int) -> None:
        """What a gemma4 block adds after its FFN's residual (pe_in): the per-layer embedding, GELU of inp_gate times
        this layer's slice of the per-layer inputs -> proj -> post_norm, added to x; then x times layer_output_scale."""
        cfg, dev, kernels, s = self.cfg, self.dev, self.kernels, self.scratch
        E, P, b = cfg.n_embd, cfg.n_embd_per_layer, f"blk.{il}."
        if P:
            self.add(self.mm(b + "inp_gate.weight", s.x, s.gate_up))
            self.add(glu.glu(dev, kernels, s.gate_up, s.per_layer, s.h, s.step, P, act="geglu",
                             up_stride=cfg.n_layer * P, up_offset=il * P))
            self.add(self.mm(b + "proj.weight", s.h, s.tmp))
            self.add(norm.rms_norm(dev, kernels, s.tmp, self.weights.vectors[b + "post_norm.weight"], s.tmp, s.step, E,
                                   cfg.eps, residual=s.x), f"per_layer_embd_out-{il}", s.tmp, E)
        if il in self.eng.out_scale:
            self.add(elementwise.scale(dev, kernels, s.x, s.step, E, self.eng.out_scale[il]))
        self.trace(f"l_out-{il}", s.x, E)

    def _attention(self, il: int) -> None:
        """Layer il's attention block: x -> norm -> q, k, v (fused row [q | k | v], bias) -> rope -> cache ->
        attention -> output projection, added to x. gemma4: the layer's own head size, KV heads and rotated dims; V
        RMS-normed without a weight; a shared-KV layer projects and rotates Q alone and attends an earlier layer's
        cache (Engine.attention_op)."""
        cfg, dev, kernels, s, vec = self.cfg, self.dev, self.kernels, self.scratch, self.weights.vectors
        E, Q, KV, W, HD = cfg.n_embd, cfg.q_dim_of(il), cfg.kv_dim_of(il), qkv_width(cfg, il), cfg.head_dim_of(il)
        own = cfg.has_kv(il)
        b = f"blk.{il}."
        base = cfg.rope_base_local if cfg.sliding[il] else cfg.rope_base
        fused = self.qkv_rope(il, base) if cfg.rotates(il) else None
        self._add_normed(self.normed_proj(b + "qkv", b + "attn_norm.weight", s.qkv, W,
                                          b + "attn_qkv.bias" if cfg.qkv_bias else None, fused), f"attn_norm-{il}")
        if cfg.qk_norm and own:     # per head over the adjacent Q and K heads, each part with its own weight
            self.add(norm.rms_norm(dev, kernels, s.qkv, vec[b + "attn_q_norm.weight"], s.qkv, s.step, Q + KV,
                                   cfg.eps, group=HD, in_stride=W, in_offset=0,
                                   w2=vec[b + "attn_k_norm.weight"], split=cfg.n_head))
        elif cfg.qk_norm:
            self.add(norm.rms_norm(dev, kernels, s.qkv, vec[b + "attn_q_norm.weight"], s.qkv, s.step, Q, cfg.eps,
                                   group=HD, in_stride=W, in_offset=0))
        if cfg.v_norm and own:      # gemma4: V RMS-normed per head, without a weight (times ones)
            self.add(norm.rms_norm(dev, kernels, s.qkv, vec[f"ones.{HD}"], s.qkv, s.step, KV, cfg.eps, group=HD,
                                   in_stride=W, in_offset=Q + KV))
        # rope_freqs: llama 3's on every layer; gemma4's (proportional RoPE) on its full layers only
        factors = None if cfg.rope_freqs_full and cfg.sliding[il] else self.eng.rope_freqs
        if fused is not None:   # the projection left Q and K rotated and wrote the cache (role KV_WRITE)
            self.trace(f"Qcur_rope-{il}", s.qkv, Q, W, 0)
        elif not cfg.rotates(il):
            # smollm3's NoPE layers: Q and K stay as projected (the traced names keep "_rope" for one name per
            # layer kind: here the step is the identity), K and V go to the cache as they are (role KV_WRITE)
            self.add(attn_ops.kv_write(dev, kernels, s.qkv, s.k_cache[il], s.v_cache[il], s.step,
                                       n_kv_head=cfg.n_head_kv, head_dim=cfg.head_dim, src_stride=W, k_offset=Q,
                                       v_offset=Q + KV, n_ctx=self.eng.n_ctx, kv=self.eng.kv_type,
                                       label=f"kv_write {il}"),
                     f"Qcur_rope-{il}", s.qkv, Q, W, 0)
        else:
            # Q heads then K heads are adjacent in the fused row: one rope op rotates both, and writes the
            # rotated K and the V into the cache (role KV_WRITE).
            self.add(rope.rope(dev, kernels, s.qkv, s.step, cfg.n_head + (cfg.n_head_kv_of(il) if own else 0), HD,
                               cfg.n_rot_of(il), base, cfg.rope_scale, mode="neox" if cfg.rope_neox else "adjacent",
                               row_stride=W, col_offset=0, freq_factors=factors,
                               cache=(s.k_cache[il], s.v_cache[il], cfg.n_head, self.eng.n_ctx) if own else None,
                               kv=self.eng.kv_type),
                     f"Qcur_rope-{il}", s.qkv, Q, W, 0)
        if own:
            self.trace(f"Kcur_rope-{il}", s.qkv, KV, W, Q)
            self.trace(f"Vcur_normed-{il}" if cfg.v_norm else f"Vcur-{il}", s.qkv, KV, W, Q + KV)
        self.add(self.eng.attention_op(il, self.batched), f"kqv_out-{il}", s.att, Q)
        if cfg.attn_gate:   # qwen35: times sigmoid of the gate half of each head's Q rows, last in the fused row
            self.add(elementwise.sigmoid_gate(dev, kernels, s.att, s.qkv, s.step, Q, W, Q + 2 * KV),
                     f"attn_gated-{il}", s.att, Q)
        # output projection; the residual add is folded into it unless gemma3's post-norm sits between
        if cfg.post_norms:
            self.add(self.mm(b + "attn_output.weight", s.att, s.tmp))
            self.add(norm.rms_norm(dev, kernels, s.tmp, vec[b + "post_attention_norm.weight"], s.tmp, s.step, E,
                                   cfg.eps, residual=s.x), f"attn_post_norm-{il}", s.tmp, E)
            self.trace(f"ffn_inp-{il}", s.x, E)
        else:
            self.add(self.mm(b + "attn_output.weight", s.att, s.x, accumulate=True), f"ffn_inp-{il}", s.x, E)

    def _shortconv(self, il: int) -> None:
        """lfm2's short-conv block in place of attention: x -> norm -> in_proj [B | C | x] -> C * conv(B * x) over the
        conv state (read and written by the one op) -> out_proj, added to x."""
        cfg, s = self.cfg, self.scratch
        E = cfg.n_embd
        b = f"blk.{il}."
        self._add_normed(self.normed_proj(b + "in_proj", b + "attn_norm.weight", s.bcx, 3 * E, None), f"attn_norm-{il}")
        self.trace(f"shortconv_bcx-{il}", s.bcx, 3 * E)
        self.add(shortconv.shortconv(self.dev, self.kernels, s.bcx, self.weights.vectors[b + "shortconv.conv.weight"],
                                     s.conv_state[il], s.att, s.step, n=E, l_cache=cfg.l_cache, ring=conv_ring(cfg),
                                     label=f"shortconv {il}"),
                 f"shortconv_y-{il}", s.att, E)
        self.add(self.mm(b + "shortconv.out_proj.weight", s.att, s.x, accumulate=True), f"ffn_inp-{il}", s.x, E)

    def _delta(self, il: int) -> None:
        """qwen35's gated delta-net layer in place of attention (llama.cpp build_layer_attn_linear): x -> norm -> the
        in-projection row [q k v | z | beta | alpha] -> silu(conv(q k v)) over the conv state -> the recurrence over
        the delta-net state (q, k L2-normed; decay from alpha, dt's bias and A; beta's gate), its output RMS-normed and
        gated by silu(z) (one op) -> ssm_out, added to x."""
        cfg, s, vec = self.cfg, self.scratch, self.weights.vectors
        E, C, V, H, W = cfg.n_embd, cfg.conv_channels, cfg.ssm_inner, cfg.ssm_v_heads, cfg.delta_width
        b = f"blk.{il}."
        self._add_normed(self.normed_proj(b + "delta_in", b + "attn_norm.weight", s.delta_in, W, None),
                         f"attn_norm-{il}")
        self.trace(f"linear_attn_qkv_mixed-{il}", s.delta_in, C, W)
        self.add(shortconv.shortconv(self.dev, self.kernels, s.delta_in, vec[b + "ssm_conv1d.weight"],
                                     s.conv_state[il], s.delta_conv, s.step, n=C, l_cache=cfg.l_cache,
                                     ring=conv_ring(cfg), mode="silu", stride=W, label=f"delta conv {il}"),
                 f"conv_output_silu-{il}", s.delta_conv, C)
        self.add(deltanet.deltanet(self.dev, self.kernels, s.delta_in, s.delta_conv, vec[b + "ssm_dt.bias"],
                                   vec[b + "ssm_a"], vec[b + "ssm_norm.weight"], s.recurrent[il], s.att, s.step,
                                   n_k_heads=cfg.ssm_k_heads, n_v_heads=H, head_dim=cfg.ssm_head_dim, proj_stride=W,
                                   z_offset=C, beta_offset=C + V, alpha_offset=C + V + H, eps=cfg.eps,
                                   label=f"deltanet {il}"),
                 f"final_output-{il}", s.att, V)
        self.add(self.mm(b + "ssm_out.weight", s.att, s.x, accumulate=True), f"ffn_inp-{il}", s.x, E)

    def _feed_forward(self, il: int) -> None:
        """Layer il's feed-forward block: norm -> gate|up (fused row) -> (silu|gelu)(gate) * up -> down, added to x."""
        cfg, s = self.cfg, self.scratch
        E, FF = cfg.n_embd, cfg.n_ff_of(il)
        b = f"blk.{il}."
        self._add_normed(self.normed_proj(b + "gate_up", b + cfg.ffn_norm, s.gate_up, 2 * FF, None),
                         f"ffn_norm-{il}")
        down_in, down_opts = self.glu_then("geglu" if cfg.gelu else "swiglu", FF)
        if down_in is s.h:      # the GLU ran as its own op (prefill; decode's widest FFNs): its output is a site
            self.trace(f"{'ffn_geglu' if cfg.gelu else 'ffn_swiglu'}-{il}", s.h, FF)
        if cfg.post_norms:
            self.add(self.mm(b + "ffn_down.weight", down_in, s.tmp, **down_opts), f"ffn_out-{il}", s.tmp, E)
            self.add(norm.rms_norm(self.dev, self.kernels, s.tmp, self.weights.vectors[b + "post_ffw_norm.weight"],
                                   s.tmp, s.step, E, cfg.eps, residual=s.x), f"ffn_post_norm-{il}", s.tmp, E)
            # gemma4's block goes on (_block_tail): the residual here is what llama.cpp calls pe_in
            self.trace(f"{'pe_in' if cfg.block_tail else 'l_out'}-{il}", s.x, E)
        else:
            self.add(self.mm(b + "ffn_down.weight", down_in, s.x, accumulate=True, **down_opts), f"l_out-{il}", s.x, E)

    def _output(self) -> None:
        """The final norm, the head (soft-capped for gemma2), and the tails that pick the next token from it."""
        cfg, dev, kernels, s = self.cfg, self.dev, self.kernels, self.scratch
        # The head keeps its own norm op: folded in, each of its n_vocab / 4 workgroups would re-read x.
        self.add(norm.rms_norm(dev, kernels, s.x, self.weights.vectors[cfg.output_norm], s.xn, s.step,
                               cfg.n_embd, cfg.eps),
                 "result_norm", s.xn, cfg.n_embd)
        per_token = self.head()
        if cfg.final_softcap:   # gemma2: logits = c * tanh(logits / c), before the tail picks a token
            self.add(elementwise.softcap(dev, kernels, s.logits, s.step, cfg.n_vocab, cfg.final_softcap,
                                         rows=0 if per_token else 1))
        # the logits as the tail reads them: complete after the head and its soft-cap
        self.trace("result_output", s.logits, cfg.n_vocab, rows="tokens" if per_token else "one")
        # The tail picks the next token (from the last token's row where the head left one per token): greedy's
        # argmax lands in ids[0], ready to be the next decode step's input; sampling reads back the top-k
        # candidates instead (the top-k pass costs 13% of a decode step on lavapipe, so greedy plans leave it out).
        rows = Rows.last() if per_token else Rows.fixed(1)
        self.plan.tails = Tails(
            greedy=sample.argmax(dev, kernels, s.logits, s.ids, s.step, cfg.n_vocab, rows=rows),
            sampled=sample.top_k(dev, kernels, s.logits, s.topk, s.step, cfg.n_vocab, MAX_CANDIDATES, rows=rows))

    def _add_normed(self, op_lists, name) -> None:
        self.add(op_lists[0], name, self.scratch.xn, self.cfg.n_embd)
        for o in op_lists[1:]:
            self.add(o)


GLU_APART = 8192        # decode: FFNs at least this wide run their GLU as its own op (Decode.glu_then)


class Prefill(PlanBuilder):
    """t tokens: a norm op, matmuls, a bias op, a GLU op; the head on the last row (every row for logits_all)."""
    batched = True

    def mm(self, name, x, y, *, y_offset=0, y_stride=None, accumulate=False):
        w, s = self.weights.matrices[name], self.scratch
        if self.eng.int8_prefill and w.type.name in matmul.I8_TYPES:
            return matmul.matmul_i8(self.dev, self.kernels, w, x, y, s.step, s.xq, s.xd,
                                    max_tokens=self.eng.max_batch, accumulate=accumulate, y_offset=y_offset,
                                    y_stride=y_stride)
        return matmul.matmul(self.dev, self.kernels, w, x, y, s.step, max_tokens=self.eng.max_batch,
                             accumulate=accumulate, y_offset=y_offset, y_stride=y_stride)

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
        return matmul.matvec(self.dev, self.kernels, self.weights.matrices[name], x, y, self.scratch.step,
                             y_offset=y_offset, accumulate=accumulate, **fused)

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
        if cfg.qk_norm or cfg.n_rot // 2 > rope.MAX_FUSED_PAIRS \
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
        if n_ff >= GLU_APART:
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
