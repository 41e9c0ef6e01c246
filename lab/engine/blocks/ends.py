"""The two ends of a step: `Embedding` (the token rows into x) and `Head` (the final norm, the output head, its
soft-cap, and the tails that pick the next token). Their buffers (ids, x, logits, top-k) are the Scratch's own: every
step has them.
"""

from __future__ import annotations

from lab.engine.blocks.base import Block
from lab.ops import elementwise, embed, norm, sample
from lab.ops.rows import Rows
from lab.settings import MAX_CANDIDATES


class Embedding(Block):
    def build(self, p, il=None):
        """inp_embd: the token rows (inp_scaled where the config scales them, by sqrt(n_embd))."""
        cfg, s = self.cfg, p.scratch
        p.add(embed.get_rows(p.dev, p.kernels, p.weights.embedding, s.ids, s.x, s.step, scale=cfg.embd_scale),
              "inp_embd" if cfg.embd_scale == 1.0 else "inp_scaled", s.x, cfg.n_embd)


class Head(Block):
    def build(self, p, il=None):
        """The final norm, the head (soft-capped where the config says), and the tails that pick the next token."""
        cfg, s = self.cfg, p.scratch
        # The head keeps its own norm op: folded in, each of its n_vocab / 4 workgroups would re-read x.
        p.add(norm.rms_norm(p.dev, p.kernels, s.x, p.weights.vectors[cfg.output_norm], s.xn, s.step, cfg.n_embd,
                            cfg.eps),
              "result_norm", s.xn, cfg.n_embd)
        per_token = p.head()
        if cfg.final_softcap:   # logits = c * tanh(logits / c), before the tail picks a token
            p.add(elementwise.softcap(p.dev, p.kernels, s.logits, s.step, cfg.n_vocab, cfg.final_softcap,
                                      rows=0 if per_token else 1))
        # the logits as the tail reads them: complete after the head and its soft-cap
        p.trace("result_output", s.logits, cfg.n_vocab, rows="tokens" if per_token else "one")
        # The tail picks the next token (from the last token's row where the head left one per token): greedy's
        # argmax lands in ids[0], ready to be the next decode step's input; sampling reads back the top-k
        # candidates instead (the top-k pass costs 13% of a decode step on lavapipe, so greedy plans leave it out).
        rows = Rows.last() if per_token else Rows.fixed(1)
        p.set_tails(greedy=sample.argmax(p.dev, p.kernels, s.logits, s.ids, s.step, cfg.n_vocab, rows=rows),
                    sampled=sample.top_k(p.dev, p.kernels, s.logits, s.topk, s.step, cfg.n_vocab, MAX_CANDIDATES,
                                         rows=rows))
