"""The worker's Python side (Pyodide only): answers the page's messages, relayed by web/worker.js.

Messages in:  init | read-header {file, n_ctx?} | load {file, n_ctx?, int8?} | chat {messages, settings, max_new} | reset
              probe-embedding {id, index} | probe-inspect {start, end, attention, residual, lens} | forget {skip?}
              kv-rows {id, positions} (tests: raw K/V rows in base64, read without lab/instruments/kvview.py's kernel)
              greedy-ids {id, ids, n} | last-logits {id, ids} (tests: greedy ids / the last row's logits of a raw
              prompt, the architecture parity test)
              probe-rope {pos, layer, seq} (the RoPE demo: lab/rope.py, answered by "rope")
              kernel-check {id, cases} (tests: kernel cases through lab/instruments/kernelcheck.py, inputs in base64)
              ffi-cost {n} (lab bench --backend browser: what one Python->JS call costs here)
              warm {ms} (lab bench --backend browser --warm-gpu: the GPU kept busy before a measured turn; drops
              the conversation)
              profile {t, pos, families, reps, warm_ms} (lab bench --backend browser --profile: GPU time of a step,
              lab/instruments/profile.py, after warm_ms of GPU work; it runs on random ids, so the conversation is dropped first)
              verify {file, seq} | verify-kernels {seq} (the verification card: lab/instruments/verify.py)
              perplexity {text, n_ctx, seq} (the perplexity card: lab/instruments/perplexity.py, answered by
              perplexity-progress and perplexity; its cancel is "stop")
Messages out: gpu | selftest | model-info | loaded | prompt | token | done | reset | error {where, message}
              embedding | inspection | forget | kv-view | rope (panels' data: the page renders it and computes nothing)
              kernel-check {id, results | error, adapter, buffers {before, after}}
              ffi-cost {n, call_us, to_js_us, read_ms}
              profile {t, pos, rows [{family, dispatches, gpu_us, ...}]} | warm {steps}
(`load-progress`, `cancel-load` and `stop` are handled by worker.js itself, since Python is busy then.)

Python only ever sees the header prefix of a model file (and the values of lab.format.model.HOST_TENSORS: llama 3's
rope_freqs, a few hundred bytes): the weights go from File.slice to queue.writeBuffer in worker.js
(`labUpload`), 32 MB at a time, from a plan Python made.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from dataclasses import dataclass, field

import js
from pyodide.ffi import to_js

from lab.engine import budget
from lab.engine.engine import Engine
from lab.engine.load import validate
from lab.engine.scratch import prefill_batch
from lab.engine.session import Session
from lab.format import gguf
from lab.format.model import host_tensors
from lab.gpu.browser import open_browser
from lab.gpu.shaders import KernelCache
from lab.instruments import forget, kernelcheck, kvview, probes, profile, selftest, weightread
from lab.instruments.probes import Probes
from lab.ops.weights import UPLOAD_CHUNK
from lab.settings import MAX_NEW, Settings, context_for
from lab.text import chat
from lab.text.tokenizer import Tokenizer
from lab.worker import perplexity, rope, verify

_lock = asyncio.Lock()   # one message at a time: a second file picked mid-load waits its turn


@dataclass
class Loaded:
    """A loaded model and its conversation. Replaced whole, never edited field by field: on load, unload, Forget,
    new chat and device loss, so that no handler can keep a piece of an old conversation by forgetting a key."""
    engine: Engine
    header: gguf.Header
    tokenizer: Tokenizer
    session: Session
    probes: Probes | None = None                        # built on the first panel request, freed with the engine
    kv_view: kvview.KvView | None = None                # the KV panel's norms pass, built on the first chat
    context: list[int] = field(default_factory=list)    # ids the page shows: the last prompt and what followed

    def fresh(self) -> Loaded:
        """The same model with no conversation; this one's token lists are emptied in place (they may be shared)."""
        self.drop_conversation()
        return Loaded(self.engine, self.header, self.tokenizer, Session(self.engine, self.tokenizer), self.probes,
                      kv_view=self.kv_view)

    def drop_conversation(self) -> None:
        self.session.reset()
        self.context.clear()


@dataclass
class State:
    device: object = None                # BrowserDevice, None before init and after a lost device
    loaded: Loaded | None = None
    check_kernels: KernelCache | None = None   # pipelines of kernel-check messages (tests); they hold no data


