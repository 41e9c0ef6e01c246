"""The worker's test and benchmark hooks (Pyodide only): what tests/browser and `lab bench --backend browser` ask the
page's worker that the page itself never does. Most are id-answered questions (lab/worker/protocol.py `answered`);
bytes cross as base64, since the asker is a test in CPython.

The ones that step the engine on ids of their own (last-logits, greedy-ids, profile, warm) overwrite the KV cache,
so they drop the conversation first. None of them is needed by the product: the router routes them all the same.
"""

from __future__ import annotations

import base64
import time
from array import array

import js
from pyodide.ffi import to_js

from lab.instruments import kernelcheck, weightread
from lab.instruments.training import Trainer
from lab.instruments import profile as gpu_profile
from lab.instruments.kvview import cache_values
from lab.instruments.memory import recurrent_buffers
from lab.settings import Settings
from lab.worker.protocol import answered
from lab.worker import cards
from lab.worker.state import Loaded, Worker, clear_staging


def _fresh(w: Worker) -> Loaded:
    """The loaded model with its conversation dropped, for a hook whose steps overwrite the KV cache."""
    w.state.loaded = w.loaded().fresh()
    return w.state.loaded


@answered
async def kv_rows(msg: dict, w: Worker) -> dict:
    """The K and V rows at `positions` of every layer, f32 [len(positions), n_layer, 2, kvd] in base64 (an f16 cache's
    values widened), read straight from the caches (not through lab/instruments/kvview.py's kernel), for a test to
    compute norms on its own."""
    engine = w.loaded().engine
    kvd, vb = engine.cfg.kv_dim, engine.kv_value_bytes
    positions = [int(p) for p in msg["positions"]]
    lo, hi = min(positions), max(positions) + 1
    layers = []
    for pair in engine.kv_buffers:
        layers.append([await engine.device.read(b, vb * kvd * lo, vb * kvd * (hi - lo)) for b in pair])
    raw = b"".join(layers[il][kv][vb * kvd * (p - lo):vb * kvd * (p - lo + 1)]
                   for p in positions for il in range(len(layers)) for kv in (0, 1))
    rows = array("f", cache_values(raw, vb)).tobytes()
    return {"kvd": kvd, "n_layer": len(layers), "layers": list(engine.kv_layers), "kv_type": engine.kv_type,
            "rows": base64.b64encode(rows).decode()}


@answered
async def state_bytes(msg: dict, w: Worker) -> dict:
    """The raw bytes of every conv state (whole rings), delta-net recurrent state (by layer) and snapshot of them (by
    slot), in base64, read straight from the buffers (not through lab/instruments/memory.py), for a test to check the
    memory card's numbers and Forget's zeros on its own."""
    engine = w.loaded().engine
    read = engine.device.read
    conv = {str(il): base64.b64encode(await read(b)).decode() for il, b in engine.state_buffers.items()}
    delta = {str(il): base64.b64encode(await read(b)).decode() for il, b in recurrent_buffers(engine).items()}
    snaps = [base64.b64encode(await read(b)).decode() for b in engine.scratch.snapshots]
    return {"conv": conv, "delta": delta, "snapshots": snaps, "held": list(engine.held)}


@answered
async def last_logits(msg: dict, w: Worker) -> dict:
    """The logits after prefilling raw prompt ids from position 0 (the prefill's last row: what the next token is
    chosen from), f32 in base64, for the architecture parity test. The chat's cache is dropped."""
    lo = w.loaded()
    lo.session.reset()
    engine = lo.engine
    engine.step([int(i) for i in msg["ids"]], 0)
    raw = await engine.device.read(engine.scratch.logits, 0, 4 * engine.cfg.n_vocab)
    return {"logits": base64.b64encode(raw).decode()}


@answered
async def train_grads(msg: dict, w: Worker) -> dict:
    """The training step's LoRA gradients in the page, for the whole-model gradient check
    (tests/browser/test_gradcheck_page.py): an adapter of `rank` (alpha) set to `params` (f32, base64, laid out as
    lab.engine.lora.Lora.params), the step's gradients on `windows` of T tokens and its loss. The Training card's run
    and the chat's cache are dropped first; the adapter is taken off after."""
    lo = _fresh(w)
    lo.drop(cards.TRAINING)
    windows = [[int(i) for i in win] for win in msg["windows"]]
    tr = Trainer(lo.engine, T=int(msg["T"]), batch=len(windows), rank=int(msg["rank"]), alpha=float(msg["alpha"]),
                 seed=int(msg.get("seed", 0)))
    try:
        lo.engine.device.write(tr.lora.params, base64.b64decode(msg["params"]))
        loss = await tr.gradients(windows)
        raw = await lo.engine.device.read(tr.grads, 0, 4 * tr.lora.n_params)
    finally:
        tr.close()
    return {"loss": loss, "grads": base64.b64encode(raw).decode()}


