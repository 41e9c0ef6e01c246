"""The attention block: x -> norm -> the fused projection row [q | k | v] (plus a gate) -> RoPE -> the KV cache ->
attention -> the output projection, added to x. It owns the projection rows and each layer's K and V cache.

Its variants are the Config's: Q/K biases (`qkv_bias`), per-head Q/K norms (`qk_norm`), V normed without a weight
(`v_norm`), layers without RoPE (`rotates`), a gate on each head's output (`attn_gate`), post-norms (`post_norms`),
per-layer head sizes and KV heads, sliding windows, soft-capped scores, and layers that read an earlier layer's
cache (`has_kv`, `kv_source`).

Traced: attn_norm-L, Qcur_rope-L, Kcur_rope-L, Vcur-L (Vcur_normed-L), kqv_out-L, attn_gated-L (with a gate),
attn_post_norm-L (with post-norms), ffn_inp-L.
"""

from __future__ import annotations

from lab import gpu, ops
from lab.engine.blocks.base import Block
from lab.format.config import Config
from lab.ops import attention as attn_ops
from lab.ops import backward, backward_attention, backward_rope, elementwise, norm, rope


def qkv_width(cfg: Config, il: int) -> int:
    """Floats of layer il's projection row: [q | k | v] (| gate where attn_gate), in the layer's own sizes (they may
    differ by layer); Q alone on a layer that reads an earlier layer's K/V."""
    q = cfg.q_dim_of(il)
    return q + (2 * cfg.kv_dim_of(il) if cfg.has_kv(il) else 0) + (q if cfg.attn_gate else 0)


