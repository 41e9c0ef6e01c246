"""Interventions: runs of the engine's own plan with activations changed on the way, for the experiments on the
model's insides (ablation, activation patching; lab/host/experiments.py drives them).

An intervention is data, `Intervention(site, layer, op, heads, positions, values, scale)`:
- site: "attn" (the attention output before the output projection, llama.cpp's `kqv_out-L`, [t, n_head x head_dim]:
  a query head's slice is its columns), "mlp" (the FFN's hidden after the GLU, before `ffn_down`: `ffn_swiglu-L` or
  `ffn_geglu-L`, [t, n_ff]), "resid" (the residual after block L, `l_out-L`, [t, n_embd]), or, in a mixture of
  experts, "expert" (a routed layer's experts' outputs as their weighted sum adds them up: `experts` names those
  left out, "zero", or whose share is scaled, "scale", by zeroing or scaling their weight where a token chose them,
  right after `route` completes `ffn_moe_weights_norm-L`; the other chosen experts keep their own weights, NOT
  renormalised to sum to 1, so the layer's output is the plain run's less that expert's term, lab.ops.moe.mute);
- op: "zero", "set" (to `values`), "add" (`values`), "scale" (by `scale`); the expert site takes zero and scale;
- heads: for "attn", the query heads whose columns change (GQA: query heads, not their KV group); None: every column;
  values then hold len(heads) x head_dim floats, head after head;
- experts: for "expert", the experts (0 .. n_expert - 1) it changes, one slot each;
- positions: (first, end) absolute positions; None: every position.

The plan is found by the traced names the plan builders record (`Plan.at`): each intervention's op (wgsl/intervene.wgsl)
goes right after the op that completes its activation, in a copy of the op list; the engine's own plans are never
changed, so a plain step is exactly what it was. A run is one step from position 0 (the prefill plan; one token takes
decode's, which folds the GLU into ffn_down, so "mlp" needs two tokens or more), and reads back the last position's
logits. It overwrites the KV cache from position 0: a caller with a chat session resets it, as for perplexity.

Buffers (kind CONVERSATION: values and positions come from the user's prompts): the values, one uniform per slot.
`close` frees them.

What it does not know: the experiments (which runs to make, what to compare), text, numpy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from lab import gpu, ops
from lab.ops import moe
from lab.ops.intervene import OPS, PARAMS, intervene

MAX_SLOTS = 64          # interventions (one per head for "attn" with heads) in one run
MAX_PREPARED = 64       # prepared op lists kept (one per layout of sites and layers: a sweep's layers)
EVERY = (0, 0xFFFFFFFF)


class InterventionError(ValueError):
    """An intervention this model or this run cannot take; the message says what to change."""


@dataclass(frozen=True)
class Intervention:
    site: str
    layer: int
    op: str = "zero"
    heads: tuple[int, ...] | None = None
    positions: tuple[int, int] | None = None
    values: tuple[float, ...] | None = None
    scale: float = 1.0
    experts: tuple[int, ...] | None = None


class Interventions:
    """Intervened runs of one engine; buffers made on the first run."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.device = engine.device
        cfg = engine.cfg
        s = engine.scratch
        self.head_dim = cfg.q_dim // cfg.n_head
        glu = "ffn_geglu" if cfg.gelu else "ffn_swiglu"
        # site -> (traced name prefix, the buffer, its row width)
        self.sites = {"attn": ("kqv_out", s.att, cfg.q_dim), "mlp": (glu, s.h, cfg.n_ff),
                      "resid": ("l_out", s.x, cfg.n_embd)}
        if s.h is None:         # every feed-forward routed (qwen3moe, a Mixtral-style llama): no dense hidden to change
            del self.sites["mlp"]
        if cfg.n_expert:        # the weights of a routed layer's chosen experts, k a token, as combine sums them
            self.sites["expert"] = ("ffn_moe_weights_norm", s.moe_w, cfg.n_expert_used)
        self.width = max(w for _, _, w in self.sites.values())
        self._ops = None
        self._prepared: dict[tuple, object] = {}

    def close(self) -> None:
        self.device.free(self)
        self._ops = None
        self._prepared.clear()

    def name(self, site: str, layer: int) -> str:
        """The traced name of a site at a layer (what `Engine.traced` returns it under)."""
        return f"{self.sites[site][0]}-{layer}"

    def _build(self) -> None:
        dev, kc, s = self.device, self.engine.kernels, self.engine.scratch
        conv = gpu.CONVERSATION
        with dev.owning(self):
            self.vals = dev.buffer(4 * MAX_SLOTS * self.width, conv, f"intervene.values [{MAX_SLOTS}, width]")
            self.params = [dev.uniform(bytes(PARAMS.size), f"intervene.params {i}", kind=conv)
                           for i in range(MAX_SLOTS)]
            self._ops = {(i, site): moe.mute(dev, kc, s.moe_ids, buf, s.step, self.params[i], k=width,
                                             max_tokens=self.engine.max_batch, label=f"intervene {i} {site}")
                         if site == "expert" else
                         intervene(dev, kc, buf, self.vals, s.step, self.params[i], width, f"intervene {i} {site}")
                         for i in range(MAX_SLOTS) for site, (_, buf, width) in self.sites.items()}

    def check(self, ivs: list[Intervention]) -> None:
        """Refuse interventions this model cannot take (InterventionError with what to change)."""
        self._slots(ivs)

    def _slots(self, ivs: list[Intervention]) -> list[tuple[str, int, bytes, bytes | None]]:
        """(site, layer, params, values) per slot: an "attn" intervention with heads takes one slot per head."""
        cfg, out = self.engine.cfg, []
        for iv in ivs:
            if iv.site not in self.sites:
                why = " (the expert site is a mixture of experts' only)" if iv.site == "expert" else ""
                raise InterventionError(f"site {iv.site!r}: one of {', '.join(self.sites)}{why}")
            if not 0 <= iv.layer < cfg.n_layer:
                raise InterventionError(f"layer {iv.layer}: the model has layers 0 .. {cfg.n_layer - 1}")
            if iv.op not in OPS:
                raise InterventionError(f"op {iv.op!r}: one of {', '.join(OPS)}")
            if (iv.site == "expert") != (iv.experts is not None):
                raise InterventionError("experts name what the expert site changes, and only it")
            if iv.site == "expert":
                out += self._expert_slots(iv)
                continue
            if iv.site == "mlp" and cfg.routed(iv.layer):
                raise InterventionError(f"layer {iv.layer}'s feed-forward is routed experts, with no one hidden "
                                        f"activation: the expert site changes its experts")
            width = self.sites[iv.site][2]
            if iv.heads is not None:
                if iv.site != "attn":
                    raise InterventionError("heads are columns of the attention output: site 'attn' only")
                bad = [h for h in iv.heads if not 0 <= h < cfg.n_head]
                if bad or not iv.heads:
                    raise InterventionError(f"heads {list(iv.heads)}: the model has query heads 0 .. {cfg.n_head - 1}")
                blocks = [(h * self.head_dim, (h + 1) * self.head_dim) for h in iv.heads]
            else:
                blocks = [(0, width)]
            n_values = sum(c1 - c0 for c0, c1 in blocks)
            if iv.op in ("set", "add") and (iv.values is None or len(iv.values) != n_values):
                raise InterventionError(f"{iv.op} needs {n_values} values (the block's width), not "
                                        f"{0 if iv.values is None else len(iv.values)}")
            r0, r1 = iv.positions or EVERY
            k = 0
            for c0, c1 in blocks:
                vals = None
                if iv.op in ("set", "add"):
                    vals = struct.pack(f"<{c1 - c0}f", *iv.values[k:k + c1 - c0])
                    k += c1 - c0
                out.append((iv.site, iv.layer, (c0, c1, r0, r1, OPS[iv.op], iv.scale), vals))
        if len(out) > MAX_SLOTS:
            raise InterventionError(f"{len(out)} intervention slots in one run: at most {MAX_SLOTS}")
        return out

    def _expert_slots(self, iv: Intervention) -> list[tuple[str, int, tuple, None]]:
        """An expert intervention's slots, one an expert: (c0, c1) = (e, e + 1) names it (lab.ops.moe.mute)."""
        cfg = self.engine.cfg
        if iv.heads is not None:
            raise InterventionError("heads are columns of the attention output: site 'attn' only")
        if not cfg.routed(iv.layer):
            raise InterventionError(f"layer {iv.layer} has no router (a dense feed-forward): the expert site is at "
                                    f"layers {', '.join(map(str, cfg.routed_layers))}")
        if iv.op not in moe.MUTE_OPS:
            raise InterventionError(f"the expert site takes {' or '.join(moe.MUTE_OPS)} (an expert's share of the "
                                    f"weighted sum left out or scaled), not {iv.op!r}")
        bad = [e for e in iv.experts if not 0 <= e < cfg.n_expert]
        if bad or not iv.experts:
            raise InterventionError(f"experts {list(iv.experts)}: the model has experts 0 .. {cfg.n_expert - 1}")
        r0, r1 = iv.positions or EVERY
        return [("expert", iv.layer, (e, e + 1, r0, r1, OPS[iv.op], iv.scale), None) for e in iv.experts]

    def ops_for(self, plan, ivs: list[Intervention], tail: tuple = (), resume=None) -> tuple[list[ops.Op], list]:
        """`plan`'s op list with the interventions in place, then `tail` (a token-picking tail, the pick op), and the
        writes that set the interventions. resume=(layer, load op): the run starts after `l_out-layer` with the load
        op (which sets the residual as a plain run left it there): what comes before is the plain run's, so a sweep
        skips it; every intervention must then sit at that point or later."""
        if self._ops is None:
            self._build()
        after: dict[int, list[ops.Op]] = {}
        writes = []
        for i, (site, layer, (c0, c1, r0, r1, op, scale), vals) in enumerate(self._slots(ivs)):
            if site == "attn" and layer not in self.engine.cfg.attention_layers:
                raise InterventionError(f"layer {layer} has no attention (a short-conv block): the attn site is at "
                                        f"layers {', '.join(map(str, self.engine.cfg.attention_layers))}")
            try:
                at = plan.at(self.name(site, layer))
            except KeyError:
                raise InterventionError(f"no {site} activation at layer {layer} in a one-token step (one token runs "
                                        f"decode's plan, which folds the GLU into ffn_down): use two tokens or more "
                                        f"for the mlp site") from None
            after.setdefault(at, []).append(self._ops[i, site])
            writes.append((self.params[i], 0, PARAMS.pack(self.sites[site][2], c0, c1, r0, r1, op,
                                                           i * self.width, scale)))
            if vals is not None:
                writes.append((self.vals, 4 * i * self.width, vals))
        out: list[ops.Op] = []
        start = 0
        cut = -1 if resume is None else plan.at(self.name("resid", resume[0]))
        if resume is not None and any(j < cut for j in after):
            raise InterventionError(f"a run resumed after layer {resume[0]} cannot change an earlier activation")
        for j, op in enumerate(plan.ops):
            out.append(op)
            if j == cut:
                start = len(out)
            out += after.get(j, [])
        if resume is not None:
            out = [resume[1]] + out[start:]
        return out + list(tail), writes

    def step(self, plan, t: int, ivs: list[Intervention], tail: tuple = (), resume=None) -> tuple[object, list]:
        """(the backend's prepared dispatch list, the writes) of a t-token step of `plan` with `ivs` and `tail` (and
        `resume`, as `ops_for`). The op list depends only on which site and layer each slot takes, so it is prepared
        once per such layout and reused across the runs of a sweep (the values, positions and heads are in the
        slots' uniforms)."""
        op_list, writes = self.ops_for(plan, ivs, tail, resume)
        key = (id(plan), t, tuple(id(o) for o in op_list))
        run = self._prepared.get(key)
        if run is None:
            run = self.device.prepare(ops.dispatches(op_list, t))
            if len(self._prepared) >= MAX_PREPARED:
                self._prepared.pop(next(iter(self._prepared)))
            self._prepared[key] = run
        return run, writes

    def editor(self, ivs: list[Intervention]):
        """A step editor for `Engine.step(edit=...)`: every step of a generation runs with `ivs` in place (steering)."""
        self.check(ivs)         # refused now, not at the first step

        def edit(plan, t, pos, tail):
            return self.step(plan, t, ivs, tuple(tail))
        return edit

    async def logits(self, ids: list[int], ivs: list[Intervention]) -> bytes:
        """The last position's logits (f32 [n_vocab]) after `ids` from position 0, with `ivs` applied."""
        eng = self.engine
        t = len(ids)
        if not 1 <= t <= eng.max_batch:
            raise InterventionError(f"a prompt of {t} tokens: 1 .. {eng.max_batch} (one step)")
        eng.check_ids(ids, InterventionError)
        run, writes = self.step(eng.step_plan(t, 0), t, ivs)
        self.device.run(run, eng.step_writes(ids, 0, t) + writes)
        return await self.device.read(eng.scratch.logits, 4 * logits_row(eng, t), 4 * eng.cfg.n_vocab)


def logits_row(engine, t: int) -> int:
    """Where the last position's logits start in the engine's logits buffer after a t-token step from position 0."""
    out = next(tr for tr in engine.step_plan(t, 0).trace if tr.name == "result_output")
    return (t - 1) * engine.cfg.n_vocab if out.rows == "tokens" and t > 1 else 0