@answered
async def greedy_ids(msg: dict, w: Worker) -> dict:
    """n greedy ids after raw prompt ids, straight through the engine's prefill and decode steps (no chat template, no
    end-of-generation stop), as llama.cpp's architecture fixtures were made. The chat's cache is dropped: the steps
    overwrite it. With `session`, the ids go through the worker's own Session instead (a turn: it reuses what the
    last one left, KV cache and a hybrid's states, and stops at an end-of-generation id), and `reused` says how many
    prompt ids it did not run again."""
    lo = w.loaded()
    if msg.get("session"):
        res = await lo.session.generate([int(i) for i in msg["ids"]], Settings(greedy=True), int(msg["n"]))
        return {"ids": res.ids, "reused": res.reused, "stop": res.stop}
    lo.session.reset()
    ids, n, engine = [int(i) for i in msg["ids"]], int(msg["n"]), lo.engine
    out = []
    engine.step(ids, 0)
    for i in range(n):
        out.append(await engine.argmax())
        if i + 1 < n:
            engine.step(None, len(ids) + i)     # ids[0] already holds the argmax
    return {"ids": out}


@answered
async def kernel_check(msg: dict, w: Worker) -> dict:
    """Kernel cases (lab/instruments/kernelcheck.py) on the given inputs, their outputs back, base64 both ways (a test
    builds the inputs in CPython). Every buffer it makes is its own and freed; the engine's are never touched."""
    device = w.device()
    kernels = w.kernels()
    results, before = [], len(device.buffers)
    try:
        for case in msg["cases"]:
            case["inputs"] = {k: base64.b64decode(v) for k, v in case["inputs"].items()}
            r = await kernelcheck.run(device, kernels, case)
            results.append({"outputs": {k: base64.b64encode(v).decode() for k, v in r["outputs"].items()},
                            "kernels": r["kernels"]})
    finally:
        clear_staging(device)       # the check's numbers were read through it
    return {"results": results, "adapter": device.info.summary(),
            "buffers": {"before": before, "after": len(device.buffers)}}


@answered
async def weight_bytes(msg: dict, w: Worker) -> dict:
    """Bytes [offset, offset + size) of one file tensor, read back from the GPU buffers it was uploaded into
    (lab/instruments/weightread.py), in base64: the large-file test compares them with the file."""
    engine = w.loaded().engine
    raw = await weightread.tensor_bytes(w.device(), engine.weights, msg["name"], int(msg["offset"]), int(msg["size"]))
    return {"bytes": base64.b64encode(raw).decode()}


@answered
async def profile(msg: dict, w: Worker) -> dict:
    """GPU time of the step the chat runs for t tokens at pos (`families`: and of each kernel family alone), on this
    adapter, by timestamp queries (lab/instruments/profile.py), after warm_ms of GPU work. The step runs on random ids
    and writes K/V over the conversation's, so the conversation goes first."""
    eng = _fresh(w).engine
    t, pos, reps = int(msg["t"]), int(msg["pos"]), int(msg.get("reps") or gpu_profile.REPS)
    if msg.get("warm_ms"):
        await gpu_profile.warm(eng, float(msg["warm_ms"]))
    gpu_profile.prime(eng, t, pos)
    if msg.get("families"):
        rows = await gpu_profile.by_family(eng, t, pos, reps)
    else:
        rows = [{"family": "whole step", "dispatches": eng.dispatches_per_step(t, pos=pos),
                 "gpu_us": round(await gpu_profile.whole_step(eng, t, pos, reps) * 1e6, 1)}]
    return {"t": t, "pos": pos, "rows": rows}


async def warm(msg: dict, w: Worker) -> None:
    """lab.instruments.profile.warm: a page's turn follows seconds of typing, so a benchmark that compares it with
    native steps (which follow each other) warms the page's GPU first. The steps write K/V, so the conversation goes
    first."""
    steps = await gpu_profile.warm(_fresh(w).engine, float(msg["ms"]))
    w.post({"type": "warm", "steps": steps})


async def ffi_cost(msg: dict, w: Worker) -> None:
    """Microseconds of one Python->JS call (a JS function that returns a boolean) and of one small `to_js` (the
    16-byte step uniform a decode step writes): the per-call price that call counts multiply. With a model loaded,
    also the milliseconds of a 4-byte read-back with the queue idle: a mapAsync round trip to the GPU process with no
    work to wait for. The calls are made here, straight to JS, so that nothing of Python's is timed with them."""
    n = int(msg.get("n") or 2000)
    t0 = time.perf_counter()
    for _ in range(n):
        js.labStopRequested()
    t1 = time.perf_counter()
    data = bytes(16)
    for _ in range(n):
        to_js(data)
    t2 = time.perf_counter()
    read_ms = None
    if w.state.loaded is not None:
        engine = w.state.loaded.engine
        await engine.argmax()
        t3 = time.perf_counter()
        for _ in range(20):
            await engine.argmax()
        read_ms = round((time.perf_counter() - t3) / 20 * 1e3, 3)
    w.post({"type": "ffi-cost", "n": n, "call_us": round((t1 - t0) / n * 1e6, 2),
            "to_js_us": round((t2 - t1) / n * 1e6, 2), "read_ms": read_ms})
