"""The numpy forward pass: the oracle the GPU engine is checked against (CPython only).

Follows llama.cpp's graph builders op for op (src/models/llama.cpp, qwen2.cpp, qwen3.cpp, phi3.cpp,
gemma2.cpp, gemma3.cpp, lfm2.cpp and
llm_graph_context::build_norm / build_ffn / build_attn in src/llama-graph.cpp), on weights
dequantized by gguf-py, in float32 (or float64: `Reference(path, dtype=np.float64)`).
The ops themselves (RMSNorm, RoPE, softmax, the activations, the mask) are ops.py's, the same the kernels'
references use.

Trace names (`ref.trace`, filled when `forward(..., trace=True)`; `ref.trace_order` lists them in
the order they were computed). They are llama.cpp's eval-callback (cb_eval) names with "-{il}" for
layer il; where llama.cpp gives two tensors one name, the second gets a suffix here. Checked
against llama.cpp's own callback tensors on an all-F32 GGUF: every one agrees to ~1e-6 relative
(gemma3's FFN to 2e-4: llama.cpp's CPU GELU is a float16 table). llama.cpp's tensors are ggml
[ne0, ne1, ...], i.e. these shapes reversed, and its kq_soft_max has n_kv padded to a multiple of
256 with zeros. Shapes are for t new tokens and n_kv = start_pos + t cached positions:

    inp_embd            [t, n_embd]     token_embd rows
    inp_scaled          [t, n_embd]     gemma3 only: inp_embd * sqrt(n_embd)
    attn_norm-il        [t, n_embd]     RMSNorm(x) * attn_norm.weight (lfm2: "model.layers.{}.operator_norm-il")
    Qcur-il             [t, n_head*hd]  x @ Wq.T (+ bq)       (llama.cpp: "Qcur" before RoPE)
    Kcur-il             [t, n_kv_head*hd]
    Vcur-il             [t, n_kv_head*hd_v]
    Qcur_normed-il      [t, n_head, hd] gemma3 only: per-head RMSNorm * attn_q_norm.weight
    Kcur_normed-il      [t, n_kv_head, hd]
    Qcur_rope-il        [t, n_head, hd] after RoPE            (llama.cpp names this "Qcur" too)
    Kcur_rope-il        [t, n_kv_head, hd]
    kq_soft_max-il      [n_head, t, n_kv] attention probabilities (masked entries exactly 0)
    kqv_out-il          [t, n_head*hd_v] heads merged, before Wo
    attn_out-il         [t, n_embd]     after Wo (+ bo)
    attn_post_norm-il   [t, n_embd]     gemma3 only
    ffn_inp-il          [t, n_embd]     residual after attention (gemma3: llama.cpp's "sa_out"; lfm2: unnamed there)
  lfm2's short-conv layers, in place of Qcur .. attn_out (llama.cpp's names in quotes, "{}" as it writes it):
    shortconv_bcx-il    [t, 3 n_embd]   in_proj rows [B | C | x]           ("model.layers.{}.conv.in_proj-il")
    shortconv_conv-il   [t, n_embd]     the depthwise causal conv of B*x over [state; B*x] ("model.layers.{}.conv.conv")
    shortconv_y-il      [t, n_embd]     C * conv, out_proj's input (no name there)
    shortconv_out-il    [t, n_embd]     after out_proj                     ("model.layers.{}.conv.out_proj-il")
    ffn_norm-il         [t, n_embd]
    ffn_swiglu-il       [t, n_ff]       the GLU's output, ffn_down's input (ffn_geglu-il for GeGLU models)
    ffn_out-il          [t, n_embd]     FFN output before the residual add
    ffn_post_norm-il    [t, n_embd]     gemma3 only
  a routed layer (mixtures of experts), in place of ffn_swiglu:
    ffn_moe_logits-il   [t, n_expert]   the router's logits
    ffn_moe_probs-il    [t, n_expert]   softmax or sigmoid of them
    ffn_moe_weights_norm-il [t, k]      the chosen experts' probabilities over their sum, in the order chosen
    ffn_moe_out-il      [t, n_embd]     the weighted sum of the chosen experts' outputs (llama.cpp: ffn_moe_out)
    l_out-il            [t, n_embd]     residual after the layer
    result_norm         [t, n_embd]
    result_output       [t, n_vocab]    logits (after softcapping, if the model has it)

API:
    ref = Reference(path)                     # ref.hp: Hparams, ref.w: Weights (lazy dequantized)
    logits = ref.forward(ids)                 # prefill from position 0, all positions, [t, n_vocab]
    logits = ref.forward(more, start_pos=n)   # continue: keeps cache[:n], appends `more`
    logits = ref.forward(ids, all_logits=False)   # last position only, [1, n_vocab]
    ref.greedy(ids, n) -> list[int]           # n greedy tokens after ids (argmax, ties -> lowest id)
    ref.logit_lens(ids) -> (top_ids [n_layer, t], top_probs [n_layer, t])
    ref.neighbours(token_id, k=10) -> (ids [k], cosine [k])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lab.host.reference.ops import (
    argmax,
    causal_conv,
    gated_delta_rule,
    gelu_tanh,
    l2_norm,
    rms_norm,
    rope,
    route,
    sigmoid,
    silu,
    softcap,
    softmax,
    softplus,
    visible,
)
from lab.host.reference.weights import Hparams, Weights


class Reference:
    """numpy forward pass of a GGUF model (llama, qwen2, qwen3, phi3, gemma2, gemma3, lfm2) with a KV cache, lfm2's
    conv states, and a trace."""

    def __init__(self, path: str | Path, dtype=np.float32):
        """dtype: float32 (default) or float64, for the dequantized weights and every activation."""
        self.w = Weights(path, dtype=dtype)
        self.hp = Hparams.from_weights(self.w)
        self.dtype = np.dtype(dtype)
        self.trace: dict[str, np.ndarray] = {}
        self.trace_order: list[str] = []
        self._trace_on = False
        self._k: list[np.ndarray] = []     # per layer [n_kv_head, n_ctx, hd] (post-RoPE)
        self._v: list[np.ndarray] = []
        self.n_past = 0
        self._emb_norm: np.ndarray | None = None
        # name -> fn(x) -> x: an intervention at a traced point (kqv_out-L, ffn_swiglu-L / ffn_geglu-L, l_out-L), the
        # numpy side of lab/instruments/interventions.py (lab/host/reference/interventions.py builds them)
        self.hooks: dict = {}
        self.reset()

    # -- helpers --------------------------------------------------------------------------------
    def reset(self) -> None:
        hp = self.hp
        # gemma4: each layer its own KV heads and head size (head_dim_of is head_dim_v there: llama.cpp requires it)
        self._k = [np.zeros((hp.n_head_kv_of(il), 0, hp.head_dim_of(il)), self.dtype) for il in range(hp.n_layer)]
        self._v = [np.zeros((hp.n_head_kv_of(il), 0, hp.head_dim_of(il) if hp.head_dim_swa else hp.head_dim_v),
                            self.dtype) for il in range(hp.n_layer)]
        # per conv layer the last l_cache - 1 rows of the conv's input, zero before position 0: lfm2's B*x
        # [l_cache - 1, n_embd], qwen35's q, k, v [l_cache - 1, 2 key dims + value dims]
        channels = hp.n_embd
        if hp.delta_layers:
            channels = (2 * hp.ssm_k_heads + hp.ssm_v_heads) * hp.ssm_head_dim
        self._conv = [np.zeros((max(hp.l_cache - 1, 0), channels), self.dtype) for _ in range(hp.n_layer)]
        # qwen35: per delta-net layer the recurrent state [v heads, d_k, d_v], zero before position 0
        d = hp.ssm_head_dim
        self._state = [np.zeros((hp.ssm_v_heads, d, d), self.dtype) for _ in range(hp.n_layer)]
        self.n_past = 0

    def _cb(self, name: str, x: np.ndarray) -> np.ndarray:
        """Record x under `name` when tracing; returns x, or what the hook for `name` makes of it (`hooks`)."""
        hook = self.hooks.get(name)
        if hook is not None:
            x = np.asarray(hook(x), dtype=x.dtype)
        if self._trace_on:
            self.trace[name] = np.array(x, copy=True)
            self.trace_order.append(name)
        return x

    def _lw(self, il: int, name: str) -> np.ndarray | None:
        return self.w.maybe(f"blk.{il}.{name}")

    @property
    def output_name(self) -> str:
        """output.weight, or token_embd.weight when the head is tied (no output.weight in the file:
        llama.cpp then creates `output` from token_embd, TENSOR_DUPLICATED)."""
        return "output.weight" if "output.weight" in self.w else "token_embd.weight"

    def _head(self, x: np.ndarray) -> np.ndarray:
        """result_norm -> logits: output projection (+ final softcapping)."""
        logits = self._mm(x, self.output_name)
        return softcap(logits, self.hp.final_softcap) if self.hp.final_softcap else logits

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W.T for the GGUF tensor `name` (W dequantized, (out, in))."""
        return x @ self.w.get(name).T

    def _linear(self, x: np.ndarray, il: int, name: str) -> np.ndarray:
        """blk.{il}.{name}.weight (+ .bias when the file has one)."""
        y = self._mm(x, f"blk.{il}.{name}.weight")
        b = self._lw(il, f"{name}.bias")
        return y + b if b is not None else y

    def _residual(self, il: int, cur: np.ndarray, inp: np.ndarray, post_norm: str, norm_name: str,
                  out_name: str) -> np.ndarray:
        """inp + cur, with cur through the layer's post-norm first where the model has one (gemma3)."""
        if self.hp.post_norms:
            cur = rms_norm(cur, self._lw(il, post_norm), self.hp.eps)
            self._cb(f"{norm_name}-{il}", cur)
        return self._cb(f"{out_name}-{il}", cur + inp)

    def _mask(self, il: int, pos_q: np.ndarray, n_kv: int) -> np.ndarray:
        """True where query (row) may attend key (col): causal, plus the sliding window on SWA layers."""
        return visible(pos_q, n_kv, self.hp.n_swa if self.hp.is_swa(il) else 0)

    # -- the forward pass -----------------------------------------------------------------------
    def forward(self, ids, start_pos: int | None = None, trace: bool = False,
                all_logits: bool = True, keep_dtype: bool = False, normed: bool = False) -> np.ndarray:
        """Logits [t, n_vocab] for every position of `ids` (causal), float32 (keep_dtype=True: in the reference's
        dtype, for float64 oracles whose differences a float32 rounding would swamp: training's).

        start_pos None or 0 starts fresh; start_pos = n keeps the first n cached positions and
        appends. trace=True records the intermediate tensors in self.trace (see the module doc).
        all_logits=False computes the head for the last position only ([1, n_vocab]), like
        llama.cpp's inp_out_ids: the trace's result_norm / result_output then hold that row only.
        normed=True: result_norm's rows [t, n_embd] instead of logits, in the reference's dtype, no head computed (an
        embedding's oracle: lab/host/reference/contrastive.py)."""
        hp, dt = self.hp, self.dtype
        ids = np.asarray(list(ids), dtype=np.int64)
        t = len(ids)
        if t == 0:
            raise ValueError("forward: no tokens")
        if ids.min() < 0 or ids.max() >= hp.n_vocab:
            raise ValueError(f"forward: token id out of range [0, {hp.n_vocab})")
        start = 0 if start_pos is None else int(start_pos)
        if start > self.n_past:
            raise ValueError(f"forward: start_pos {start} is past the cache ({self.n_past} positions)")
        if any(hp.is_conv(il) or hp.is_delta(il) for il in range(hp.n_layer)):
            if start == 0:
                self.reset()
            elif start != self.n_past:
                # a conv or recurrent state holds what came before n_past: it cannot be cut back like a KV cache
                raise ValueError(f"forward: {hp.arch} continues at {self.n_past} or starts at 0, not at {start}")
        self._trace_on = trace
        if trace:
            self.trace = {}
            self.trace_order = []
        pos = np.arange(start, start + t)
        n_kv = start + t
        rep = hp.n_head // hp.n_head_kv

        x = self.w.rows("token_embd.weight", ids)
        self._cb("inp_embd", x)
        if hp.embed_scale != 1.0:
            x = x * dt.type(hp.embed_scale)
            self._cb("inp_scaled", x)
        if hp.arch == "gemma4":
            x = self._gemma4(ids, x, pos, start)
            return self._finish(x, n_kv, all_logits, keep_dtype, normed)

        for il in range(hp.n_layer):
            inp = x
            cur = rms_norm(x, self._lw(il, "attn_norm.weight"), hp.eps)
            self._cb(f"attn_norm-{il}", cur)
            if hp.is_conv(il):
                x = self._feed_forward(il, self._cb(f"ffn_inp-{il}", self._shortconv(il, cur) + inp))
                continue
            if hp.is_delta(il):
                x = self._feed_forward(il, self._cb(f"ffn_inp-{il}", self._delta(il, cur) + inp))
                continue

            if f"blk.{il}.attn_qkv.weight" in self.w:      # phi3: one fused projection, rows [q | k | v]
                qkv = self._linear(cur, il, "attn_qkv")
                nq, nk = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
                q, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
            else:
                q = self._linear(cur, il, "attn_q")
                k = self._linear(cur, il, "attn_k")
                v = self._linear(cur, il, "attn_v")
            if hp.attn_gate:    # qwen35: each head's rows are [q | gate]
                qg = q.reshape(t, hp.n_head, 2 * hp.head_dim)
                q = np.ascontiguousarray(qg[:, :, :hp.head_dim]).reshape(t, -1)
                gate = np.ascontiguousarray(qg[:, :, hp.head_dim:]).reshape(t, -1)
            self._cb(f"Qcur-{il}", q)
            self._cb(f"Kcur-{il}", k)
            self._cb(f"Vcur-{il}", v)
            q = q.reshape(t, hp.n_head, hp.head_dim)
            k = k.reshape(t, hp.n_head_kv, hp.head_dim)
            v = v.reshape(t, hp.n_head_kv, hp.head_dim_v)
            if hp.qk_norm:
                q = rms_norm(q, self._lw(il, "attn_q_norm.weight"), hp.eps)
                k = rms_norm(k, self._lw(il, "attn_k_norm.weight"), hp.eps)
                self._cb(f"Qcur_normed-{il}", q)
                self._cb(f"Kcur_normed-{il}", k)
            if hp.rotates(il):          # smollm3's NoPE layers keep Q and K as they are
                base = hp.rope_base_for(il)
                q = rope(q, pos, hp.n_rot, base, hp.rope_type, hp.rope_scale, hp.rope_factors)
                k = rope(k, pos, hp.n_rot, base, hp.rope_type, hp.rope_scale, hp.rope_factors)
            self._cb(f"Qcur_rope-{il}", q)
            self._cb(f"Kcur_rope-{il}", k)

            # KV cache: [n_kv_head, n_kv, hd]
            kt, vt = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
            K = np.concatenate([self._k[il][:, :start], kt], axis=1)
            V = np.concatenate([self._v[il][:, :start], vt], axis=1)
            self._k[il], self._v[il] = K, V

            # scores [n_head, t, n_kv]; query head h reads kv head h // rep (ggml_mul_mat broadcast)
            qh = q.transpose(1, 0, 2)                                         # [n_head, t, hd]
            Kr = np.repeat(K, rep, axis=0) if rep > 1 else K
            Vr = np.repeat(V, rep, axis=0) if rep > 1 else V
            kq = np.matmul(qh, Kr.transpose(0, 2, 1)) * dt.type(hp.attn_scale)
            if hp.attn_softcap:      # gemma2 (build_attn_mha: scale, tanh, scale back)
                kq = softcap(kq, hp.attn_softcap)
            mask = self._mask(il, pos, n_kv)
            kq = np.where(mask[None], kq, -np.inf)
            p = softmax(kq, axis=-1).astype(dt)
            self._cb(f"kq_soft_max-{il}", p)
            o = np.matmul(p, Vr)                                              # [n_head, t, hd_v]
            o = o.transpose(1, 0, 2).reshape(t, hp.n_head * hp.head_dim_v)
            o = self._cb(f"kqv_out-{il}", o)
            if hp.attn_gate:
                o = self._cb(f"attn_gated-{il}", o * sigmoid(gate))
            cur = self._linear(o, il, "attn_output")
            self._cb(f"attn_out-{il}", cur)
            ffn_inp = self._residual(il, cur, inp, "post_attention_norm.weight", "attn_post_norm", "ffn_inp")
            x = self._feed_forward(il, ffn_inp)

        return self._finish(x, n_kv, all_logits, keep_dtype, normed)

    def _finish(self, x: np.ndarray, n_kv: int, all_logits: bool, keep_dtype: bool = False,
                normed: bool = False) -> np.ndarray:
        """The last layer's output -> result_norm -> logits (the last row only unless all_logits)."""
        hp, dt = self.hp, self.dtype
        self.n_past = n_kv
        if not all_logits:
            x = x[-1:]
        x = rms_norm(x, self.w.get(hp.output_norm), hp.eps)
        self._cb("result_norm", x)
        if normed:
            self._trace_on = False
            return x
        logits = self._head(x)
        self._cb("result_output", logits)
        self._trace_on = False
        return np.asarray(logits, dtype=np.float32) if dt != np.float32 and not keep_dtype else logits

    def _per_layer_inputs(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """gemma4's per-layer inputs [n_layer, t, per-layer width] (build_inp_per_layer + project_per_layer_inputs):
        the token's rows of per_layer_token_embd times sqrt(width), plus the scaled embedding projected by
        per_layer_model_proj times 1/sqrt(n_embd) and RMS-normed per layer slice (per_layer_proj_norm), the sum
        times 1/sqrt(2)."""
        hp, dt = self.hp, self.dtype
        t, n, w = len(ids), hp.n_layer, hp.n_embd_per_layer
        sel = self.w.rows("per_layer_token_embd.weight", ids).reshape(t, n, w) * dt.type(np.sqrt(np.float32(w)))
        self._cb("inp_per_layer_selected", sel)
        proj = (self._mm(x, "per_layer_model_proj.weight") * dt.type(1.0 / np.sqrt(np.float32(hp.n_embd))))
        proj = rms_norm(proj.reshape(t, n, w), self.w.get("per_layer_proj_norm.weight"), hp.eps)
        self._cb("per_layer_proj", proj)
        inp = self._cb("inp_per_layer", (proj + sel) * dt.type(1.0 / np.sqrt(np.float32(2.0))))
        return np.ascontiguousarray(inp.transpose(1, 0, 2))

    def _gemma4(self, ids: np.ndarray, x: np.ndarray, pos: np.ndarray, start: int) -> np.ndarray:
        """gemma4's blocks (src/models/gemma4.cpp), x the scaled embedding [t, n_embd]; returns the last l_out.
        Per block: attention with the layer's own head size, RoPE and K/V (or an earlier layer's: kv_source), its
        post-norm and residual; the GeGLU FFN, its post-norm and residual (pe_in); the per-layer embedding (GELU of
        inp_gate, times this layer's per-layer input, proj, post_norm) added; times layer_output_scale."""
        hp, dt = self.hp, self.dtype
        t = len(ids)
        per_layer = self._per_layer_inputs(ids, x) if "per_layer_token_embd.weight" in self.w else None
        for il in range(hp.n_layer):
            inp = x
            cur = self._cb(f"attn_norm-{il}", rms_norm(x, self._lw(il, "attn_norm.weight"), hp.eps))
            hd, n_kv_head, swa = hp.head_dim_of(il), hp.n_head_kv_of(il), hp.is_swa(il)
            base, n_rot = hp.rope_base_for(il), hp.n_rot_of(il)
            factors = None if swa else hp.rope_factors   # rope_freqs: the full layers' proportional RoPE only
            q = self._cb(f"Qcur-{il}", self._mm(cur, f"blk.{il}.attn_q.weight")).reshape(t, hp.n_head, hd)
            q = self._cb(f"Qcur_normed-{il}", rms_norm(q, self._lw(il, "attn_q_norm.weight"), hp.eps))
            q = self._cb(f"Qcur_rope-{il}", rope(q, pos, n_rot, base, hp.rope_type, 1.0, factors))
            src = hp.kv_source(il)
            if src == il:
                k = self._cb(f"Kcur-{il}", self._mm(cur, f"blk.{il}.attn_k.weight")).reshape(t, n_kv_head, hd)
                # no attn_v (attention_k_eq_v): V is K's projection, before K's norm and RoPE
                v_name = f"blk.{il}.attn_v.weight" if f"blk.{il}.attn_v.weight" in self.w else f"blk.{il}.attn_k.weight"
                v = self._cb(f"Vcur-{il}", self._mm(cur, v_name)).reshape(t, n_kv_head, hd)
                k = self._cb(f"Kcur_normed-{il}", rms_norm(k, self._lw(il, "attn_k_norm.weight"), hp.eps))
                v = self._cb(f"Vcur_normed-{il}", rms_norm(v, None, hp.eps))
                k = self._cb(f"Kcur_rope-{il}", rope(k, pos, n_rot, base, hp.rope_type, 1.0, factors))
                self._k[il] = np.concatenate([self._k[il][:, :start], k.transpose(1, 0, 2)], axis=1)
                self._v[il] = np.concatenate([self._v[il][:, :start], v.transpose(1, 0, 2)], axis=1)
            elif hp.is_swa(src) != swa or hp.head_dim_of(src) != hd:
                raise ValueError(f"gemma4: layer {il} would read layer {src}'s K/V, a layer of the other kind")
            K, V = self._k[src], self._v[src]                                  # [n_kv_head, n_kv, hd]
            rep = hp.n_head // K.shape[0]
            Kr = np.repeat(K, rep, axis=0) if rep > 1 else K
            Vr = np.repeat(V, rep, axis=0) if rep > 1 else V
            kq = np.matmul(q.transpose(1, 0, 2), Kr.transpose(0, 2, 1)) * dt.type(hp.attn_scale)
            kq = np.where(self._mask(il, pos, K.shape[1])[None], kq, -np.inf)
            p = self._cb(f"kq_soft_max-{il}", softmax(kq, axis=-1).astype(dt))
            o = np.matmul(p, Vr).transpose(1, 0, 2).reshape(t, hp.n_head * hd)
            o = self._cb(f"kqv_out-{il}", o)
            cur = self._cb(f"attn_out-{il}", self._mm(o, f"blk.{il}.attn_output.weight"))
            ffn_inp = self._residual(il, cur, inp, "post_attention_norm.weight", "attn_post_norm", "ffn_inp")
            x = self._feed_forward(il, ffn_inp, out_name="pe_in")
            if per_layer is not None:
                g = gelu_tanh(self._mm(x, f"blk.{il}.inp_gate.weight")) * per_layer[il]
                y = rms_norm(self._mm(g, f"blk.{il}.proj.weight"), self._lw(il, "post_norm.weight"), hp.eps)
                self._cb(f"per_layer_embd_out-{il}", y)
                x = x + y
            scale = self._lw(il, "layer_output_scale.weight")
            if scale is not None:
                x = x * scale
            x = self._cb(f"l_out-{il}", x)
        return x

    def _shortconv(self, il: int, cur: np.ndarray) -> np.ndarray:
        """lfm2's short-conv block (build_shortconv_block): in_proj to [B | C | x]; B*x; the depthwise causal conv
        of l_cache taps over [state; B*x] (ggml_ssm_conv: output j = sum_i w[:, i] * seq[j + i], the last tap on the
        token itself); C * conv; out_proj. The state becomes the last l_cache - 1 rows of [state; B*x]."""
        e = self.hp.n_embd
        bcx = self._cb(f"shortconv_bcx-{il}", self._mm(cur, f"blk.{il}.shortconv.in_proj.weight"))
        b, c, xx = bcx[:, :e], bcx[:, e:2 * e], bcx[:, 2 * e:]
        seq = np.concatenate([self._conv[il], b * xx], axis=0)            # [l_cache - 1 + t, n_embd]
        w = self.w.get(f"blk.{il}.shortconv.conv.weight")                 # [n_embd, l_cache]
        taps, t = w.shape[1], len(cur)
        conv = sum(seq[i:i + t] * w[:, i] for i in range(taps))
        self._conv[il] = seq[t:].copy()
        self._cb(f"shortconv_conv-{il}", conv)
        y = self._cb(f"shortconv_y-{il}", c * conv)
        return self._cb(f"shortconv_out-{il}", self._mm(y, f"blk.{il}.shortconv.out_proj.weight"))

    def _delta(self, il: int, cur: np.ndarray) -> np.ndarray:
        """qwen35's gated delta-net layer (build_layer_attn_linear): the projections of q k v, z, beta and alpha; the
        depthwise causal conv over [state; q k v] (ggml_ssm_conv) and SiLU; q and k L2-normed per head; the
        recurrence (ggml_gated_delta_net) with g = softplus(alpha + dt_bias) * A and beta = sigmoid(beta); the output
        RMS-normed per head times silu(z); ssm_out. The conv state becomes the last l_cache - 1 rows of the conv's
        input, the recurrent state the recurrence's last."""
        hp, t = self.hp, len(cur)
        b = f"blk.{il}."
        d, hk, hv = hp.ssm_head_dim, hp.ssm_k_heads, hp.ssm_v_heads
        qkv = self._cb(f"linear_attn_qkv_mixed-{il}", self._mm(cur, b + "attn_qkv.weight"))
        z = self._cb(f"z-{il}", self._mm(cur, b + "attn_gate.weight"))
        beta = sigmoid(self._mm(cur, b + "ssm_beta.weight"))
        g = softplus(self._mm(cur, b + "ssm_alpha.weight") + self.w.get(b + "ssm_dt.bias")) * self.w.get(b + "ssm_a")
        seq = np.concatenate([self._conv[il], qkv], axis=0)             # [l_cache - 1 + t, channels]
        conv = silu(causal_conv(seq, self.w.get(b + "ssm_conv1d.weight"), t))
        self._conv[il] = seq[t:].copy()
        self._cb(f"conv_output_silu-{il}", conv)
        kd = hk * d
        q = l2_norm(conv[:, :kd].reshape(t, hk, d), hp.eps)
        k = l2_norm(conv[:, kd:2 * kd].reshape(t, hk, d), hp.eps)
        v = conv[:, 2 * kd:].reshape(t, hv, d)
        o, self._state[il] = gated_delta_rule(q, k, v, g, beta, self._state[il])
        out = rms_norm(o, self.w.get(b + "ssm_norm.weight"), hp.eps) * silu(z.reshape(t, hv, d))
        out = self._cb(f"final_output-{il}", out.reshape(t, hv * d))
        return self._cb(f"linear_attn_out-{il}", self._mm(out, b + "ssm_out.weight"))

    def _feed_forward(self, il: int, ffn_inp: np.ndarray, out_name: str = "l_out") -> np.ndarray:
        """ffn_norm (qwen35: post_attention_norm) -> the GLU -> ffn_down, added to ffn_inp (through gemma's post-norm):
        l_out-il."""
        hp = self.hp
        cur = rms_norm(ffn_inp, self._lw(il, hp.ffn_norm), hp.eps)
        self._cb(f"ffn_norm-{il}", cur)
        if hp.routed(il):
            cur = self._cb(f"ffn_moe_out-{il}", self._experts(il, cur))
            return self._residual(il, cur, ffn_inp, "post_ffw_norm.weight", "ffn_post_norm", out_name)
        if f"blk.{il}.ffn_gate.weight" in self.w:
            gate = self._linear(cur, il, "ffn_gate")
            up = self._linear(cur, il, "ffn_up")
        else:       # phi3: ffn_up holds [gate | up]; ggml_swiglu puts the FIRST half through SiLU
            gate, up = np.split(self._linear(cur, il, "ffn_up"), 2, axis=-1)
        act = silu(gate) if hp.ffn_act == "silu" else gelu_tanh(gate)
        glu = self._cb(f"{'ffn_swiglu' if hp.ffn_act == 'silu' else 'ffn_geglu'}-{il}", act * up)
        cur = self._linear(glu, il, "ffn_down")
        self._cb(f"ffn_out-{il}", cur)
        return self._residual(il, cur, ffn_inp, "post_ffw_norm.weight", "ffn_post_norm", out_name)

    def _experts(self, il: int, cur: np.ndarray) -> np.ndarray:
        """build_moe_ffn (src/llama-graph.cpp): the router's logits, the gating, the top n_expert_used experts (the
        selection bias exp_probs_b chooses, never weighs), their weights renormalised; each chosen expert's
        down(silu(gate . x) * (up . x)) times its weight, summed in the order chosen."""
        hp, b = self.hp, f"blk.{il}."
        logits = self._cb(f"ffn_moe_logits-{il}", self._mm(cur, b + "ffn_gate_inp.weight"))
        ids, w, probs = route(logits, hp.gating, hp.n_expert_used, self._lw(il, "exp_probs_b.bias"))
        self._cb(f"ffn_moe_probs-{il}", probs)
        ids = self._cb(f"ffn_moe_topk-{il}", ids)
        # the weights the sum takes: an "expert" intervention's hook (lab/host/reference/interventions.py) zeroes or
        # scales the chosen expert's here, the others not renormalised
        w = self._cb(f"ffn_moe_weights_norm-{il}", w)
        gate, up, down = (self.w.get(b + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        out = np.zeros_like(cur)
        for t in range(cur.shape[0]):
            for s, e in enumerate(ids[t]):
                h = silu(gate[e] @ cur[t]) * (up[e] @ cur[t])
                out[t] += w[t, s] * (down[e] @ h)
        return out

    # -- generation and the lab panels ----------------------------------------------------------
    def greedy(self, ids, n: int, stop: set[int] | None = None) -> list[int]:
        """n greedy tokens after `ids`: prefill, then one token at a time through the KV cache.
        argmax ties go to the lowest id. Stops early after a token in `stop` (it is included)."""
        logits = self.forward(list(ids), all_logits=False)
        out: list[int] = []
        while len(out) < n:
            nxt = argmax(logits[-1])
            out.append(nxt)
            if len(out) == n or (stop and nxt in stop):
                break
            logits = self.forward([nxt], start_pos=self.n_past)
        return out

    def logit_lens(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """Each layer's residual (l_out-il) through the final norm and the output head: the top-1
        token id and its softmax probability, both [n_layer, t]. The last layer's row is the
        model's own prediction. Runs a traced forward from position 0 (replaces trace and cache)."""
        ids = list(ids)
        self.forward(ids, trace=True)
        hp = self.hp
        norm_w = self.w.get("output_norm.weight")
        top_ids = np.zeros((hp.n_layer, len(ids)), np.int64)
        top_p = np.zeros((hp.n_layer, len(ids)), np.float32)
        rows = np.arange(len(ids))
        for il in range(hp.n_layer):
            logits = self._head(rms_norm(self.trace[f"l_out-{il}"], norm_w, hp.eps)).astype(np.float64)
            i = argmax(logits)
            top_ids[il] = i
            top_p[il] = 1.0 / np.sum(np.exp(logits - logits[rows, i][:, None]), axis=-1)
        return top_ids, top_p

    def neighbours(self, token_id: int, k: int = 10, include_self: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The k tokens whose input embeddings (token_embd rows) have the highest cosine similarity
        with token_id's: (ids [k], similarities [k]), best first; the token itself is left out
        unless include_self."""
        e = self.w.get("token_embd.weight")
        if self._emb_norm is None:
            self._emb_norm = np.sqrt(np.einsum("ij,ij->i", e, e, dtype=np.float64))
        tid = int(token_id)
        if not 0 <= tid < len(e):
            raise ValueError(f"neighbours: token id {tid} out of range")
        sim = (e @ e[tid]).astype(np.float64) / np.maximum(self._emb_norm * self._emb_norm[tid], 1e-30)
        if not include_self:
            sim[tid] = -np.inf
        k = min(k, len(sim) - (0 if include_self else 1))
        top = np.argpartition(-sim, k - 1)[:k]
        top = top[np.lexsort((top, -sim[top]))]
        return top, sim[top].astype(np.float32)
