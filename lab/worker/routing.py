"""The worker's side of the Router card (web/routing.js): a mixture-of-experts model's routing over the conversation
(lab/instruments/routing.py), and one expert's ablation through the experiments' bench (the "expert" intervention
site, lab/instruments/experiments.py `Experiments.expert_ablation`).

    router {seq}  ->  "router" {seq, layers, n_expert, k, gating, tokens (the conversation's pieces), experts (f32
        [layers, t, k]: the chosen experts' ids, exact as floats), weights (f32 [layers, t, k]), entropy (f32
        [layers, t], bits), load [layer][expert] (tokens), share [layer][expert] (summed weights), mean_entropy
        [layer], seconds}
    router-ablate {layer, expert, max_new, seq}  ->  "router-ablation" {seq, layer, expert, top5_before, top5_after,
        kl_bits, greedy_before, greedy_after, first_change, seconds, tokens (the conversation's length),
        pieces {id: piece}}

Both run over the conversation (the prompt and the replies so far, as the context strip shows it) from position 0,
inside `Experiments.kept` of the chat's session: the chat's KV cache and states go aside and come back, so its next
turn is the one it would have been. A dense model has no router: both are refused by name (the page asks neither).

Nothing is kept here: the page holds what it was sent. The runs' buffers are the Experiments card's state
(cards.EXPERIMENTS: Forget wipes them with the rest and reads them back, then closes it); the router's rows
(`router logits`, `chosen experts`, `expert weights`) are the engine's CONVERSATION scratch, wiped with the rest.

What it does not know: how the routing is read or an expert ablated (lab/instruments), the page.
"""

from __future__ import annotations

from array import array

from lab.instruments import routing
from lab.instruments.interventions import InterventionError
from lab.settings import MAX_NEW
from lab.worker.experiments import bench
from lab.worker.state import Worker

ABLATION_NEW = 8        # greedy tokens after the conversation, with and without the expert


def _conversation(w: Worker):
    lo = w.loaded()
    if not lo.engine.cfg.n_expert:
        raise InterventionError("this model has no router: every layer's feed-forward is dense (no mixture of "
                                "experts)")
    if not lo.context:
        raise InterventionError("no conversation to read the routing of: chat first")
    return lo, list(lo.context)


async def run(msg: dict, w: Worker) -> None:
    lo, ids = _conversation(w)
    exp, tok = bench(lo), lo.tokenizer
    async with exp.kept(lo.session):
        r = await routing.read(lo.engine, ids)
    w.post({"type": "router", "seq": msg.get("seq"), "layers": r.layers, "n_expert": r.n_expert, "k": r.k,
            "gating": r.gating, "tokens": [tok.piece(i) for i in ids],
            "experts": w.f32(array("f", [e for row in r.experts for e in row]).tobytes()),
            "weights": w.f32(b"".join(a.tobytes() for a in r.weights)),
            "entropy": w.f32(b"".join(a.tobytes() for a in r.entropy)),
            "load": r.load, "share": r.share, "mean_entropy": r.mean_entropy(), "seconds": round(r.seconds, 3)})


async def ablate(msg: dict, w: Worker) -> None:
    lo, ids = _conversation(w)
    cfg, tok = lo.engine.cfg, lo.tokenizer
    try:
        layer, expert = int(msg.get("layer")), int(msg.get("expert"))
    except (TypeError, ValueError):
        raise InterventionError(f"layer {msg.get('layer')!r}, expert {msg.get('expert')!r}: whole numbers") from None
    max_new = min(int(msg.get("max_new") or ABLATION_NEW), MAX_NEW, lo.engine.n_ctx - len(ids))
    exp = bench(lo)
    async with exp.kept(lo.session):
        r = await exp.expert_ablation(ids, layer, expert, max(0, max_new), set(tok.eos_ids))
    shown = {i for i, _ in r["top5_before"] + r["top5_after"]} | set(r["greedy_before"]) | set(r["greedy_after"])
    w.post({"type": "router-ablation", "seq": msg.get("seq"), **r, "seconds": round(r["seconds"], 3),
            "tokens": len(ids), "n_expert": cfg.n_expert, "pieces": {str(i): tok.piece(i) for i in sorted(shown)}})
