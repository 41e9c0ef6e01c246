"""The memory budget: what a model needs on the GPU, worked out from its header before a single buffer exists.

    count(limits, header, cfg, n_ctx) -> Budget: every buffer the engine would make for the weights
    (lab.ops.weights.ModelWeights: matrices already split into binding-sized row ranges), the KV cache at
    `n_ctx`, the blocks' states (conv and recurrent states: fixed, whatever the context) and the activations
    (lab.engine.scratch.Scratch), each checked against the adapter's per-buffer limits
    (max_buffer_size, and max_storage_buffer_binding_size for a buffer bound whole).
    check(budget) -> the same Budget, or BudgetError with its message.

A load counts once: the worker shows the budget on the model card, checks it, and hands it to the Engine, which
checks that it was counted for the engine it is (lab.engine.load). The buffers are not re-derived here: the
engine's own allocation code runs against `_Counting`, a device that records sizes and creates nothing, so the
budget cannot drift from what the engine really makes (one copy of the placement rules). A refusal names the
buffer, its bytes and the limit, and where the context is what does not fit, the largest context that would.

What it does not count: per-dispatch parameter uniforms and the attention's split-K scratch, made while the
plans are built (kilobytes), and the adapter's total memory, which WebGPU does not report.
Runs in Pyodide: no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab import gpu
from lab.engine import blocks
from lab.engine.scratch import DEFAULT_BATCH, Scratch
from lab.format.gguf import Header
from lab.format.model import Config, tensor_views
from lab.ops.attention import KV_TYPES
from lab.ops.weights import ModelWeights
from lab.settings import MIN_CTX, context_for


class BudgetError(RuntimeError):
    """The model does not fit this adapter at this context; the message has the numbers."""


@dataclass(frozen=True)
class Need:
    """One buffer the engine would make."""
    label: str
    size: int               # bytes, as the engine asks for them (rounded up to 4)
    kind: str               # gpu.WEIGHTS or gpu.CONVERSATION (KV cache, activations)
    kv: bool = False        # one layer's K or V cache: the part that grows with the context
    state: bool = False     # one short-conv layer's conv state: memory of the conversation that does not grow


class _Counting(gpu.Device):
    """A device that records each buffer's size instead of making it. Limits are checked by the planner
    (all problems at once), so `buffer` here never refuses."""

    def __init__(self, limits: dict[str, int]) -> None:
        super().__init__()
        self.info = gpu.AdapterInfo("plan", "planner", frozenset(), dict(limits))   # ModelWeights splits by these

    def buffer(self, size: int, kind: str, label: str) -> gpu.Buffer:
        return self._register(max(4, (size + 3) & ~3), kind, label, uniform=False)   # as Device.buffer rounds

    def _create_buffer(self, size, label, uniform):
        return None

    def write(self, buf, data, offset=0) -> None:
        pass


def counting(limits: dict[str, int]) -> gpu.Device:
    """A device that only records the sizes of the buffers made on it (training counts its own with it)."""
    return _Counting(limits)


def problems(limits: dict[str, int], sizes: list[tuple[str, int]]) -> list[str]:
    """Each (label, bytes) over the adapter's buffer or binding limit, in words."""
    return _problems(limits, [Need(label, size, gpu.CONVERSATION) for label, size in sizes])


