"""The short-conv block, in attention's place on its layers: x -> norm -> in_proj [B | C | x] -> C * conv(B * x)
over the layer's conv state (one op reads and writes it, in prefill and decode alike) -> out_proj, added to x.

Its memory is the conv state, a ring of conv_ring rows of B*x indexed by position (lab/engine/scratch.py): a step at
pos finds what it reads while the ring still holds the l_cache - 1 positions before pos.

Traced: attn_norm-L, shortconv_bcx-L (in_proj's [B | C | x]), shortconv_y-L (C * conv, out_proj's input), ffn_inp-L.
"""

from __future__ import annotations

from lab import gpu
from lab.engine.blocks.base import Block
from lab.engine.scratch import conv_ring
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

    def resumes(self, held, snaps, pos):
        lo, hi = held
        return lo <= max(0, pos - (self.cfg.l_cache - 1)) and pos <= hi