_state = State()
PREFIX = 1 << 20         # first read of a header; grown when the metadata is larger


def post(msg: dict) -> None:
    js.postMessage(to_js(msg, dict_converter=js.Object.fromEntries))


async def handle(msg) -> None:
    kind = msg.type
    async with _lock:
        try:
            if kind == "init":
                await _init()
            elif kind == "load":
                await _load(msg.file, int(msg.n_ctx) if getattr(msg, "n_ctx", None) else None, int(msg.seq),
                            bool(getattr(msg, "int8", False)))
            elif kind == "chat":
                await _chat(msg.to_py())
            elif kind == "reset":
                _reset()
            elif kind == "probe-embedding":
                await _probe_embedding(int(msg.id), int(msg.index))
            elif kind == "probe-inspect":
                await _probe_inspect(msg.to_py())
            elif kind == "forget":
                await _forget(msg.to_py())
            elif kind == "probe-rope":
                await rope.run(_probes(), _loaded(), msg.to_py(), post, _f32)
            elif kind == "kv-rows":
                await _kv_rows(msg.to_py())
            elif kind == "greedy-ids":
                await _greedy_ids(msg.to_py())
            elif kind == "last-logits":
                await _last_logits(msg.to_py())
            elif kind == "kernel-check":
                await _kernel_check(msg.to_py())
            elif kind == "weight-bytes":         # tests: a tensor's bytes read back from the GPU (lab/instruments/weightread.py)
                await weightread.answer(msg.to_py(), _state.device, _state.loaded and _state.loaded.engine, post)
            elif kind == "verify":
                await verify.run_verify(_state, msg, post)
            elif kind == "verify-kernels":
                await verify.run_kernels(_state, msg, post)
            elif kind == "perplexity":
                await perplexity.run(_loaded(), msg.to_py(), post, js.labStopRequested, js.labStopClear)
            elif kind == "profile":
                await _profile(msg.to_py())
            elif kind == "warm":
                await _warm(float(msg.ms))
            elif kind == "ffi-cost":
                await _ffi_cost(int(getattr(msg, "n", 0) or 2000))
            else:
                post({"type": "error", "where": kind, "message": f"unknown message type {kind!r}"})
        except Exception as exc:  # every failure reaches the page as a message, and the worker lives on
            post({"type": "error", "where": kind, "message": str(exc) or type(exc).__name__,
                  "seq": getattr(msg, "seq", None)})


async def _init() -> None:
    device = await open_browser()
    _state.device = device
    device.on_lost(_lost)
    post({"type": "gpu", "info": device.info.summary()})
    result = await selftest.run(device)
    await device.flush_errors()
    for b in device.staging(0):      # it holds the self-test's numbers, not conversation: start from zero
        device.clear(b)
    post({"type": "selftest", "result": result})


def _lost(reason: str) -> None:
    """The GPU went away (driver reset, sleep, another tab's crash, a destroyed device): everything on it is gone, and
    so is everything of the conversation on this side. A new device is asked for at once, so the page can load a
    model again without a reload."""
    global _state
    if _state.loaded is not None:
        _state.loaded.drop_conversation()
        _state.loaded.tokenizer.drop_caches()
    _state = State()
    post({"type": "error", "where": "device",
          "message": f"The GPU device was lost ({reason}); nothing of the conversation was kept. Asking for a new "
                     f"one: load the model again when the GPU line says ready."})
    asyncio.ensure_future(_again())


async def _again() -> None:
    async with _lock:
        try:
            await _init()
        except Exception as exc:  # no adapter any more: the page says so, and a reload is the way back
            post({"type": "error", "where": "init", "message": str(exc) or type(exc).__name__})


async def read_header(file) -> tuple[gguf.Header, int]:
    """Parse the header from a growing prefix of the File; returns it and the bytes read."""
    size = int(file.size)
    want = min(PREFIX, size)
    while True:
        buf = await file.slice(0, want).arrayBuffer()
        try:
            return gguf.read(buf.to_bytes(), file_size=size), want
        except gguf.NeedMoreBytes as more:
            if want >= size:
                raise gguf.GGUFError(f"the file ends inside its header ({size:,} bytes): it is truncated")
            want = min(size, max(more.needed, want * 2))