@dataclass
class Budget:
    """Every buffer a model needs at one context, and what of it does not fit the adapter."""
    n_ctx: int
    n_ctx_train: int
    limits: dict[str, int]
    needs: list[Need]
    problems: list[str] = field(default_factory=list)   # each: buffer, bytes, limit
    suggestion: int | None = None   # the largest context that fits, when a smaller one would help
    f16_fits: bool = False          # counted with an f32 KV cache that does not fit: the f16 cache would, at n_ctx
    counted_for: tuple = ()         # (n_ctx, max_batch, logits_all, int8, kv): the engine it was counted for

    @property
    def kv_type(self) -> str:
        """The KV cache's element type it was counted with (lab/ops/attention.py KV_TYPES)."""
        return self.counted_for[4] if self.counted_for else "f32"

    @property
    def fits(self) -> bool:
        return not self.problems

    def total(self, what: str) -> int:
        """Bytes of "weights", "kv", "state" (conv and recurrent states, their snapshots) or "scratch" (activations,
        logits, the step uniform)."""
        sel = {"weights": lambda n: n.kind == gpu.WEIGHTS, "kv": lambda n: n.kv, "state": lambda n: n.state,
               "scratch": lambda n: n.kind != gpu.WEIGHTS and not n.kv and not n.state}[what]
        return sum(n.size for n in self.needs if sel(n))

    @property
    def largest(self) -> Need:
        return max(self.needs, key=lambda n: n.size)

    def message(self) -> str:
        gb = _fmt
        head = (f"this model does not fit this GPU at a context of {self.n_ctx:,} tokens "
                f"(weights {gb(self.total('weights'))}, KV cache {gb(self.total('kv'))}, "
                f"activations {gb(self.total('scratch'))}): ")
        more = f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
        tail = ""
        if self.f16_fits:
            tail = (". With the KV cache in f16 (half its memory) this context fits: tick the page's \"KV cache in "
                    "f16\" box (lab bench: --kv f16) and load again")
        if self.suggestion:
            f32 = " with the f32 cache" if self.f16_fits else ""
            tail += f". A context of {self.suggestion:,} tokens would fit{f32}: choose it and load again"
        elif self.suggestion is None and self.problems and not self.f16_fits:
            tail = ". No context makes it fit: its weights are too large for this adapter"
        return head + "; ".join(self.problems[:3]) + more + tail

    def card(self, cfg: Config) -> dict:
        """For the page's model card (plain ints and strings)."""
        big = self.largest
        return {"n_ctx": self.n_ctx, "n_ctx_train": self.n_ctx_train, "fits": self.fits,
                "weight_bytes": self.total("weights"), "kv_bytes": self.total("kv"),
                "scratch_bytes": self.total("scratch"), "buffers": len(self.needs),
                "largest": {"label": big.label, "bytes": big.size},
                "max_buffer_size": self.limits["max_buffer_size"],
                "max_binding": self.limits["max_storage_buffer_binding_size"],
                "problems": list(self.problems), "suggestion": self.suggestion, "f16_fits": self.f16_fits,
                "message": None if self.fits else self.message(),
                "kv_type": self.kv_type, "kv_bytes_per_token": cfg.kv_bytes_per_token(KV_TYPES[self.kv_type]),
                "default_ctx": context_for(cfg.n_ctx_train),
                # hybrids: the conv and recurrent states' buffers (rings, snapshots), and the model's own states
                # (l_cache - 1 conv rows a layer; a delta-net's d_k x d_v per value head), flat in the context
                "state_bytes": self.total("state"), "conv_state_bytes": cfg.conv_state_bytes(),
                "delta_state_bytes": cfg.delta_state_bytes(),
                "skipped": cfg.skipped,     # what the file holds that the lab leaves out on purpose, and why
                "experts": self.experts(cfg)}

    def experts(self, cfg: Config) -> dict | None:
        """A mixture of experts' card line (None for a dense model): experts a routed layer and a token, the routed
        layers, the experts' weight bytes (every expert is resident: counted among the weights) and the part of them a
        token reads (its n_expert_used of n_expert, the decode kernels reading the chosen experts' rows only)."""
        if not cfg.n_expert:
            return None
        held = sum(n.size for n in self.needs if n.kind == gpu.WEIGHTS and "_exps" in n.label)
        return {"n_expert": cfg.n_expert, "n_expert_used": cfg.n_expert_used, "layers": len(cfg.routed_layers),
                "bytes": held, "bytes_a_token": held * cfg.n_expert_used // cfg.n_expert}


def _fmt(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:,.1f} MiB)"


def weight_needs(limits: dict[str, int], header: Header, cfg: Config) -> tuple[list[Need], list[str]]:
    """The weight buffers ModelWeights would make, and the rows that fit no binding at all."""
    dev = _Counting(limits)
    try:
        ModelWeights(dev, cfg, tensor_views(cfg, {t.name: t for t in header.tensors}))
    except gpu.GpuError as exc:     # one row wider than a binding: no split helps
        return [], [str(exc)]
    return [Need(b.label, b.size, b.kind) for b in dev.buffers], []


