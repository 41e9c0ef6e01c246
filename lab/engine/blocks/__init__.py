"""The engine's blocks: each kind of part a model's layers are made of, one object owning its buffers, its ops and
traced names, what it adds to the memory budget, and its states' rules (lab.engine.blocks.base.Block).

    base < attention < shortconv < deltanet < feedforward < moe < perlayer < ends

`for_config(cfg)` -> `Blocks`: the blocks of one model, in the order a step runs them. Which mixer a layer has is
the Config's word (`Config.mixer(il)`, set by the architecture's module in lab.format.arches); `MIXERS` maps it to
the block. A new kind of layer is its block here, its op (lab.ops), its WGSL and its oracle.

What it does not know: architectures' names, files, sessions.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.engine.blocks.attention import Attention, qkv_width
from lab.engine.blocks.base import Block
from lab.engine.blocks.deltanet import DeltaNet
from lab.engine.blocks.ends import Embedding, Head
from lab.engine.blocks.feedforward import FeedForward
from lab.engine.blocks.moe import RoutedFeedForward
from lab.engine.blocks.perlayer import PerLayer
from lab.engine.blocks.shortconv import ShortConv
from lab.format.config import Config

MIXERS: dict[str, type[Block]] = {"attention": Attention, "shortconv": ShortConv, "deltanet": DeltaNet}

__all__ = ["MIXERS", "Attention", "Block", "Blocks", "for_config", "qkv_width"]


@dataclass(frozen=True)
class Blocks:
    """A model's blocks: `mixers[il]` is layer il's mixer (one object per kind, shared by its layers); `ffn` the dense
    feed-forward of the layers that have one, `moe` the routed one of the others (Config.routed), or None."""
    embedding: Embedding
    mixers: tuple[Block, ...]
    ffn: FeedForward
    tail: PerLayer | None       # the block tail, where the config has one
    head: Head
    moe: RoutedFeedForward | None = None

    def ffn_of(self, il: int) -> Block:
        """Layer il's feed-forward block: the routed one on a routed layer, else the dense one."""
        return self.moe if self.moe is not None and il in self.moe.layers else self.ffn

    @property
    def all(self) -> list[Block]:
        """Every block once, in the order their buffers are made: the mixers in MIXERS' order, the rest after."""
        kinds = [next(m for m in self.mixers if type(m) is k) for k in MIXERS.values()
                 if any(type(m) is k for m in self.mixers)]
        return kinds + [self.ffn] + ([self.moe] if self.moe else []) + ([self.tail] if self.tail else [])

    def of(self, kind: type[Block]) -> Block | None:
        """The model's block of this kind, or None."""
        return next((b for b in self.all if type(b) is kind), None)


def for_config(cfg: Config) -> Blocks:
    every = tuple(range(cfg.n_layer))
    kinds = [cfg.mixer(il) for il in every]
    made = {k: MIXERS[k](cfg, tuple(il for il in every if kinds[il] == k)) for k in MIXERS if k in kinds}
    routed = cfg.routed_layers
    dense = tuple(il for il in every if il not in routed)
    return Blocks(Embedding(cfg, ()), tuple(made[k] for k in kinds), FeedForward(cfg, dense),
                  PerLayer(cfg, every) if cfg.block_tail else None, Head(cfg, ()),
                  RoutedFeedForward(cfg, routed) if routed else None)
