"""`Block`: one kind of part a model's layers are made of, as the engine runs it.

A model is an embedding, then per layer a mixer (attention, a short conv, a gated delta-net: the part that reads
other positions) and a feed-forward, maybe a per-layer tail, then the output head. Each kind is one `Block` object per
engine, made for the layers it runs, and it owns what that kind needs:

- its buffers: `alloc` returns the `Scratch` fields it fills (every buffer kind CONVERSATION, so Forget finds them
  by kind), and names those that are memory of the conversation: `kv_fields` (grows with the context, the budget's
  "kv") and `state_fields` (fixed, the budget's "state");
- its ops and traced names in a step: `build(p, il)` adds layer il's ops to the plan builder `p`
  (lab.engine.plans.PlanBuilder: `p.add`, `p.trace`, and the projections that differ between prefill and decode);
- what a step's start position needs of its states: `resumes(held, snaps, pos)`, and whether the engine keeps
  snapshots of them (`snapshots`, the buffers a snapshot copies in `snapshotted`).

The budget counts a block's buffers by running the same `alloc` on a device that only records sizes
(lab.engine.budget), so a new block is counted, wiped and listed without another file knowing it.

What it does not know: which architectures use it (lab.format.arches decide each layer's kind: Config.mixer).
"""

from __future__ import annotations

from lab import gpu
from lab.format.config import Config


class Block:
    """One kind of layer part, for the layers `layers` of a model."""
    kv_fields: tuple[str, ...] = ()         # per-layer Scratch fields that grow with the context
    state_fields: tuple[str, ...] = ()      # Scratch fields of fixed size that hold the conversation (states)
    snapshots: bool = False                 # the engine keeps copies of its states to step back to

    def __init__(self, cfg: Config, layers: tuple[int, ...]) -> None:
        self.cfg = cfg
        self.layers = layers

    def alloc(self, dev: gpu.Device, n_ctx: int, B: int, kv: str) -> dict:
        """The Scratch fields this block fills, made on `dev` (B: rows of a step; kv: the KV cache's element type)."""
        return {}

    def build(self, p, il: int) -> None:
        """Add layer il's ops (and their traced names) to the plan builder p."""
        raise NotImplementedError

    @staticmethod
    def kept(cfg: Config, il: int) -> dict[str, int]:
        """The Scratch fields of layer il (floats a token) this block's backward reads as its forward left them: the
        training step copies them aside in the forward and back before `build_backward`, or runs the forward again
        where they would not fit (lab.engine.backward kept_widths, KEEP_BYTES)."""
        return {}

    def build_backward(self, q, il: int) -> None:
        """Add layer il's backward to the training step's builder q (lab.engine.backward.Backward): given the loss's
        gradient after this block's residual add (q.ts.dx), right after `build` recomputed the layer, leave the
        gradient before it in q.ts.dx and add the trained parameters' gradients into theirs."""
        raise NotImplementedError(f"{type(self).__name__} has no backward yet")

    def resumes(self, held: tuple[int, int], snaps: list, pos: int) -> bool:
        """Whether a step at pos > 0 finds what this block reads of the positions before it, where the live states
        hold the positions `held` and the snapshots `snaps` (lab.engine.engine.Engine.can_resume)."""
        return True

    def snapshotted(self, scratch) -> list[gpu.Buffer]:
        """The live buffers a snapshot copies, in the order they lie in it."""
        return []

    def per_layer(self, make) -> tuple:
        """A per-layer tuple: make(il) for this block's layers, None for the others."""
        mine = set(self.layers)
        return tuple(make(il) if il in mine else None for il in range(self.cfg.n_layer))
