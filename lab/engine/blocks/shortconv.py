"""The short-conv block, in attention's place on its layers: x -> norm -> in_proj [B | C | x] -> C * conv(B * x)
over the layer's conv state (one op reads and writes it, in prefill and decode alike) -> out_proj, added to x.

Its memory is the conv state, a ring of conv_ring rows of B*x indexed by position (lab/engine/scratch.py): a step at
pos finds what it reads while the ring still holds the l_cache - 1 positions before pos.

Traced: attn_norm-L, shortconv_bcx-L (in_proj's [B | C | x]), shortconv_y-L (C * conv, out_proj's input), ffn_inp-L.

Its backward (training, lab.engine.backward): out_proj, the conv (lab.ops.backward_shortconv), in_proj and the norm,
over a window that starts at position 0 from a zero conv state, as every training window does; the kept rows are
bcx and C * conv (in att).
"""

from __future__ import annotations

from lab import gpu
from lab.engine.blocks.base import Block
from lab.engine.scratch import conv_ring
from lab.ops import backward_shortconv, norm
from lab.ops import shortconv as shortconv_ops


class ShortConv(Block):
    state_fields = ("conv_state",)

    def alloc(self, dev, n_ctx, B, kv):
        ring, n, conv = conv_ring(self.cfg), self.cfg.conv_channels, gpu.CONVERSATION
        return {"conv_state": self.per_layer(lambda il: dev.buffer(shortconv_ops.state_bytes(n, ring), conv,
                                                                   f"conv state {il} [{ring}, {n}]")),
                "bcx": dev.buffer(4 * B * 3 * self.cfg.n_embd, conv, "bcx [B, 3 n_embd]")}

    def build(self, p, il):
        cfg, s = self.cfg, p.scratch
        E = cfg.n_embd
        b = f"blk.{il}."
        p.add_normed(p.normed_proj(b + "in_proj", b + "attn_norm.weight", s.bcx, 3 * E, None), f"attn_norm-{il}")
        p.trace(f"shortconv_bcx-{il}", s.bcx, 3 * E)
        p.add(shortconv_ops.shortconv(p.dev, p.kernels, s.bcx, p.weights.vectors[b + "shortconv.conv.weight"],
                                      s.conv_state[il], s.att, s.step, n=E, l_cache=cfg.l_cache, ring=conv_ring(cfg),
                                      label=f"shortconv {il}"),
              f"shortconv_y-{il}", s.att, E)
        p.add(p.mm(b + "shortconv.out_proj.weight", s.att, s.x, accumulate=True), f"ffn_inp-{il}", s.x, E)

    @staticmethod
    def kept(cfg, il):
        """The in_proj row [B | C | x] and C * conv (out_proj's input, in att)."""
        return {"bcx": 3 * cfg.n_embd, "att": cfg.n_embd}

    def build_backward(self, q, il):
        """Given dx (the loss's gradient after the block's residual add), right after `build` recomputed the layer
        (bcx, and C * conv in att; or the kept rows put back): out_proj, the conv's backward into the gradient of the
        in_proj row [dB | dC | dx] (and in full fine-tuning the conv kernel's gradient), in_proj and the norm, dx then
        holding the gradient at the layer's input. The window starts at position 0 from a zero conv state (training's
        windows always do), so no gradient reaches a state. No post-norm: lfm2 has none (the forward adds out_proj's
        output to x directly)."""
        cfg, s, ts = self.cfg, q.scratch, q.ts
        E, b = cfg.n_embd, f"blk.{il}."
        q.proj_back(b + "shortconv.out_proj.weight", s.att, ts.dx, ts.datt)
        conv = b + "shortconv.conv.weight"
        q.add(backward_shortconv.shortconv_back(q.dev, q.kernels, s.bcx, q.weights.vectors[conv], ts.datt, ts.dbcx,
                                                q.vgrad(conv), s.step, n=E, l_cache=cfg.l_cache, max_tokens=q.T,
                                                label=f"{b}shortconv_back"))
        # the normed input, which the feed-forward's norm overwrote: the saved x through the norm again
        q.restore(il)
        q.add(norm.rms_norm(q.dev, q.kernels, s.x, q.weights.vectors[b + "attn_norm.weight"], s.xn, s.step, E,
                            cfg.eps))
        q.stacked_back(b + "in_proj", s.xn, ts.dbcx, 3 * E, ts.dxn)
        q.norm_back(s.x, b + "attn_norm.weight", ts.dxn)

    def resumes(self, held, snaps, pos):
        lo, hi = held
        return lo <= max(0, pos - (self.cfg.l_cache - 1)) and pos <= hi
