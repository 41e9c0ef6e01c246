"""The gradient checker (issue #43): a whole model's LoRA gradients from the GPU's training step against central
differences of the same loss in float64 (lab/host/reference/training.py), at sampled entries of every adapter tensor,
the worst relative error reported per tensor. `lab gradcheck MODEL` runs it; tests/engine/test_training.py holds it.

The adapter is set to random A and B (B nonzero: at training's start B = 0, where every gradient of A is 0 and a
check of A would hold nothing), the windows are random token ids. Per tensor the entries checked are the one with
the largest GPU gradient and `samples - 1` random ones; the tensor's error is max |gpu - fd| over them divided by the
largest |fd| among them (an entry whose gradient is tiny next to its tensor's is held to the tensor's scale, not its
own: f32 gradients carry an error of the tensor's scale times ~1e-5, not of each entry's).
"""

from __future__ import annotations

import asyncio
import math
import random

import numpy as np

H = 1e-4    # the central difference's step: the float64 loss's rounding (~1e-15) / H stays ~1e-11, the h^2 term ~1e-8
TOL = 1e-3  # worst relative error per tensor: f32 sums over ~1e3 terms a gradient and ~1e5 a loss (measured: see
            # docs/training.md), with an order of magnitude of margin; a wrong op (rope_back left out, a
            # transposed factor) gives errors of order 1


def adapter_arrays(lora, raw: bytes) -> dict:
    """{name: (A [r, n_in], B [n_out, r])} of a Lora's params (or gradients) buffer's bytes."""
    v = np.frombuffer(raw, np.float32)
    return {n: (v[t.a:t.a + t.rank * t.n_in].reshape(t.rank, t.n_in),
                v[t.b:t.b + t.n_out * t.rank].reshape(t.n_out, t.rank)) for n, t in lora.targets.items()}


def random_params(lora, seed: int, b_std: float = 0.05) -> bytes:
    """A as training starts it (lab.engine.lora.initial), B normal with std b_std (`lora`: a Lora, or anything with
    its `targets`)."""
    from lab.engine.lora import initial
    a_start = np.frombuffer(initial(lora.targets, seed), np.float32).copy()
    rng = np.random.default_rng(seed)
    for t in lora.targets.values():
        a_start[t.b:t.b + t.n_out * t.rank] = rng.normal(0.0, b_std, t.n_out * t.rank)
    return a_start.tobytes()


def check(path, *, T: int = 16, batch: int = 1, rank: int = 4, alpha: float = 8.0, samples: int = 2, seed: int = 0,
          targets=None, disable=(), engine=None, full: bool = False, only: tuple[str, ...] = (),
          masked: bool = False) -> dict:
    """The report: the GPU's and the oracle's losses, each tensor's worst relative error and the worst of all.
    full: full fine-tuning's gradients, of every weight and trained norm of the model (an F32 file), at its own
    weights; `only`: the central differences taken only for the tensors whose names hold one of these strings (a big
    vocabulary's float64 forward is slow; full fine-tuning still requires every tensor's gradient to exist). masked: the loss
    over an answer's tokens alone (`answer_masks`: chat turns' training, lab.instruments.chatdata)."""
    from lab.engine.lora import DEFAULT_TARGETS
    from lab.host.reference.training import LoraLoss
    from lab.instruments.training import Trainer
    if engine is None:
        engine = open_engine(path, T, disable)
    if full:
        return _check_full(path, engine, T=T, batch=batch, samples=samples, seed=seed, only=only, masked=masked)
    tr = Trainer(engine, T=T, batch=batch, rank=rank, alpha=alpha, targets=targets or DEFAULT_TARGETS, seed=seed)
    try:
        rng = random.Random(seed)
        wins = [[rng.randrange(engine.cfg.n_vocab) for _ in range(T)] for _ in range(batch)]
        masks = answer_masks(rng, T, batch) if masked else None
        engine.device.write(tr.lora.params, random_params(tr.lora, seed))
        loss = asyncio.run(tr.gradients(wins, masks))
        params = adapter_arrays(tr.lora, engine.device.read_sync(tr.lora.params))
        grads = adapter_arrays(tr.lora, engine.device.read_sync(tr.grads))
    finally:
        tr.close()
    oracle = LoraLoss(path, params, alpha, masks)
    loss64 = oracle.loss(wins)
    rows = _adapter_rows(params, grads, oracle, wins, samples, np.random.default_rng(seed), only)
    worst = max(r["worst_rel_err"] for r in rows)
    return {"model": str(path), "T": T, "batch": batch, "rank": rank, "alpha": alpha, "masked": masked, "loss_gpu": loss,
            "loss_float64": loss64, "loss_rel_err": abs(loss - loss64) / abs(loss64), "tensors": rows,
            "worst_rel_err": worst, "tolerance": TOL, "ok": worst <= TOL and math.isfinite(loss)}


