"""The gated delta-net block, in attention's place on its layers (linear attention; llama.cpp
build_layer_attn_linear): x -> norm -> the in-projection row [q k v | z | beta | alpha] -> silu(conv(q k v)) over the
layer's conv state -> the recurrence over its recurrent state (q, k L2-normed; the decay from alpha, dt's bias and A;
beta's gate), its output RMS-normed and gated by silu(z) (one op) -> ssm_out, added to x.

A recurrent state is the sum of every token so far and cannot step back: a step starts only where the live states
or a snapshot stand. The engine asks for a snapshot after each submitted block of greedy steps (SNAPSHOTS slots, each
one buffer holding every recurrent, then every conv state, in layer order).

Traced: attn_norm-L, linear_attn_qkv_mixed-L (the in-projection's q, k, v), conv_output_silu-L, final_output-L (the
gated norm of the recurrence's output, ssm_out's input), ffn_inp-L.

Its backward (training, lab.engine.backward): ssm_out, the recurrence and the gated norm (lab.ops.backward_deltanet:
its states in reverse from per-chunk checkpoints), the conv's silu mode (lab.ops.backward_shortconv), the four input
projections and the norm, over a window that starts at position 0 from zero states, as every training window does;
the kept rows are the in-projection row, the conv's output and the gated norm's (in att).
"""

from __future__ import annotations

from lab import gpu
from lab.engine.blocks.base import Block
from lab.engine.scratch import SNAPSHOTS, conv_ring
from lab.ops import backward_deltanet, backward_shortconv, norm
from lab.ops import deltanet as deltanet_ops
from lab.ops import shortconv as shortconv_ops


