"""The Router card's reading of a mixture-of-experts model (docs/moe.md, "The Router card"): for each token of the
conversation and each routed layer, which experts it went to and with what weight; the load on each expert over the
conversation; the router's entropy by layer. lab/worker/routing.py posts it, web/routing.js draws it.

The choices are the engine's own, read back as its kernels left them: the conversation runs again from position 0
through the engine's plans, in steps of at most `max_batch` tokens (a step of one token runs decode's plan), and each
routed layer's `ffn_moe_topk-L` (the chosen experts, as `route` wrote them), `ffn_moe_weights_norm-L` (their weights,
renormalised to sum to 1, as `combine` takes them) and `ffn_moe_logits-L` (the router's logits over every expert) are
read through `Engine.traced`. The chat's own turns ran their generated tokens one decode step at a time, whose router
logits can differ from this run's in the last bits of f32: a choice within such a margin of a tie can go the other way
(docs/moe.md says how often on the test files). The run overwrites the KV cache from position 0, and a hybrid's
states: the caller keeps the chat's aside and puts them back (lab/instruments/experiments.py `Experiments.kept`).

Entropy, per token and layer: of the router's whole distribution over the n_expert experts, p = softmax(logits) (a
sigmoid router, lfm2moe: the sigmoids divided by their sum), H = -sum_e p_e log2 p_e in bits: 0 when one expert takes
all of it, log2 n_expert when the router cannot tell them apart. Not the entropy of the k renormalised weights (at
most log2 k), which says how evenly the chosen share a token and nothing of how sure the router was of the choice.

Load, per layer and expert, over the conversation's t tokens: the tokens that chose it (t k picks in all; a balanced
router gives each expert t k / n_expert) and the sum of its weights (t in all).

What it does not know: the page, text, numpy; the experiments (an expert's ablation is
lab/instruments/experiments.py `Experiments.expert_ablation`).
"""

from __future__ import annotations

import math
import struct
import time
from array import array
from dataclasses import dataclass


def describe(engine) -> dict | None:
    """What the page needs to know of a model's router before it asks for anything: None for a dense model."""
    cfg = engine.cfg
    if not cfg.n_expert:
        return None
    return {"n_expert": cfg.n_expert, "k": cfg.n_expert_used, "layers": list(cfg.routed_layers),
            "gating": cfg.gating}


def entropy_bits(logits, gating: str) -> float:
    """H of the router's distribution over the experts (the module doc says which), in bits."""
    if gating == "sigmoid":
        p = [1.0 / (1.0 + math.exp(-v)) if v >= -700 else 0.0 for v in logits]
    else:
        mx = max(logits)
        p = [math.exp(v - mx) for v in logits]
    total = math.fsum(p)
    return -math.fsum(q / total * math.log2(q / total) for q in p if q > 0)


@dataclass
class Routing:
    """One reading of the conversation's routing; per routed layer (`layers`), row-major over tokens."""
    layers: list[int]               # the routed layers, in order
    n_expert: int
    k: int                          # experts a token
    gating: str                     # "softmax" | "sigmoid"
    tokens: int                     # t: the conversation's tokens read
    experts: list[list[int]]        # [layer][t * k]: token j's slot s at j * k + s, in the order route chose them
    weights: list[array]            # [layer] f32 [t * k]: their weights, as combine takes them
    entropy: list[array]            # [layer] f32 [t]: the router's entropy at each token, bits
    load: list[list[int]]           # [layer][n_expert]: the tokens that chose each expert
    share: list[list[float]]        # [layer][n_expert]: the sum of each expert's weights over the tokens
    seconds: float

    def mean_entropy(self) -> list[float]:
        return [math.fsum(e) / max(1, len(e)) for e in self.entropy]


async def read(engine, ids: list[int]) -> Routing:
    """The routing of `ids` from position 0 (the caller keeps the chat's KV cache and states aside: the module doc)."""
    cfg, t0 = engine.cfg, time.perf_counter()
    if not cfg.n_expert:
        raise ValueError("this model has no router: every layer's feed-forward is dense")
    if not 1 <= len(ids) <= engine.n_ctx:
        raise ValueError(f"{len(ids)} tokens to read: 1 .. {engine.n_ctx} (the context)")
    layers, k, E = list(cfg.routed_layers), cfg.n_expert_used, cfg.n_expert
    names = [n for il in layers for n in (f"ffn_moe_logits-{il}", f"ffn_moe_topk-{il}", f"ffn_moe_weights_norm-{il}")]
    experts: list[list[int]] = [[] for _ in layers]
    weights = [array("f") for _ in layers]
    entropy = [array("f") for _ in layers]
    for start in range(0, len(ids), engine.max_batch):
        chunk = ids[start:start + engine.max_batch]
        raw = await engine.traced(chunk, start, names)
        for i, il in enumerate(layers):
            experts[i] += struct.unpack(f"<{len(chunk) * k}I", raw[f"ffn_moe_topk-{il}"])
            weights[i].frombytes(raw[f"ffn_moe_weights_norm-{il}"])
            logits = array("f", raw[f"ffn_moe_logits-{il}"])
            entropy[i].extend(entropy_bits(logits[j * E:(j + 1) * E], cfg.gating) for j in range(len(chunk)))
    load = [[0] * E for _ in layers]
    share = [[0.0] * E for _ in layers]
    for i in range(len(layers)):
        for e, w in zip(experts[i], weights[i]):
            load[i][e] += 1
            share[i][e] += w
    return Routing(layers, E, k, cfg.gating, len(ids), experts, weights, entropy, load, share,
                   time.perf_counter() - t0)