def _compared(g: np.ndarray, central, samples: int, pick) -> dict:
    """One tensor's row of a report: its gradient g at its largest entry and samples - 1 random ones against
    central(entry), the central difference there; the error is max |g - fd| over them divided by the largest |fd|."""
    entries = [np.unravel_index(int(np.argmax(np.abs(g))), g.shape)]
    entries += [tuple(int(pick.integers(0, n)) for n in g.shape) for _ in range(samples - 1)]
    fd = np.array([central(e) for e in entries])
    got = np.array([g[e] for e in entries], np.float64)
    scale = float(np.max(np.abs(fd)))
    err = float(np.max(np.abs(got - fd))) / scale if scale > 0 else float(np.max(np.abs(got)))
    return {"worst_rel_err": err, "largest_grad": scale, "entries": len(entries)}


def _adapter_rows(params: dict, grads: dict, oracle, batch, samples: int, pick, only: tuple[str, ...] = ()) -> list:
    """The rows of every adapter matrix's A and B (those whose names hold one of `only`, when given), the oracle's
    central(batch, name, "A" | "B", entry, H) their reference."""
    return [{"tensor": f"{name}.lora_{which.lower()}",
             **_compared(grads[name][k], lambda e, n=name, w=which: oracle.central(batch, n, w, e, H), samples, pick)}
            for name in params if not only or any(o in name for o in only) for k, which in enumerate("AB")]