class Attention(Block):
    kv_fields = ("k_cache", "v_cache")

    def alloc(self, dev, n_ctx, B, kv):
        cfg, conv = self.cfg, gpu.CONVERSATION
        W = max(qkv_width(cfg, il) for il in range(cfg.n_layer))     # the widest projection row of a layer
        # a cache per layer with K/V of its own (a shared-KV layer reads an earlier layer's)
        cached = tuple(il for il in self.layers if cfg.has_kv(il))
        sizes = {il: attn_ops.kv_cache_bytes(n_ctx, cfg.n_head_kv_of(il), cfg.head_dim_of(il), kv) for il in cached}
        own = Block(cfg, cached)
        return {"qkv": dev.buffer(4 * B * W, conv, "qkv [B, q + 2 kv]" + (" + gate" if cfg.attn_gate else "")),
                "qkv_width": W,
                "k_cache": own.per_layer(lambda il: dev.buffer(sizes[il], conv, f"k cache {il} [n_ctx, kv]")),
                "v_cache": own.per_layer(lambda il: dev.buffer(sizes[il], conv, f"v cache {il} [n_ctx, kv]"))}

    def op(self, eng, il: int, batched: bool, probe: gpu.Buffer | None = None, whole: bool = False) -> list[ops.Op]:
        """Layer il's attention over the cache (role ATTENTION), as Engine.attention_op hands it to the plans and the
        probes."""
        cfg, s = self.cfg, eng.scratch
        src = cfg.kv_source(il)     # a shared-KV layer attends an earlier layer's cache
        software = eng.device.info.software
        return attn_ops.attention(eng.device, eng.kernels, s.qkv, s.k_cache[src], s.v_cache[src], s.att,
                                  s.step, n_head=cfg.n_head, n_kv_head=cfg.n_head_kv_of(il),
                                  head_dim=cfg.head_dim_of(il), q_stride=qkv_width(cfg, il), q_offset=0,
                                  n_ctx=eng.n_ctx, scale=cfg.attn_scale,
                                  window=cfg.sliding_window if cfg.sliding[il] else 0, softcap=cfg.attn_softcap,
                                  probe=probe, mode="prefill" if batched else "whole" if whole else "decode",
                                  kv=eng.kv_type,
                                  # split-K decode and narrow prefill tiles feed a GPU's many cores; a CPU
                                  # adapter pays per workgroup, so there the keys stay in one chunk and the
                                  # tiles wide (measured on lavapipe: narrow tiles made prefill attention 4x slower)
                                  chunk=eng.n_ctx if software else None, narrow=not software)

    def build(self, p, il):
        """Projection and norms, RoPE with the cache write, attention, its gate, the output projection."""
        cfg, s = self.cfg, p.scratch
        Q, KV, W = cfg.q_dim_of(il), cfg.kv_dim_of(il), qkv_width(cfg, il)
        b = f"blk.{il}."
        base = cfg.rope_base_local if cfg.sliding[il] else cfg.rope_base
        fused = p.qkv_rope(il, base) if cfg.rotates(il) else None
        p.add_normed(p.normed_proj(b + "qkv", b + "attn_norm.weight", s.qkv, W,
                                   b + "attn_qkv.bias" if cfg.qkv_bias else None, fused), f"attn_norm-{il}")
        self._norms(p, il)
        self._rope(p, il, base, fused)
        if cfg.has_kv(il):
            p.trace(f"Kcur_rope-{il}", s.qkv, KV, W, Q)
            p.trace(f"Vcur_normed-{il}" if cfg.v_norm else f"Vcur-{il}", s.qkv, KV, W, Q + KV)
        p.add(p.eng.attention_op(il, p.batched), f"kqv_out-{il}", s.att, Q)
        if cfg.attn_gate:   # times sigmoid of the gate half of each head's Q rows, last in the fused row
            p.add(elementwise.sigmoid_gate(p.dev, p.kernels, s.att, s.qkv, s.step, Q, W, Q + 2 * KV),
                  f"attn_gated-{il}", s.att, Q)
        # the output projection; the residual add is folded into it unless a post-norm sits between
        p.residual(b + "attn_output.weight", s.att, "post_attention_norm.weight", il, f"attn_post_norm-{il}",
                   f"ffn_inp-{il}")

    def _norms(self, p, il: int) -> None:
        """The per-head Q and K norms (each part with its own weight), and V's norm without a weight (times ones)."""
        cfg, s, vec = self.cfg, p.scratch, p.weights.vectors
        Q, KV, W, HD, own = cfg.q_dim_of(il), cfg.kv_dim_of(il), qkv_width(cfg, il), cfg.head_dim_of(il), cfg.has_kv(il)
        b = f"blk.{il}."
        if cfg.qk_norm and own:     # over the adjacent Q and K heads
            p.add(norm.rms_norm(p.dev, p.kernels, s.qkv, vec[b + "attn_q_norm.weight"], s.qkv, s.step, Q + KV,
                                cfg.eps, group=HD, in_stride=W, in_offset=0,
                                w2=vec[b + "attn_k_norm.weight"], split=cfg.n_head))
        elif cfg.qk_norm:
            p.add(norm.rms_norm(p.dev, p.kernels, s.qkv, vec[b + "attn_q_norm.weight"], s.qkv, s.step, Q, cfg.eps,
                                group=HD, in_stride=W, in_offset=0))
        if cfg.v_norm and own:
            p.add(norm.rms_norm(p.dev, p.kernels, s.qkv, vec[f"ones.{HD}"], s.qkv, s.step, KV, cfg.eps, group=HD,
                                in_stride=W, in_offset=Q + KV))

    def _rope(self, p, il: int, base: float, fused) -> None:
        """Q and K rotated and the K and V rows written into the cache (role KV_WRITE): by the projection's own
        epilogue (`fused`), by one rope op, or, on a layer without RoPE, by a plain cache write."""
        cfg, s, eng = self.cfg, p.scratch, p.eng
        Q, KV, W, own = cfg.q_dim_of(il), cfg.kv_dim_of(il), qkv_width(cfg, il), cfg.has_kv(il)
        # rope_freqs: on every layer, or (rope_freqs_full) on the full layers only
        factors = None if cfg.rope_freqs_full and cfg.sliding[il] else eng.rope_freqs
        if fused is not None:   # the projection left Q and K rotated and wrote the cache
            p.trace(f"Qcur_rope-{il}", s.qkv, Q, W, 0)
        elif not cfg.rotates(il):
            # NoPE layers: Q and K stay as projected (the traced names keep "_rope" for one name per layer kind:
            # here the step is the identity), K and V go to the cache as they are
            p.add(attn_ops.kv_write(p.dev, p.kernels, s.qkv, s.k_cache[il], s.v_cache[il], s.step,
                                    n_kv_head=cfg.n_head_kv, head_dim=cfg.head_dim, src_stride=W, k_offset=Q,
                                    v_offset=Q + KV, n_ctx=eng.n_ctx, kv=eng.kv_type, label=f"kv_write {il}"),
                  f"Qcur_rope-{il}", s.qkv, Q, W, 0)
        else:
            # Q heads then K heads are adjacent in the fused row: one rope op rotates both, and writes the
            # rotated K and the V into the cache
            p.add(rope.rope(p.dev, p.kernels, s.qkv, s.step, cfg.n_head + (cfg.n_head_kv_of(il) if own else 0),
                            cfg.head_dim_of(il), cfg.n_rot_of(il), base, cfg.rope_scale,
                            mode="neox" if cfg.rope_neox else "adjacent", row_stride=W, col_offset=0,
                            freq_factors=factors,
                            cache=(s.k_cache[il], s.v_cache[il], cfg.n_head, eng.n_ctx) if own else None,
                            kv=eng.kv_type),
                  f"Qcur_rope-{il}", s.qkv, Q, W, 0)

    @staticmethod
    def kept(cfg, il):
        """The fused row [q | k | v] with Q and K rotated, and the attention's output."""
        return {"qkv": qkv_width(cfg, il), "att": cfg.q_dim_of(il)}

    def build_backward(self, q, il):
        """Given dx (the loss's gradient after the attention's residual add), right after `build` recomputed the
        layer (the fused row with Q and K rotated, the cache, the attention's output): the output projection, the
        output gate (attn_gate: the attention's output computed again before it), attention, RoPE, the fused
        projection and the norm, dx then holding the gradient at the layer's input.
        The layers training refuses (lab.engine.backward.untrainable) are not handled here."""
        cfg, s, ts, eng = self.cfg, q.scratch, q.ts, q.eng
        Q, KV, W, HD = cfg.q_dim_of(il), cfg.kv_dim_of(il), qkv_width(cfg, il), cfg.head_dim_of(il)
        nkv, b = cfg.n_head_kv_of(il), f"blk.{il}."
        dy = q.branch_back(b + "attn_output.weight", s.att, b + "post_attention_norm.weight")
        q.proj_back(b + "attn_output.weight", s.att, dy, ts.datt)
        if cfg.attn_gate:   # the attention's output before its gate (the forward gated att in place), then the gate's
            q.add(eng.attention_op(il, True))       # backward: datt at the attention's output, dgate into the row
            q.add(backward.sigmoid_gate_back(q.dev, q.kernels, ts.datt, s.att, s.qkv, ts.dqkv, s.step, Q, W,
                                             Q + 2 * KV))
        q.add(backward_attention.attention_back(
            q.dev, q.kernels, (s.qkv, 0, W), (s.k_cache[il], 0, KV), (s.v_cache[il], 0, KV), (s.att, 0, Q),
            (ts.datt, 0, Q), (ts.dqkv, 0, W), (ts.dqkv, Q, W), (ts.dqkv, Q + KV, W), ts.stats, s.step,
            n_head=cfg.n_head, n_kv_head=nkv, head_dim=HD, n_ctx=q.T, max_tokens=q.T, scale=cfg.attn_scale,
            window=cfg.sliding_window if cfg.sliding[il] else 0, softcap=cfg.attn_softcap, label=f"{b}attention_back"))
        if cfg.rotates(il):
            factors = None if cfg.rope_freqs_full and cfg.sliding[il] else eng.rope_freqs
            q.add(backward_rope.rope_back(q.dev, q.kernels, ts.dqkv, s.step, cfg.n_head + nkv, HD, cfg.n_rot_of(il),
                                          cfg.rope_base_local if cfg.sliding[il] else cfg.rope_base, cfg.rope_scale,
                                          mode="neox" if cfg.rope_neox else "adjacent", row_stride=W, col_offset=0,
                                          freq_factors=factors))
        # the normed input, which the feed-forward's norm overwrote: the saved x through the norm again
        q.restore(il)
        q.add(norm.rms_norm(q.dev, q.kernels, s.x, q.weights.vectors[b + "attn_norm.weight"], s.xn, s.step,
                            cfg.n_embd, cfg.eps))
        grad = self._qk_norm_back(q, il) if cfg.qk_norm else ts.dqkv
        if cfg.qkv_bias:    # added at the projection's output, before the norms and RoPE: grad is its gradient too
            q.bias_back(b + "attn_qkv.bias", grad, W)
        q.stacked_back(b + "qkv", s.xn, grad, W, ts.dxn)
        q.norm_back(s.x, b + "attn_norm.weight", ts.dxn)

    def _qk_norm_back(self, q, il: int):
        """Through the per-head Q and K norms: the fused row before them computed again from xn (ts.qkv_pre), the
        gradient row copied (V's part passes as it is) and its Q and K heads replaced by their gradients before the
        norms. Returns the gradient row at the projection's output."""
        cfg, s, ts, vec = self.cfg, q.scratch, q.ts, q.weights.vectors
        Q, KV, W, HD, b = cfg.q_dim_of(il), cfg.kv_dim_of(il), qkv_width(cfg, il), cfg.head_dim_of(il), f"blk.{il}."
        for w, col in q.weights.stacked[b + "qkv"]:
            q.add(q.mm(w.name, s.xn, ts.qkv_pre, y_offset=col, y_stride=W))
        if cfg.qkv_bias:
            q.add(elementwise.add_bias(q.dev, q.kernels, ts.qkv_pre, vec[b + "attn_qkv.bias"], s.step, W, stride=W,
                                       offset=0))
        q.add(elementwise.copy_rows(q.dev, q.kernels, ts.dqkv, ts.dqkv_pre, s.step, W))
        for weight, n, at in (("attn_q_norm.weight", Q, 0), ("attn_k_norm.weight", KV, Q)):
            q.add(backward.rms_norm_back(q.dev, q.kernels, ts.qkv_pre, vec[b + weight], ts.dqkv, ts.dqkv_pre,
                                         q.vgrad(b + weight), ts.rs, s.step, n, cfg.eps, group=HD, stride=W,
                                         offset=at))
        return ts.dqkv_pre
