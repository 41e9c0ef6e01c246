"""A model in place in the worker, and the old one gone: the two ends every way a model arrives share (a file's load,
lab/worker/router.py `_load`; a model trained from scratch in the Training card, lab/worker/scratch.py).

    unload(w)                                    # the model before: its conversation, every card's state, its engine
    w.post(arrived(w, engine, header, tok, seq, upload_s=..., build_s=...))    # the new one held, its "loaded" message

What it does not know: where the weights came from (a File, the GPU's own draw), JS.
"""

from __future__ import annotations

from lab.engine.session import Session
from lab.instruments import memory, probes, routing
from lab.worker import embedder, retrieval, training
from lab.worker.state import Loaded, State, Worker


def unload(w: Worker) -> None:
    """The loaded model gone: its conversation, every card's state (lab/worker/cards.py), then its engine."""
    old = w.state.loaded
    w.state = State(w.state.device, None, w.state.check_kernels)
    if old is not None:
        old.close()


def arrived(w: Worker, engine, header, tok, seq, *, upload_s: float, build_s: float, made: bool = False) -> dict:
    """The engine held as the loaded model, with a new session; returns the "loaded" message: what every card needs
    of it. made: its weights were drawn here, not read from a file (nothing was uploaded)."""
    cfg = engine.cfg
    w.state.loaded = Loaded(engine, header, tok, Session(engine, tok))
    nbytes = engine.weights.nbytes
    return {"type": "loaded", "seq": seq, "stats": {
        "weight_bytes": nbytes, "upload_s": round(upload_s, 3), "build_s": round(build_s, 3),
        "upload_mb_s": None if made else round(nbytes / 1e6 / max(upload_s, 1e-9), 1), "made": made,
        "n_ctx": engine.n_ctx, "kv_bytes_per_token": cfg.kv_bytes_per_token(engine.kv_value_bytes),
        "dispatches_per_token": engine.dispatches_per_step(1), "kv_type": engine.kv_type,
        "int8_prefill": engine.int8_prefill, "max_batch": engine.max_batch,
        "kv": {"n_layer": cfg.n_layer, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
               "bytes_per_value": engine.kv_value_bytes, "kv_type": engine.kv_type,
               "bytes_per_token": cfg.kv_bytes_per_token(engine.kv_value_bytes), "n_ctx": engine.n_ctx,
               "layers": list(engine.kv_layers),
               "window": [cfg.sliding_window if s else 0 for s in cfg.sliding]},
        "memory": memory.describe(engine),
        "experts": routing.describe(engine),
        "n_head": cfg.n_head, "n_embd": cfg.n_embd,
        "probe": {"window": probes.WINDOW, "lens_positions": probes.LENS_POSITIONS},
        "rope": {"base": cfg.rope_base, "neox": cfg.rope_neox, "n_rot": cfg.n_rot, "head_dim": cfg.head_dim,
                 "arch": cfg.arch, "no_rope": [il for il in range(cfg.n_layer) if not cfg.rotates(il)]},
        "retrieval": retrieval.defaults(engine.n_ctx),
        "embedder": embedder.defaults(engine),
        "training": training.defaults(engine),
        "eog": sorted(tok.eos_ids), "add_bos": tok.add_bos}}