def model_grads(tr) -> dict:
    """{file tensor name: its gradient as numpy shapes it (rows first)} of a full fine-tune's Trainer: each matrix's
    rows read out of its weight's (a stacked run's tensors each their own rows), each trained vector's (a fused
    vector's file tensors each their own floats: qwen2's attn_q/k/v.bias)."""
    from lab.instruments.training import tensor_pieces
    dev, w, header = tr.device, tr.engine.weights, tr.engine.header
    shapes = {t.name: tuple(reversed(t.shape)) for t in header.tensors}
    runs = {run: np.concatenate([np.frombuffer(dev.read_sync(p.buffer), np.float32).reshape(p.n_rows, m.cols)
                                 for p in tr.ts.wgrads[run]]) for run, m in w.matrices.items()}
    out = {}
    for name, pieces in tensor_pieces(w, header).items():     # a tensor's rows from its pieces, in its own order
        out[name] = np.concatenate([runs[m.name][p.row:p.row + p.rows] for m, p in pieces])[:shapes[name][0]]
    for name, buf in tr.ts.vgrads.items():     # a norm [n], a conv kernel [n_embd, l_cache] (lfm2) as its file shape
        out[name] = np.frombuffer(dev.read_sync(buf), np.float32).reshape(shapes.get(name, (-1,)))
    inside = w.in_vectors()
    for name, (vector, offset, size) in inside.items():     # the fused Q/K/V biases: the file's three, each its floats
        out[name] = out[vector][offset // 4:(offset + size) // 4]
    for vector, _, _ in inside.values():
        out.pop(vector, None)
    return out


def answer_masks(rng: random.Random, T: int, batch: int) -> list[list[bool]]:
    """Each window's trained tokens as a chat turn's would be: a prompt untrained, then an answer from a random
    token to another, then padding untrained; windows of different answers (the step's divisor counts them all)."""
    out = []
    for _ in range(batch):
        a = rng.randrange(1, T - 1)
        b = rng.randrange(a + 1, T + 1)
        out.append([a <= i < b for i in range(T)])
    return out


def _check_full(path, engine, *, T: int, batch: int, samples: int, seed: int, only: tuple[str, ...] = (),
                masked: bool = False) -> dict:
    from lab.host.reference.training import ModelLoss
    from lab.instruments.training import Trainer
    tr = Trainer(engine, T=T, batch=batch, full=True)
    try:
        rng = random.Random(seed)
        wins = [[rng.randrange(engine.cfg.n_vocab) for _ in range(T)] for _ in range(batch)]
        masks = answer_masks(rng, T, batch) if masked else None
        loss = asyncio.run(tr.gradients(wins, masks))
        grads = model_grads(tr)
    finally:
        tr.close()
    oracle = ModelLoss(path, masks)
    loss64 = oracle.loss(wins)
    pick = np.random.default_rng(seed)
    rows = [{"tensor": name, **_compared(g, lambda e, name=name: oracle.central(wins, name, e, H), samples, pick)}
            for name, g in grads.items() if not only or any(o in name for o in only)]
    worst = max(r["worst_rel_err"] for r in rows)
    # every parameter of the file has its gradient checked: one the step trains but this check cannot find is a
    # failure, not a tensor left out of the report
    missing = sorted({t.name for t in tr.engine.header.tensors} - set(grads) - {"rope_freqs.weight"})
    return {"model": str(path), "T": T, "batch": batch, "full": True, "masked": masked, "loss_gpu": loss, "loss_float64": loss64,
            "loss_rel_err": abs(loss - loss64) / abs(loss64), "tensors": rows, "worst_rel_err": worst,
            "missing": missing, "tolerance": TOL, "ok": worst <= TOL and math.isfinite(loss) and not missing}


def open_engine(path, T: int, disable=(), max_batch: int | None = None, device=None, logits_all: bool = False):
    """A native engine for training windows of T tokens: steps of T rows (or max_batch), an f32 KV cache of T
    positions (on `device`, or a native device of its own)."""
    from lab.host.loading import open_engine as opened
    return opened(path, T, disable=disable, device=device, max_batch=max_batch or T, logits_all=logits_all)[2]


def check_contrastive(path, *, T: int = 12, pairs: int = 3, rank: int = 4, alpha: float = 8.0, samples: int = 2,
                      seed: int = 0, temperature: float = 0.05, only: tuple[str, ...] = (), engine=None,
                      tokenizer=None) -> dict:
    """The contrastive loss's LoRA gradients (lab/instruments/contrastive.py) against float64 central differences
    (lab/host/reference/contrastive.py), as `check` does for the next-token loss: random pairs of random ids of
    mixed lengths (the query side shorter than T, the passage T), the adapter at random A and B. `only`: the
    adapter's matrices checked (names holding one of these strings), every other's gradient still read.
    `tokenizer`: only its add_bos and bos_id are read (a test puts a BOS before windows of a vocabulary without)."""
    from lab.host.loading import open_engine as opened
    from lab.host.reference.contrastive import ContrastiveLoss
    from lab.instruments.contrastive import Contrastive
    if engine is None:
        _header, tok, engine, _t = opened(path, T + 1, max_batch=T + 1)
        tokenizer = tokenizer or tok
    c = Contrastive(engine, tokenizer, T=T, pairs=pairs, rank=rank, alpha=alpha, seed=seed, temperature=temperature)
    try:
        rng = random.Random(seed)
        batch = [([rng.randrange(engine.cfg.n_vocab) for _ in range(rng.randint(2, T - 1))],
                  [rng.randrange(engine.cfg.n_vocab) for _ in range(T)]) for _ in range(pairs)]
        lora = c.trainer.lora
        engine.device.write(lora.params, random_params(lora, seed))
        loss = asyncio.run(c.gradients(batch))
        params = adapter_arrays(lora, engine.device.read_sync(lora.params))
        grads = adapter_arrays(lora, engine.device.read_sync(c.trainer.grads))
    finally:
        c.close()
    bos = tokenizer.bos_id if tokenizer.add_bos and tokenizer.bos_id is not None else None
    oracle = ContrastiveLoss(path, params, alpha, bos, temperature)
    loss64 = oracle.loss(batch)
    rows = _adapter_rows(params, grads, oracle, batch, samples, np.random.default_rng(seed), only)
    worst = max(r["worst_rel_err"] for r in rows)
    return {"model": str(path), "T": T, "pairs": pairs, "rank": rank, "alpha": alpha, "temperature": temperature,
            "loss_gpu": loss, "loss_float64": loss64, "loss_rel_err": abs(loss - loss64) / abs(loss64),
            "tensors": rows, "worst_rel_err": worst, "tolerance": TOL, "ok": worst <= TOL and math.isfinite(loss)}
