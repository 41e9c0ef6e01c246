"""The feed-forward block of every layer: norm -> the fused row [gate | up] -> (SiLU or tanh-GELU)(gate) * up -> down,
added to x (or, with post-norms, normed and then added). It owns the [gate | up] and GLU rows.
"""

from __future__ import annotations

from lab import gpu
from lab.engine.blocks.base import Block
from lab.ops.backward import glu_back


class FeedForward(Block):
    def alloc(self, dev, n_ctx, B, kv):
        if not self.layers:     # every layer routed (lab.engine.blocks.moe)
            return {}
        ff, conv = self.cfg.n_ff, gpu.CONVERSATION      # n_ff: the widest layer's
        return {"gate_up": dev.buffer(4 * B * 2 * ff, conv, "gate|up [B, 2 n_ff]"),
                "h": dev.buffer(4 * B * ff, conv, "glu out [B, n_ff]")}

    def build(self, p, il):
        cfg, s = self.cfg, p.scratch
        FF, b = cfg.n_ff_of(il), f"blk.{il}."
        p.add_normed(p.normed_proj(b + "gate_up", b + cfg.ffn_norm, s.gate_up, 2 * FF, None), f"ffn_norm-{il}")
        act = "geglu" if cfg.gelu else "swiglu"
        down_in, down_opts = p.glu_then(act, FF)
        if down_in is s.h:      # the GLU ran as its own op (prefill; decode's widest FFNs): its output is a site
            p.trace(f"ffn_{act}-{il}", s.h, FF)
        # a block with a tail goes on after this residual: llama.cpp calls it pe_in there
        p.residual(b + "ffn_down.weight", down_in, "post_ffw_norm.weight", il, f"ffn_post_norm-{il}",
                   f"{'pe_in' if cfg.block_tail and cfg.post_norms else 'l_out'}-{il}", f"ffn_out-{il}", **down_opts)

    @staticmethod
    def kept(cfg, il):
        """The normed input, the [gate | up] row and the GLU's output."""
        return {"xn": cfg.n_embd, "gate_up": 2 * cfg.n_ff_of(il), "h": cfg.n_ff_of(il)}

    def build_backward(self, q, il):
        """Given dx (the loss's gradient at the layer's output), right after `build` recomputed the layer (xn, the
        [gate | up] row and the GLU output as the forward left them; the input in q.ts.mid): down, the GLU, gate|up
        and the norm, dx then holding the gradient at the feed-forward's input."""
        cfg, s, ts = self.cfg, q.scratch, q.ts
        FF, b = cfg.n_ff_of(il), f"blk.{il}."
        dy = q.branch_back(b + "ffn_down.weight", s.h, b + "post_ffw_norm.weight")
        q.proj_back(b + "ffn_down.weight", s.h, dy, ts.dh)
        q.add(glu_back(q.dev, q.kernels, s.gate_up, ts.dh, ts.dgu, s.step, FF, act="geglu" if cfg.gelu else "swiglu"))
        q.stacked_back(b + "gate_up", s.xn, ts.dgu, 2 * FF, ts.dxn)
        q.norm_back(ts.mid, b + cfg.ffn_norm, ts.dxn)
