"""Kernel families as plan-time builders: each function compiles (cached) its WGSL variant, makes the
uniform parameters and the bind group once, and returns `Op`s the engine strings into a step.

Conventions every op follows (the engine and the tests rely on them):
- Activations are f32, row-major: a tensor of t tokens by n features is `t * n` floats, token-major.
- Per-step values live in one `step` uniform buffer shared by all ops (layout `STEP`), written once per
  step, so bind groups never change between tokens: `pos` is the position of the step's first token,
  `n_tokens` the number of tokens in the step.
- An op's grid depends only on the step's token count: `op.at(t)` gives the dispatch for t tokens.
- Weights stay in their GGUF block layout, split into row ranges that each fit one storage binding.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from lab import gpu
from lab.format.ggml import GgmlType

# struct Step { pos: u32, n_tokens: u32, n_ctx: u32, _pad: u32 }  (uniform, 16 bytes)
STEP = struct.Struct("<IIII")


def step_bytes(pos: int, n_tokens: int, n_ctx: int) -> bytes:
    return STEP.pack(pos, n_tokens, n_ctx, 0)


def make_step(device: gpu.Device, label: str = "step") -> gpu.Buffer:
    """The shared per-step uniform buffer. Conversation-derived (it holds the position)."""
    return device.uniform(bytes(STEP.size), label, kind=gpu.CONVERSATION)


# Roles: what an op is for, where a caller must find it in a plan (the probes swap the attention ops for their
# probe variant and, replaying cached positions, run a KV_WRITE op's `without_kv` in its place). Labels are for
# people and profiles.
ATTENTION = "attention"
KV_WRITE = "kv_write"


@dataclass(frozen=True)
class Op:
    kernel: gpu.Kernel
    bound: gpu.Bound
    grid: Callable[[int], tuple[int, int, int]]   # workgroups for a step of t tokens
    role: str = ""                                # ATTENTION, KV_WRITE, or "" for any other op
    without_kv: Op | None = None                  # KV_WRITE: what to run instead when the cache must stay as it is

    def at(self, t: int) -> gpu.Dispatch:
        return gpu.Dispatch(self.kernel, self.bound, self.grid(t))


def dispatches(op_list: list[Op], t: int) -> list[gpu.Dispatch]:
    """The ops' dispatches for a step of t tokens, leaving out those with no work at t (an empty grid)."""
    return [d for d in (op.at(t) for op in op_list) if all(d.groups)]


@dataclass(frozen=True)
class WeightPart:
    buffer: gpu.Buffer
    first_row: int
    n_rows: int


@dataclass(frozen=True)
class Weight:
    """A 2-D weight of `rows` outputs by `cols` inputs (GGUF ne0 = cols, ne1 = rows), GGUF block layout."""
    name: str
    type: GgmlType
    rows: int
    cols: int
    parts: tuple[WeightPart, ...]

    @property
    def row_bytes(self) -> int:
        return self.type.row_bytes(self.cols)


@dataclass(frozen=True)
class Experts:
    """A stack of n_expert matrices of `per` rows each (a routed layer's experts: GGUF [cols, per, n_expert]) held as
    one Weight of n_expert x per rows, expert e's rows e * per ..; its parts hold whole experts (alloc_weight's
    row_group), so an expert's rows are in one binding."""
    weight: Weight
    n_expert: int
    per: int

    def experts_of(self, part: WeightPart) -> tuple[int, int]:
        """(first expert, experts) a part holds."""
        return part.first_row // self.per, part.n_rows // self.per


def groups_1d(n: int, per_group: int, max_per_dim: int = 65535) -> tuple[int, int, int]:
    """Workgroups for n items at per_group each, folded into y when x would pass the per-dimension limit."""
    g = max(1, -(-n // per_group))
    if g <= max_per_dim:
        return (g, 1, 1)
    y = -(-g // max_per_dim)
    return (max_per_dim, y, 1)
