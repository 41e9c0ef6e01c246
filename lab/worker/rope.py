"""The worker's side of the RoPE demo card (lab/worker/router.py routes "probe-rope" here; the card is web/rope.js).

    probe-rope {pos, layer, seq}  ->  "rope" {seq, n, pos, layer, n_head, n_head_kv, head_dim, n_rot, freq_base,
                                              freq_scale, factors, neox, scale, window, softcap, q, k, probs, ms}

q [n_head, head_dim], k [pos + 1, n_head_kv, head_dim] (before RoPE) and probs [n_head, pos + 1] (the engine's
attention probabilities of the query at pos) arrive as Float32Arrays; the page rotates q and k with either pairing
and compares its scores with probs. `n` is the conversation's length when asked, so the page can drop an answer
about a conversation it no longer shows.

What it does not know: the page, which pairing the user picked (the page rotates; this only reads the engine).
"""

from __future__ import annotations

from lab.worker.state import Worker


async def run(msg: dict, w: Worker) -> None:
    """Answer one probe-rope request."""
    lo, probes = w.loaded(), w.probes()
    ids = lo.context
    if not ids:
        raise RuntimeError("no conversation to take q and k from")
    pos = int(msg.get("pos", len(ids) - 1))
    r = await probes.rope_inputs(ids, lo.session.cached_prefix(ids), pos, int(msg.get("layer", 0)))
    f32 = w.f32
    w.post({"type": "rope", "seq": msg.get("seq"), "n": len(ids), "pos": r.pos, "layer": r.layer, "n_head": r.n_head,
            "n_head_kv": r.n_head_kv, "head_dim": r.head_dim, "n_rot": r.n_rot, "freq_base": r.freq_base,
            "freq_scale": r.freq_scale, "factors": r.factors, "neox": r.neox, "scale": r.scale, "window": r.window,
            "softcap": r.softcap, "q": f32(r.q), "k": f32(r.k), "probs": f32(r.probs), "ms": r.ms})