async def _read_header(file) -> tuple[gguf.Header, dict]:
    """Read and summarize a file's header for the page's model card (nothing is uploaded)."""
    t0 = time.perf_counter()
    header, nread = await read_header(file)
    summary = gguf.summary(header)
    summary.update(file_name=str(getattr(file, "name", "")), prefix_bytes=nread,
                   parse_ms=round((time.perf_counter() - t0) * 1e3, 1))
    return header, summary


def _count(header: gguf.Header, n_ctx: int | None, int8: bool):
    """The load's one validation and one memory budget: (config, tokenizer, budget), with the problem that stops the
    load, if any (the card still shows what could be worked out)."""
    device = _state.device
    try:
        cfg, tok = validate(header)          # every key and tensor checked, named if wrong, before any upload
    except Exception as exc:  # the card goes without a budget; the load reports the problem
        return None, None, None, exc
    counted = budget.count(device.info.limits, header, cfg, context_for(cfg.n_ctx_train, n_ctx),
                           max_batch=prefill_batch(device.info), int8=int8)
    return cfg, tok, counted, None


def _unload() -> None:
    global _state
    old = _state.loaded
    _state = State(_state.device, None, _state.check_kernels)
    if old is not None:
        old.drop_conversation()
        if old.probes is not None:
            old.probes.close()
        if old.kv_view is not None:
            old.kv_view.close()
        old.engine.close()


async def _load(file, n_ctx: int | None, seq: int, int8: bool = False) -> None:
    """Load a model file; `seq` numbers the page's requests, so a load the page gave up on (another file picked, or
    cancel) is stopped at its next chunk and its messages are told apart."""
    device = _state.device
    if device is None:
        raise RuntimeError("no GPU: the lab cannot load a model without WebGPU")
    _unload()
    header, summary = await _read_header(file)
    int8 = int8 and device.info.int8_matrix         # the page offers it only there; a stale flag loads exact
    cfg, tok, counted, problem = _count(header, n_ctx, int8)
    summary["plan"] = counted.card(cfg) if counted is not None else None
    post({"type": "model-info", "summary": summary, "seq": seq})
    if problem is not None:
        raise problem
    budget.check(counted)                        # refused with the numbers before any buffer exists
    n_ctx, batch = counted.n_ctx, counted.counted_for[1]
    t0 = time.perf_counter()
    # The only tensor values Python reads (llama 3's rope_freqs, n_rot/2 floats): one File.slice each, before
    # the plans are built; every weight still goes File.slice -> writeBuffer in labUpload.
    small = {t.name: (await file.slice(t.offset, t.offset + t.nbytes).arrayBuffer()).to_bytes()
             for t in host_tensors(cfg, header)}
    engine = Engine(device, header, cfg, host_values=small, n_ctx=n_ctx, max_batch=batch, int8_prefill=int8,
                    counted=counted)
    try:
        await device.flush_errors()              # shader problems surface before a byte of weights moves
        pieces = to_js([u.record() for u in engine.weights.pieces(UPLOAD_CHUNK)], dict_converter=js.Object.fromEntries)
        t1 = time.perf_counter()
        moved = await js.labUpload(device.handle, file, pieces, UPLOAD_CHUNK, seq)
        if moved < 0:
            raise RuntimeError("loading was cancelled")
        await device.flush_errors()
    except BaseException:
        engine.close()
        raise
    t2 = time.perf_counter()
    _state.loaded = Loaded(engine, header, tok, Session(engine, tok))
    nbytes = engine.weights.nbytes
    post({"type": "loaded", "seq": seq, "stats": {
        "weight_bytes": nbytes, "upload_s": round(t2 - t1, 3), "build_s": round(t1 - t0, 3),
        "upload_mb_s": round(nbytes / 1e6 / max(t2 - t1, 1e-9), 1), "n_ctx": engine.n_ctx,
        "kv_bytes_per_token": cfg.kv_bytes_per_token(), "dispatches_per_token": engine.dispatches_per_step(1),
        "int8_prefill": engine.int8_prefill, "max_batch": engine.max_batch,
        "kv": {"n_layer": cfg.n_layer, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim, "bytes_per_value": 4,
               "bytes_per_token": cfg.kv_bytes_per_token(), "n_ctx": engine.n_ctx,
               "window": [cfg.sliding_window if s else 0 for s in cfg.sliding]},
        "n_head": cfg.n_head, "n_embd": cfg.n_embd,
        "probe": {"window": probes.WINDOW, "lens_positions": probes.LENS_POSITIONS},
        "rope": {"base": cfg.rope_base, "neox": cfg.rope_neox, "n_rot": cfg.n_rot, "head_dim": cfg.head_dim,
                 "arch": cfg.arch},
        "eog": sorted(tok.eos_ids), "add_bos": tok.add_bos}})


