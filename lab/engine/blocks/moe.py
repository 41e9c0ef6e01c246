"""The routed feed-forward of a mixture-of-experts layer (llama.cpp's build_moe_ffn): norm -> the router's logits ->
gating and the top k experts with their weights renormalised (lab.ops.moe.route) -> each chosen expert's [gate | up]
row -> SwiGLU -> its down projection -> the weighted sum, added to x. It owns the router's and the experts' rows.

Buffers (B rows of a step, k experts a token, pair q = token * k + slot):
    moe_logits  [B, n_expert]           the router's logits (traced as ffn_moe_logits-L)
    moe_ids     [B, k] u32              the chosen experts, in the order chosen
    moe_w       [B, k]                  their weights (traced as ffn_moe_weights_norm-L)
    moe_gu      [B * k, 2 n_ff_exp]     each pair's [gate | up] row
    moe_down    [B * k, n_embd]         each pair's expert output, before its weight
Traced names: ffn_norm-L, ffn_moe_logits-L, ffn_moe_topk-L (the chosen experts, u32), ffn_moe_weights_norm-L, l_out-L
(the sum goes straight into x: no ffn_moe_out row of its own). The experiments' "expert" site splices its op after
`route` (lab/instruments/interventions.py), where ffn_moe_weights_norm-L is complete.

What it does not know: which layers route (Config.routed), the experts' types (lab.ops.moe reads each).
"""

from __future__ import annotations

from lab import gpu
from lab.engine.blocks.base import Block
from lab.ops import moe


class RoutedFeedForward(Block):
    def alloc(self, dev, n_ctx, B, kv):
        cfg, conv = self.cfg, gpu.CONVERSATION
        E, k, ff = cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp
        return {"moe_logits": dev.buffer(4 * B * E, conv, "router logits [B, n_expert]"),
                "moe_ids": dev.buffer(4 * B * k, conv, "chosen experts [B, k] u32"),
                "moe_w": dev.buffer(4 * B * k, conv, "expert weights [B, k]"),
                "moe_gu": dev.buffer(4 * B * k * 2 * ff, conv, "experts' gate|up [B k, 2 n_ff_exp]"),
                "moe_down": dev.buffer(4 * B * k * cfg.n_embd, conv, "experts' outputs [B k, n_embd]")}

    def build(self, p, il):
        cfg, s, w = self.cfg, p.scratch, p.weights
        E, k, ff, n, b = cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_embd, f"blk.{il}."
        B = p.eng.max_batch
        # 1. the router's logits of the normed x (which stays in xn for the experts)
        p.add_normed(p.normed_proj(b + "router", b + cfg.ffn_norm, s.moe_logits, E, None), f"ffn_norm-{il}")
        p.trace(f"ffn_moe_logits-{il}", s.moe_logits, E)
        # 2. gating, the top k, their weights renormalised
        bias = w.vectors.get(b + "exp_probs_b.bias")
        p.add(moe.route(p.dev, p.kernels, s.moe_logits, bias, s.moe_ids, s.moe_w, s.step, n_expert=E, k=k,
                        gating=cfg.gating, max_tokens=B), f"ffn_moe_weights_norm-{il}", s.moe_w, k)
        p.trace(f"ffn_moe_topk-{il}", s.moe_ids, k, dtype="u32")
        # 3. each pair's [gate | up] row from its token's normed x, reading the chosen experts' rows only
        for experts, col in w.experts[b + "gate_up"]:
            p.add(moe.expert_matvec(p.dev, p.kernels, experts, s.xn, s.moe_gu, s.moe_ids, k=k, max_tokens=B,
                                    x_stride=n, x_div=k, y_stride=2 * ff, y_offset=col))
        # 4. SwiGLU folded into each pair's down projection
        (down, _), = w.experts[b + "down"]
        p.add(moe.expert_matvec(p.dev, p.kernels, down, s.moe_gu, s.moe_down, s.moe_ids, k=k, max_tokens=B,
                                x_stride=2 * ff, x_div=1, y_stride=n, glu="swiglu"))
        # 5. the weighted sum, added to x
        p.add(moe.combine(p.dev, p.kernels, s.moe_down, s.moe_w, s.x, s.step, n=n, k=k, max_tokens=B),
              f"l_out-{il}", s.x, n)
