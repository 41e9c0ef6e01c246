"""Ablation and activation patching, natively (`lab ablate`, `lab patch`, and from Python): the runs
lab/instruments/interventions.py makes, and what they are compared by.

- **Ablation**: the target token's log-probability at the last position with chosen attention heads, a whole attention
  block or an MLP block zeroed, or set to their mean over the prompt's positions (mean ablation: what the site holds
  on average, from a clean run's trace), one run per row; `delta` = ablated - base.
- **Activation patching** (causal tracing): two prompts of the same token length, a clean one and a corrupted one. For
  each layer and position, the corrupted run with the site's values at that (layer, position) taken from the clean
  run; the recovery of the logit difference target - foil is (patched - corrupted) / (clean - corrupted): 1 where the
  patch restores the clean answer, 0 where it does nothing. Positions are matched one to one, so the lengths must
  be equal (reword the corrupted prompt until they are; the message says both lengths).

Each run is one step from position 0 with the interventions in place: the engine's KV cache is overwritten, and the
engine's own plans are untouched.

What it does not know: the page (a card needs this without numpy), sampling, sessions.
"""

from __future__ import annotations

import asyncio

import numpy as np

from lab.instruments.interventions import Intervention, InterventionError, Interventions


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def _logits(runner: Interventions, ids, ivs) -> np.ndarray:
    return np.frombuffer(asyncio.run(runner.logits(ids, ivs)), np.float32).astype(np.float64)


def _trace(runner: Interventions, ids) -> dict[str, np.ndarray]:
    eng = runner.engine
    raw = asyncio.run(eng.traced(ids, 0))
    widths = {tr.name: tr.width for tr in eng.step_plan(len(ids), 0).trace}
    return {name: np.frombuffer(b, np.float32).reshape(-1, widths[name]) for name, b in raw.items()}


def ablate(runner: Interventions, ids: list[int], target: int, *, layers=None, heads=None, block: str | None = None,
           mode: str = "zero") -> dict:
    """{"target_id", "base_logprob", "rows": [{"layer", "head", "logprob", "delta"}]}: one row per (layer, head) of the
    sweep (heads None: every head), or per layer with `block` ("attn" | "mlp"; head None)."""
    cfg = runner.engine.cfg
    if mode not in ("zero", "mean"):
        raise InterventionError(f"mode {mode!r}: zero or mean")
    if block not in (None, "attn", "mlp"):
        raise InterventionError(f"block {block!r}: attn or mlp")
    layers = list(range(cfg.n_layer)) if layers is None else list(layers)
    base = float(log_softmax(_logits(runner, ids, []))[target])
    trace = _trace(runner, ids) if mode == "mean" else None
    hd = runner.head_dim
    rows = []
    for layer in layers:
        if block is not None:
            site = block
            units = [None]
        else:
            site = "attn"
            units = list(range(cfg.n_head)) if heads is None else list(heads)
        for head in units:
            values = None
            if mode == "mean":
                mean = trace[runner.name(site, layer)].mean(axis=0)
                values = tuple(float(v) for v in (mean if head is None else mean[head * hd:(head + 1) * hd]))
            iv = Intervention(site, layer, "zero" if mode == "zero" else "set",
                              heads=None if head is None else (head,), values=values)
            lp = float(log_softmax(_logits(runner, ids, [iv]))[target])
            rows.append({"layer": layer, "head": head, "logprob": lp, "delta": lp - base})
    return {"target_id": target, "base_logprob": base, "rows": rows}


def patch(runner: Interventions, clean: list[int], corrupt: list[int], target: int, foil: int | None = None, *,
          site: str = "resid", layers=None) -> dict:
    """{"target_id", "foil_id", "clean_diff", "corrupt_diff", "recovery": [[layer][position]]} (foil: the corrupted
    run's top token unless given)."""
    if len(clean) != len(corrupt):
        raise InterventionError(f"the clean prompt is {len(clean)} tokens and the corrupted one {len(corrupt)}: "
                                f"patching matches positions one to one, so reword one until both have the same "
                                f"number of tokens")
    cfg = runner.engine.cfg
    layers = list(range(cfg.n_layer)) if layers is None else list(layers)
    lc, lx = _logits(runner, clean, []), _logits(runner, corrupt, [])
    if foil is None:
        foil = int(np.argmax(lx))
    if foil == target:
        raise InterventionError("the foil is the target: the corrupted run already answers the target; give --foil")
    clean_diff, corrupt_diff = float(lc[target] - lc[foil]), float(lx[target] - lx[foil])
    if abs(clean_diff - corrupt_diff) < 1e-6:
        raise InterventionError("the clean and corrupted runs give the same logit difference: nothing to recover")
    trace = _trace(runner, clean)
    recovery = []
    for layer in layers:
        src = trace[runner.name(site, layer)]
        row = []
        for pos in range(len(clean)):
            iv = Intervention(site, layer, "set", positions=(pos, pos + 1),
                              values=tuple(float(v) for v in src[pos]))
            lp = _logits(runner, corrupt, [iv])
            row.append((float(lp[target] - lp[foil]) - corrupt_diff) / (clean_diff - corrupt_diff))
        recovery.append(row)
    return {"target_id": target, "foil_id": foil, "clean_diff": clean_diff, "corrupt_diff": corrupt_diff,
            "layers": layers, "recovery": recovery}