def _loaded() -> Loaded:
    if _state.loaded is None:
        raise RuntimeError("load a model first")
    return _state.loaded


async def _chat(msg: dict) -> None:
    lo = _loaded()
    tok, session = lo.tokenizer, lo.session
    settings = Settings.from_dict(msg.get("settings", {}))
    prompt = chat.render_chat(tok, lo.header.metadata, msg["messages"])
    post({"type": "prompt", "ids": prompt, "pieces": [tok.piece(i) for i in prompt]})
    context = lo.context
    context[:] = prompt

    if lo.kv_view is None:
        lo.kv_view = kvview.KvView(lo.engine)
    view, live = lo.kv_view, bool(msg.get("kv_view"))
    shown = 0       # cache rows the page has this turn: the first read starts at 0 (the prompt may have replaced rows)

    async def kv_columns() -> None:
        nonlocal shown
        end = len(session.cached)
        if end > shown:
            body = await view.columns(shown, end)
            post({"type": "kv-view", **body, "norms": _f32(body["norms"])})
            shown = end

    def on_token(tid: int, piece: str):
        post({"type": "token", "id": tid, "piece": tok.piece(tid), "text": piece, "index": len(context),
              "kv_used": len(session.cached)})
        context.append(tid)
        return kv_columns() if live else None      # the KV panel is on screen: its new column with each token

    js.labStopClear()
    result = await session.generate(prompt, settings, int(msg.get("max_new") or MAX_NEW), on_token=on_token,
                                    should_stop=lambda: bool(js.labStopRequested()))
    await kv_columns()                             # the rest (all of it while the panel is off screen)
    done = result.to_dict()
    del done["prompt_ids"]                       # the page has them from the "prompt" message
    done["kv_used"] = len(session.cached)
    post({"type": "done", "result": done})


async def _profile(m: dict) -> None:
    """GPU time of the step the chat runs for t tokens at pos (`families`: and of each kernel family alone), on this
    adapter, by timestamp queries (lab/instruments/profile.py). The step writes K/V over the conversation's, so the conversation
    goes first."""
    reply = {"type": "profile", "id": m.get("id")}
    try:
        _state.loaded = _loaded().fresh()
        eng = _state.loaded.engine
        t, pos, reps = int(m["t"]), int(m["pos"]), int(m.get("reps") or profile.REPS)
        if m.get("warm_ms"):
            await _warm(float(m["warm_ms"]), post_done=False)
        rng = random.Random(0)
        eng.step([rng.randrange(eng.cfg.n_vocab) for _ in range(t)], pos)     # checks t and pos; fills the ids
        if m.get("families"):
            rows = await profile.by_family(eng, t, pos, reps)
        else:
            rows = [{"family": "whole step", "dispatches": eng.dispatches_per_step(t, pos=pos),
                     "gpu_us": round(await profile.whole_step(eng, t, pos, reps) * 1e6, 1)}]
    except Exception as exc:  # answered under the question's id, so the caller's promise settles
        post({**reply, "error": f"{type(exc).__name__}: {exc}"})
        return
    post({**reply, "t": t, "pos": pos, "rows": rows})


async def _warm(ms: float, post_done: bool = True) -> None:
    """lab.instruments.profile.warm: a page's turn follows seconds of typing, so a benchmark that compares it with native steps
    (which follow each other) warms the page's GPU first. The steps write K/V, so the conversation goes first."""
    _state.loaded = _loaded().fresh()
    steps = await profile.warm(_state.loaded.engine, ms)
    if post_done:
        post({"type": "warm", "steps": steps})


def _reset() -> None:
    if _state.loaded is not None:
        _state.loaded = _state.loaded.fresh()
    post({"type": "reset"})


# -- panels ---------------------------------------------------------------------------------------------
def _probes() -> Probes:
    lo = _loaded()
    if lo.probes is None:
        lo.probes = Probes(lo.engine)
    return lo.probes


