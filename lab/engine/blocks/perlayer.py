"""The per-layer inputs and the block tail (gemma4's per-layer embeddings, llama.cpp project_per_layer_inputs).

Once a step, after the embedding (`inputs`): the token's rows of per_layer_token_embd times sqrt(width), plus the
scaled embedding through per_layer_model_proj times 1/sqrt(n_embd), RMS-normed per layer slice
(per_layer_proj_norm); the sum times 1/sqrt(2). At the end of each layer (`build`, after the feed-forward's
residual): GELU of inp_gate times this layer's slice of those inputs -> proj -> post_norm, added to x; then x times
the layer's output scale (a constant of the plans, read by the host: Engine.out_scale).
"""

from __future__ import annotations

import math

from lab import gpu
from lab.engine.blocks.base import Block
from lab.ops import elementwise, embed, glu, norm


class PerLayer(Block):
    def alloc(self, dev, n_ctx, B, kv):
        if not self.cfg.n_embd_per_layer:
            return {}
        n = self.cfg.n_layer * self.cfg.n_embd_per_layer
        return {"per_layer": dev.buffer(4 * B * n, gpu.CONVERSATION, f"per-layer inputs [B, {n}]"),
                "per_layer_proj": dev.buffer(4 * B * n, gpu.CONVERSATION, f"per-layer projection [B, {n}]")}

    def inputs(self, p) -> None:
        """The per-layer inputs of the step's tokens, every layer's slice at once; layer il reads its own in build."""
        cfg, s = self.cfg, p.scratch
        P = cfg.n_embd_per_layer
        if not P:
            return
        N = cfg.n_layer * P
        p.add(embed.get_rows(p.dev, p.kernels, p.weights.per_layer_embedding, s.ids, s.per_layer,
                             s.step, scale=math.sqrt(P)), "inp_per_layer_selected", s.per_layer, N)
        p.add(p.mm("per_layer_model_proj.weight", s.x, s.per_layer_proj))
        p.add(elementwise.scale(p.dev, p.kernels, s.per_layer_proj, s.step, N, 1.0 / math.sqrt(cfg.n_embd)))
        p.add(norm.rms_norm(p.dev, p.kernels, s.per_layer_proj, p.weights.vectors["per_layer_proj_norm.weight"],
                            s.per_layer_proj, s.step, N, cfg.eps, group=P, residual=s.per_layer),
              "per_layer_proj", s.per_layer_proj, N)
        p.add(elementwise.scale(p.dev, p.kernels, s.per_layer, s.step, N, 1.0 / math.sqrt(2.0)),
              "inp_per_layer", s.per_layer, N)

    def build(self, p, il):
        cfg, s = self.cfg, p.scratch
        E, P, b = cfg.n_embd, cfg.n_embd_per_layer, f"blk.{il}."
        if P:
            p.add(p.mm(b + "inp_gate.weight", s.x, s.gate_up))
            p.add(glu.glu(p.dev, p.kernels, s.gate_up, s.per_layer, s.h, s.step, P, act="geglu",
                          up_stride=cfg.n_layer * P, up_offset=il * P))
            p.add(p.mm(b + "proj.weight", s.h, s.tmp))
            p.add(norm.rms_norm(p.dev, p.kernels, s.tmp, p.weights.vectors[b + "post_norm.weight"], s.tmp, s.step, E,
                                cfg.eps, residual=s.x), f"per_layer_embd_out-{il}", s.tmp, E)
        if il in p.eng.out_scale:
            p.add(elementwise.scale(p.dev, p.kernels, s.x, s.step, E, p.eng.out_scale[il]))
        p.trace(f"l_out-{il}", s.x, E)