def scratch_needs(limits: dict[str, int], cfg: Config, n_ctx: int, max_batch: int,
                  logits_all: bool, int8: bool = False, kv: str = "f32") -> list[Need]:
    """The activation and KV cache buffers lab.engine.scratch.Scratch would make at `n_ctx`."""
    dev = _Counting(limits)
    made = blocks.for_config(cfg)
    s = Scratch.alloc(dev, cfg, made, n_ctx, max_batch, logits_all, int8, kv)

    def held(fields: str) -> set[int]:     # the buffers of the blocks' fields of this sort
        found = (getattr(s, name) for block in made.all for name in getattr(block, fields))
        return {id(b) for v in found for b in (v if isinstance(v, tuple) else (v,)) if b is not None}
    kv_ids, state_ids = held("kv_fields"), held("state_fields")
    return [Need(b.label, b.size, b.kind, kv=id(b) in kv_ids, state=id(b) in state_ids) for b in dev.buffers]


def _problems(limits: dict[str, int], needs: list[Need]) -> list[str]:
    """Each buffer over max_buffer_size, or (bound whole by the kernels) over the storage binding limit."""
    out = []
    max_buf, max_bind = limits["max_buffer_size"], limits["max_storage_buffer_binding_size"]
    for n in needs:
        if n.size > max_buf:
            out.append(f"buffer {n.label!r} needs {_fmt(n.size)}, over the adapter's maxBufferSize "
                       f"of {_fmt(max_buf)}")
        elif n.size > max_bind:
            out.append(f"buffer {n.label!r} needs {_fmt(n.size)}, over the adapter's "
                       f"maxStorageBufferBindingSize of {_fmt(max_bind)}")
    return out


def count(limits: dict[str, int], header: Header, cfg: Config, n_ctx: int, *, max_batch: int = DEFAULT_BATCH,
          logits_all: bool = False, int8: bool = False, kv: str = "f32") -> Budget:
    """The buffers for this model at `n_ctx`, and whether they fit `limits` (lab.gpu.LIMITS names, as
    AdapterInfo.limits has them); `kv` the KV cache's element type (lab/ops/attention.py KV_TYPES)."""
    weights, unsplittable = weight_needs(limits, header, cfg)

    def at(ctx: int) -> tuple[list[Need], list[str]]:
        needs = weights + scratch_needs(limits, cfg, ctx, max_batch, logits_all, int8, kv)
        return needs, unsplittable + _problems(limits, needs)

    needs, problems = at(n_ctx)
    b = Budget(n_ctx, cfg.n_ctx_train, dict(limits), needs, problems,
               counted_for=(n_ctx, max_batch, logits_all, int8, kv))
    if problems and kv == "f32":       # would the f16 cache fit? (half the KV bytes; the weights as they are)
        b.f16_fits = not _problems(limits, weights + scratch_needs(limits, cfg, n_ctx, max_batch, logits_all, int8,
                                                                   "f16")) and not unsplittable
    if problems and n_ctx > MIN_CTX and not at(MIN_CTX)[1]:
        lo, hi = MIN_CTX, n_ctx - 1         # lo fits; find the largest that does (fitting shrinks with ctx)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if not at(mid)[1] else (lo, mid - 1)
        b.suggestion = lo
    elif problems:
        b.suggestion = None
    return b


def check(budget: Budget, *, bounded: bool = True) -> Budget:
    """The budget, or BudgetError with its message when it does not fit, and (`bounded`: the page's loads) when its
    context is past the model's own. The Engine passes bounded=False: tests run tiny models at any context."""
    if bounded and not MIN_CTX <= budget.n_ctx <= budget.n_ctx_train:
        raise BudgetError(f"a context of {budget.n_ctx:,} tokens is outside {MIN_CTX}..{budget.n_ctx_train:,}, the "
                          f"context this model was trained for (its context_length)")
    if not budget.fits:
        raise BudgetError(budget.message())
    return budget