def _f32(raw: bytes):
    """Raw f32 bytes as a JS Float32Array over a fresh ArrayBuffer: one copy, no per-number conversion, and never a
    view of the wasm heap (postMessage would clone the whole heap with it)."""
    u8 = js.Uint8Array.new(len(raw))
    u8.assign(raw)
    return js.Float32Array.new(u8.buffer)


async def _probe_embedding(token_id: int, index: int) -> None:
    pr, tok = _probes(), _loaded().tokenizer
    e = await pr.embedding(token_id)
    post({"type": "embedding", "index": index, "id": e.id, "piece": tok.piece(e.id), "values": _f32(e.values),
          "norm": e.norm, "ms": round(e.ms, 1), "macs": e.macs, "weight_bytes": e.weight_bytes,
          "neighbours": [{"id": i, "piece": tok.piece(i), "cos": c} for i, c in e.neighbours]})


async def _probe_inspect(req: dict) -> None:
    pr, lo = _probes(), _loaded()
    tok, session, ids = lo.tokenizer, lo.session, lo.context
    if not ids:
        raise RuntimeError("no conversation to inspect")
    cached = session.cached_prefix(ids)
    end = int(req.get("end") or len(ids))
    start = req.get("start")
    start = max(0, end - pr.window) if start is None else int(start)
    lens = min(int(req.get("lens", 0)), pr.lens_positions, end)
    r = await pr.inspect(ids, cached, start, end, attention=bool(req.get("attention")),
                             residual=bool(req.get("residual")), lens=lens)
    cfg = pr.engine.cfg
    pieces = {}
    for layer in r.lens or []:
        for cell in layer:
            for i, _ in cell:
                pieces.setdefault(i, tok.piece(i))
    post({"type": "inspection", "n": len(ids), "start": r.start, "end": r.end, "lens_start": r.lens_start,
          "n_layer": cfg.n_layer, "n_head": cfg.n_head, "ms": r.ms, "lens_macs": r.lens_macs,
          "lens_bytes": r.lens_bytes,
          "attention": _f32(r.attention) if r.attention is not None else None,
          "residual": _f32(r.residual) if r.residual is not None else None,
          "lens": [[[[i, p] for i, p in cell] for cell in layer] for layer in r.lens] if r.lens else None,
          "pieces": {str(k): v for k, v in pieces.items()}})


async def _forget(msg: dict) -> None:
    """Drop the Python-side conversation, then wipe and check every conversation buffer on the GPU, and redraw the
    KV panel's picture from the KV caches as read back after the wipe. `skip` (tests only) names a buffer the wipe
    leaves alone, to show that the check and the page catch it."""
    picture, rows = None, 0
    if _state.loaded is not None:
        _state.loaded.tokenizer.drop_caches()
        rows = len(_state.loaded.session.cached)       # the columns the KV panel showed
        picture = kvview.AfterPicture(_state.loaded.engine)
        _state.loaded = _state.loaded.fresh()
    device = _state.device
    if device is None:
        raise RuntimeError("no GPU: nothing was ever computed here")
    report = await forget.wipe(device, on_after=picture, skip=msg.get("skip"))
    kv = None
    if picture is not None:
        kv = picture.picture(rows)
        kv["norms"] = _f32(kv["norms"])
    post({"type": "forget", "report": report.to_dict(), "kv": kv})


async def _kv_rows(msg: dict) -> None:
    """Test hook: the raw K and V rows at `positions` of every layer, f32 [len(positions), n_layer, 2, kvd] in base64,
    read straight from the caches (not through lab/instruments/kvview.py's kernel), for a test to compute norms on its own."""
    engine = _loaded().engine
    kvd = engine.cfg.kv_dim
    positions = [int(p) for p in msg["positions"]]
    lo, hi = min(positions), max(positions) + 1
    layers = []
    for pair in engine.kv_buffers:
        layers.append([await engine.device.read(b, 4 * kvd * lo, 4 * kvd * (hi - lo)) for b in pair])
    raw = b"".join(layers[il][w][4 * kvd * (p - lo):4 * kvd * (p - lo + 1)]
                   for p in positions for il in range(len(layers)) for w in (0, 1))
    post({"type": "kv-rows", "id": msg["id"], "kvd": kvd, "n_layer": len(layers), "rows": base64.b64encode(raw).decode()})