class DeltaNet(Block):
    state_fields = ("conv_state", "recurrent", "snapshots")
    snapshots = True

    def alloc(self, dev, n_ctx, B, kv):
        cfg, conv = self.cfg, gpu.CONVERSATION
        ring, n, d, hv = conv_ring(cfg), cfg.conv_channels, cfg.ssm_head_dim, cfg.ssm_v_heads
        conv_bytes, state_bytes = shortconv_ops.state_bytes(n, ring), deltanet_ops.state_bytes(hv, d)
        out = {"conv_state": self.per_layer(lambda il: dev.buffer(conv_bytes, conv, f"conv state {il} [{ring}, {n}]")),
               "recurrent": self.per_layer(lambda il: dev.buffer(state_bytes, conv,
                                                                 f"delta-net state {il} [{hv}, {d}, {d}]")),
               "delta_in": dev.buffer(4 * B * cfg.delta_width, conv, "delta-net in-projection [B, width]"),
               "delta_conv": dev.buffer(4 * B * n, conv, f"delta-net conv out [B, {n}]")}
        size = len(self.layers) * (state_bytes + conv_bytes)
        out["snapshots"] = tuple(dev.buffer(size, conv, f"state snapshot {i} (recurrent and conv states)")
                                 for i in range(SNAPSHOTS))
        return out

    def build(self, p, il):
        cfg, s, vec = self.cfg, p.scratch, p.weights.vectors
        E, C, V, H, W = cfg.n_embd, cfg.conv_channels, cfg.ssm_inner, cfg.ssm_v_heads, cfg.delta_width
        b = f"blk.{il}."
        p.add_normed(p.normed_proj(b + "delta_in", b + "attn_norm.weight", s.delta_in, W, None), f"attn_norm-{il}")
        p.trace(f"linear_attn_qkv_mixed-{il}", s.delta_in, C, W)
        p.add(shortconv_ops.shortconv(p.dev, p.kernels, s.delta_in, vec[b + "ssm_conv1d.weight"], s.conv_state[il],
                                      s.delta_conv, s.step, n=C, l_cache=cfg.l_cache, ring=conv_ring(cfg),
                                      mode="silu", stride=W, label=f"delta conv {il}"),
              f"conv_output_silu-{il}", s.delta_conv, C)
        p.add(deltanet_ops.deltanet(p.dev, p.kernels, s.delta_in, s.delta_conv, vec[b + "ssm_dt.bias"],
                                    vec[b + "ssm_a"], vec[b + "ssm_norm.weight"], s.recurrent[il], s.att, s.step,
                                    n_k_heads=cfg.ssm_k_heads, n_v_heads=H, head_dim=cfg.ssm_head_dim, proj_stride=W,
                                    z_offset=C, beta_offset=C + V, alpha_offset=C + V + H, eps=cfg.eps,
                                    label=f"deltanet {il}"),
              f"final_output-{il}", s.att, V)
        p.add(p.mm(b + "ssm_out.weight", s.att, s.x, accumulate=True), f"ffn_inp-{il}", s.x, E)

    @staticmethod
    def kept(cfg, il):
        """The in-projection row [q k v | z | beta | alpha], the conv's output silu(conv(q k v)) and the gated norm's
        output (ssm_out's input, in att)."""
        return {"delta_in": cfg.delta_width, "delta_conv": cfg.conv_channels, "att": cfg.ssm_inner}

    def build_backward(self, q, il):
        """Given dx (the loss's gradient after the block's residual add), right after `build` recomputed the layer
        (delta_in, delta_conv and the gated norm's output in att; or the kept rows put back): ssm_out, the recurrence
        and the gated norm into the gradient of the in-projection row's z, beta and alpha and of the conv's output,
        the conv into the row's q k v (and in full fine-tuning dt's bias, A, the norm's weight and the conv kernel's
        gradients), the four projections and the norm, dx then holding the gradient at the layer's input. The window
        starts at position 0 from zero states (training's windows always do), so no gradient reaches a state."""
        cfg, s, ts, vec = self.cfg, q.scratch, q.ts, q.weights.vectors
        E, C, V, H, W = cfg.n_embd, cfg.conv_channels, cfg.ssm_inner, cfg.ssm_v_heads, cfg.delta_width
        b = f"blk.{il}."
        q.proj_back(b + "ssm_out.weight", s.att, ts.dx, ts.datt)
        q.add(backward_deltanet.deltanet_back(
            q.dev, q.kernels, s.delta_in, s.delta_conv, vec[b + "ssm_dt.bias"], vec[b + "ssm_a"],
            vec[b + "ssm_norm.weight"], ts.datt, ts.ddelta, ts.dconv, ts.delta, s.step, n_k_heads=cfg.ssm_k_heads,
            n_v_heads=H, head_dim=cfg.ssm_head_dim, proj_stride=W, z_offset=C, beta_offset=C + V,
            alpha_offset=C + V + H, eps=cfg.eps, max_tokens=q.T, dnorm_w=q.vgrad(b + "ssm_norm.weight"),
            ddt=q.vgrad(b + "ssm_dt.bias"), da=q.vgrad(b + "ssm_a"), label=f"{b}deltanet_back"))
        conv = b + "ssm_conv1d.weight"
        q.add(backward_shortconv.shortconv_back(q.dev, q.kernels, s.delta_in, vec[conv], ts.dconv, ts.ddelta,
                                                q.vgrad(conv), s.step, n=C, l_cache=cfg.l_cache, max_tokens=q.T,
                                                mode="silu", stride=W, label=f"{b}conv_back"))
        # the normed input, which the feed-forward's norm overwrote: the saved x through the norm again
        q.restore(il)
        q.add(norm.rms_norm(q.dev, q.kernels, s.x, vec[b + "attn_norm.weight"], s.xn, s.step, E, cfg.eps))
        q.stacked_back(b + "delta_in", s.xn, ts.ddelta, W, ts.dxn)
        q.norm_back(s.x, b + "attn_norm.weight", ts.dxn)

    def resumes(self, held, snaps, pos):
        return any(h is not None and h[1] == pos for h in (held, *snaps))

    def snapshotted(self, scratch):
        return [scratch.recurrent[il] for il in self.layers] + [scratch.conv_state[il] for il in self.layers]