# -- tests and benchmarks -------------------------------------------------------------------------------
async def _last_logits(msg: dict) -> None:
    """Test hook: the logits after prefilling raw prompt ids from position 0 (the prefill's last row: what the next
    token is chosen from), f32 in base64, for the architecture parity test. The chat's cache is dropped."""
    reply = {"type": "last-logits", "id": msg["id"]}
    try:
        lo = _loaded()
        lo.session.reset()
        engine = lo.engine
        engine.step([int(i) for i in msg["ids"]], 0)
        raw = await engine.device.read(engine.scratch.logits, 0, 4 * engine.cfg.n_vocab)
    except Exception as exc:  # answered under the question's id, so the caller's promise settles
        post({**reply, "error": f"{type(exc).__name__}: {exc}"})
        return
    post({**reply, "logits": base64.b64encode(raw).decode()})


async def _greedy_ids(msg: dict) -> None:
    """Test hook: n greedy ids after raw prompt ids, straight through the engine's prefill and decode steps (no chat
    template, no end-of-generation stop), as llama.cpp's architecture fixtures were made. The chat's cache is
    dropped: the steps overwrite it."""
    reply = {"type": "greedy-ids", "id": msg["id"]}
    try:
        lo = _loaded()
        lo.session.reset()
        ids, n, engine = [int(i) for i in msg["ids"]], int(msg["n"]), lo.engine
        out = []
        engine.step(ids, 0)
        for i in range(n):
            out.append(await engine.argmax())
            if i + 1 < n:
                engine.step(None, len(ids) + i)     # ids[0] already holds the argmax
    except Exception as exc:  # answered under the question's id, so the caller's promise settles
        post({**reply, "error": f"{type(exc).__name__}: {exc}"})
        return
    post({**reply, "ids": out})


async def _ffi_cost(n: int) -> None:
    """Microseconds of one Python->JS call (a JS function that returns a boolean) and of one small `to_js`
    (the 16-byte step uniform a decode step writes): the per-call price that call counts multiply. With a
    model loaded, also the milliseconds of a 4-byte read-back with the queue idle: a mapAsync round trip
    to the GPU process with no work to wait for."""
    t0 = time.perf_counter()
    for _ in range(n):
        js.labStopRequested()
    t1 = time.perf_counter()
    data = bytes(16)
    for _ in range(n):
        to_js(data)
    t2 = time.perf_counter()
    read_ms = None
    if _state.loaded is not None:
        engine = _state.loaded.engine
        await engine.argmax()
        t3 = time.perf_counter()
        for _ in range(20):
            await engine.argmax()
        read_ms = round((time.perf_counter() - t3) / 20 * 1e3, 3)
    post({"type": "ffi-cost", "n": n, "call_us": round((t1 - t0) / n * 1e6, 2),
          "to_js_us": round((t2 - t1) / n * 1e6, 2), "read_ms": read_ms})


async def _kernel_check(msg: dict) -> None:
    """Run kernel cases (lab/instruments/kernelcheck.py) on the given inputs and post their outputs, base64 both ways (a test
    builds the inputs in CPython). Every buffer it makes is its own and freed; the engine's are never touched."""
    device = _state.device
    reply = {"type": "kernel-check", "id": msg["id"]}
    if device is None:
        post({**reply, "error": "no GPU device"})
        return
    kernels = _state.check_kernels
    if kernels is None or kernels.device is not device:
        kernels = _state.check_kernels = KernelCache(device)
    results, before = [], len(device.buffers)
    try:
        for case in msg["cases"]:
            case["inputs"] = {k: base64.b64decode(v) for k, v in case["inputs"].items()}
            r = await kernelcheck.run(device, kernels, case)
            results.append({"outputs": {k: base64.b64encode(v).decode() for k, v in r["outputs"].items()},
                            "kernels": r["kernels"]})
    except Exception as exc:  # answered under the request's id, so the caller's promise settles
        post({**reply, "error": f"{type(exc).__name__}: {exc}"})
        return
    finally:
        for b in device.staging(0):      # the check's numbers were read through it
            device.clear(b)
    post({**reply, "results": results, "adapter": device.info.summary(),
          "buffers": {"before": before, "after": len(device.buffers)}})
