"""The worker's Python side (Pyodide only): web/worker.js hands it every message the page sends, and `handle` routes
each by its type to one handler in ROUTES. The messages, in and out, are catalogued in lab/worker/protocol.py.

Here: the product's own handlers (the GPU device, the load, the chat, the panels, Forget). Elsewhere: the cards'
(lab/worker/rope.py, verify.py, perplexity.py, retrieval.py, embedder.py, grounded.py, experiments.py, routing.py,
training.py, tokenizer.py) and the tests' and benchmarks' (lab/worker/hooks.py).
Every handler takes the message as a dict and the one `Worker` (lab/worker/state.py), whose ways out this module binds
to JS.

Python only ever sees the header prefix of a model file (and the values of lab.format.model.HOST_TENSORS: llama 3's
rope_freqs, a few hundred bytes): the weights go from File.slice to queue.writeBuffer in worker.js
(`labUpload`), 32 MB at a time, from the list of pieces Python made (lab.ops.weights.Upload).
"""

from __future__ import annotations

import asyncio
import time

import js
from pyodide.ffi import to_js

from lab.engine import budget
from lab.engine.engine import Engine
from lab.engine.load import validate
from lab.engine.scratch import prefill_batch
from lab.format import gguf
from lab.format.model import host_tensors
from lab.gpu.browser import open_browser
from lab.instruments import forget, kvview, memory, selftest
from lab.ops.weights import UPLOAD_CHUNK
from lab.settings import MAX_NEW, Settings, context_for
from lab.text import chat
from lab.worker import (embedder, experiments, grounded, hooks, perplexity, retrieval, rope, routing, scratch,
                        tokenizer, training, verify)
from lab.worker.cards import KV_VIEW, MEMORY
from lab.worker.loading import arrived, unload
from lab.worker.protocol import IN
from lab.worker.state import Handler, Loaded, State, Worker, clear_staging

_lock = asyncio.Lock()   # one message at a time: a second file picked mid-load waits its turn
PREFIX = 1 << 20         # first read of a header; grown when the metadata is larger


def post(msg: dict) -> None:
    js.postMessage(to_js(msg, dict_converter=js.Object.fromEntries))


def f32(raw: bytes):
    """Raw f32 bytes as a JS Float32Array over a fresh ArrayBuffer: one copy, no per-number conversion, and never a
    view of the wasm heap (postMessage would clone the whole heap with it)."""
    u8 = js.Uint8Array.new(len(raw))
    u8.assign(raw)
    return js.Float32Array.new(u8.buffer)


# The JS functions are looked up at each call: `lab bench --backend browser` wraps them (count-calls) after this runs.
worker = Worker(post=post, f32=f32, stop_requested=lambda: bool(js.labStopRequested()),
                stop_clear=lambda: js.labStopClear())


async def handle(raw) -> None:
    """Route one message from web/worker.js (a JS object; a File in it stays one) to its handler."""
    msg = raw.to_py()
    kind = msg["type"]
    async with _lock:
        handler = ROUTES.get(kind)
        if handler is None:
            post({"type": "error", "where": kind, "message": f"unknown message type {kind!r}"})
            return
        try:
            await handler(msg, worker)
        except Exception as exc:  # every failure reaches the page as a message, and the worker lives on
            post({"type": "error", "where": kind, "message": str(exc) or type(exc).__name__, "seq": msg.get("seq")})


# -- the GPU device ------------------------------------------------------------------------------------------
async def _init(msg: dict, w: Worker) -> None:
    device = await open_browser()
    w.state.device = device
    device.on_lost(lambda reason: _lost(w, reason))
    w.post({"type": "gpu", "info": device.info.summary()})
    result = await selftest.run(device)
    await device.flush_errors()
    clear_staging(device)           # it holds the self-test's numbers, not conversation: start from zero
    w.post({"type": "selftest", "result": result})


def _lost(w: Worker, reason: str) -> None:
    """The GPU went away (driver reset, sleep, another tab's crash, a destroyed device): everything on it is gone, and
    so is everything of the conversation on this side. A new device is asked for at once, so the page can load a
    model again without a reload."""
    if w.state.loaded is not None:
        w.state.loaded.device_lost()        # the conversation, and what the cards' states hold on this side
    w.state = State()
    w.post({"type": "error", "where": "device",
            "message": f"The GPU device was lost ({reason}); nothing of the conversation was kept. Asking for a new "
                       f"one: load the model again when the GPU line says ready."})
    asyncio.ensure_future(_again(w))


async def _again(w: Worker) -> None:
    async with _lock:
        try:
            await _init({}, w)
        except Exception as exc:  # no adapter any more: the page says so, and a reload is the way back
            w.post({"type": "error", "where": "init", "message": str(exc) or type(exc).__name__})


# -- the load ------------------------------------------------------------------------------------------------
async def header_from_prefix(file) -> tuple[gguf.Header, int]:
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


async def _header_and_card(file) -> tuple[gguf.Header, dict]:
    """Read a file's header and summarize it for the page's model card (nothing is uploaded)."""
    t0 = time.perf_counter()
    header, nread = await header_from_prefix(file)
    summary = gguf.summary(header)
    summary.update(file_name=str(getattr(file, "name", "")), prefix_bytes=nread,
                   parse_ms=round((time.perf_counter() - t0) * 1e3, 1))
    return header, summary


def _count(device, header: gguf.Header, n_ctx: int | None, int8: bool, kv: str = "f32"):
    """The load's one validation and one memory budget: (config, tokenizer, budget), with the problem that stops the
    load, if any (the card still shows what could be worked out)."""
    try:
        cfg, tok = validate(header)          # every key and tensor checked, named if wrong, before any upload
    except Exception as exc:  # the card goes without a budget; the load reports the problem
        return None, None, None, exc
    counted = budget.count(device.info.limits, header, cfg, context_for(cfg.n_ctx_train, n_ctx),
                           max_batch=prefill_batch(device.info), int8=int8, kv=kv)
    return cfg, tok, counted, None


async def _load(msg: dict, w: Worker) -> None:
    """Load a model file; `seq` numbers the page's requests, so a load the page gave up on (another file picked, or
    cancel) is stopped at its next chunk and its messages are told apart."""
    file, seq = msg["file"], int(msg["seq"])
    n_ctx = int(msg["n_ctx"]) if msg.get("n_ctx") else None
    device = w.state.device
    if device is None:
        raise RuntimeError("no GPU: the lab cannot load a model without WebGPU")
    unload(w)
    header, summary = await _header_and_card(file)
    int8 = bool(msg.get("int8")) and device.info.int8_matrix    # offered only there; a stale flag loads exact
    kv = "f16" if msg.get("kv") == "f16" else "f32"      # the f16 KV cache runs on any adapter (attention.KV_TYPES)
    cfg, tok, counted, problem = _count(device, header, n_ctx, int8, kv)
    summary["budget"] = counted.card(cfg) if counted is not None else None
    w.post({"type": "model-info", "summary": summary, "seq": seq})
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
                    kv=kv, counted=counted)
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
    w.post(arrived(w, engine, header, tok, seq, upload_s=t2 - t1, build_s=t1 - t0))


# -- the chat ------------------------------------------------------------------------------------------------
async def _chat(msg: dict, w: Worker) -> None:
    lo = w.loaded()
    tok, session = lo.tokenizer, lo.session
    settings = Settings.from_dict(msg.get("settings", {}))
    prompt = chat.render_chat(tok, lo.header.metadata, msg["messages"])
    w.post({"type": "prompt", "ids": prompt, "pieces": [tok.piece(i) for i in prompt]})
    context = lo.context
    context[:] = prompt

    # the memory card: "live" (on screen) a new column with each token, "end" (open elsewhere) the picture once the
    # turn ends, absent (folded) nothing: the page asks for it with "kv-picture" when the card is opened
    pictured, live = msg.get("kv_view") in ("live", "end"), msg.get("kv_view") == "live"
    if pictured:
        _picture_views(lo)                         # made before the turn's steps, not between them
    shown = 0       # cache rows the page has this turn: the first read starts at 0 (the prompt may have replaced rows)

    async def kv_columns() -> None:
        nonlocal shown
        end = len(session.cached)
        if pictured and end > shown:
            await _post_kv_columns(w, lo, shown, end)
            shown = end

    async def memory_view() -> None:
        if pictured:
            await _post_memory_view(w, lo)

    async def live_columns() -> None:
        await kv_columns()
        await memory_view()

    def on_token(tid: int, piece: str):
        w.post({"type": "token", "id": tid, "piece": tok.piece(tid), "text": piece, "index": len(context),
                "kv_used": len(session.cached)})
        context.append(tid)
        return live_columns() if live else None    # the memory card is on screen: its new column with each token

    w.stop_clear()
    # what the KV cache holds of this prompt (one token must run) and where the live states stand, before the turn:
    # the chat's reuse line says what a hybrid's turn continued from (memory.reuse_note)
    cached, states_at = min(session.cached_prefix(prompt), len(prompt) - 1), lo.engine.held[1]
    result = await session.generate(prompt, settings, int(msg.get("max_new") or MAX_NEW), on_token=on_token,
                                    should_stop=w.stop_requested)
    await kv_columns()                             # the rest (all of it while the panel is off screen)
    await memory_view()                            # the states as the turn leaves them
    done = result.to_dict()
    del done["prompt_ids"]                       # the page has them from the "prompt" message
    done["kv_used"] = len(session.cached)
    done["reuse_note"] = memory.reuse_note(lo.engine.cfg, result.reused, cached, states_at)
    w.post({"type": "done", "result": done})


def _picture_views(lo: Loaded) -> tuple[kvview.KvView, memory.MemoryView | None]:
    """The memory card's readers, made on their first use: the KV norms pass, and a hybrid's states."""
    view = lo.made(KV_VIEW, lambda: kvview.KvView(lo.engine))
    reads = lo.made(MEMORY, lambda: memory.MemoryView(lo.engine)) if lo.engine.cfg.recurrent else None
    return view, reads


async def _post_kv_columns(w: Worker, lo: Loaded, start: int, end: int) -> None:
    """The memory card's KV picture: cache rows start .. end - 1."""
    body = await _picture_views(lo)[0].columns(start, end)
    w.post({"type": "kv-view", **body, "norms": w.f32(body["norms"])})


async def _post_memory_view(w: Worker, lo: Loaded) -> None:
    """A hybrid's states for the memory card: the conv rows the next token reads, the delta-net norms."""
    reads = _picture_views(lo)[1]
    if reads is not None:
        _post_memory(w, await reads.view(len(lo.session.cached)))


async def _kv_picture(msg: dict, w: Worker) -> None:
    """The memory card's whole picture as the session holds it now, for a card opened after the turns it missed."""
    lo = w.loaded()
    await _post_kv_columns(w, lo, 0, len(lo.session.cached))
    await _post_memory_view(w, lo)


def _post_memory(w: Worker, body: dict) -> None:
    if body["conv"] is not None:
        body["conv"] = {**body["conv"], "values": w.f32(body["conv"]["values"])}
    if body["delta"] is not None:
        body["delta"] = w.f32(body["delta"])
    w.post({"type": "memory-view", **body})


async def _memory_head(msg: dict, w: Worker) -> None:
    """One delta-net head's state matrix as the GPU holds it, for the memory card's heatmap."""
    lo = w.loaded()
    view = lo.made(MEMORY, lambda: memory.MemoryView(lo.engine))
    layer, head = int(msg["layer"]), int(msg["head"])
    values = await view.delta_head(layer, head)
    w.post({"type": "memory-head", "layer": layer, "head": head, "pos": len(lo.session.cached),
            "values": w.f32(values)})


async def _reset(msg: dict, w: Worker) -> None:
    """New chat: the conversation wiped as Forget wipes it (`_wipe`, the same read-back proof and the same KV and
    memory pictures), less the buffers of the user's files (the retrieval index, a trained adapter's parameters:
    lab/worker/cards.py `new_chat_leaves`); the cards' states go over to the new chat, or are closed after the wipe,
    as their `new_chat` says. The next turn prefills from an empty cache (a new Session)."""
    w.post({"type": "reset", **await _wipe(msg, w, new_chat=True)})


# -- panels --------------------------------------------------------------------------------------------------
async def _probe_embedding(msg: dict, w: Worker) -> None:
    pr, tok = w.probes(), w.loaded().tokenizer
    cfg = pr.engine.cfg
    e = await pr.embedding(int(msg["id"]))
    w.post({"type": "embedding", "index": int(msg["index"]), "id": e.id, "piece": tok.piece(e.id),
            "values": w.f32(e.values), "norm": e.norm, "ms": round(e.ms, 1), "macs": e.macs,
            "weight_bytes": e.weight_bytes,
            "neighbours": [{"id": i, "piece": tok.piece(i), "cos": c} for i, c in e.neighbours],
            "per_layer": None if e.per_layer is None else {
                "values": w.f32(e.per_layer), "norms": e.per_layer_norms, "n_layer": cfg.n_layer,
                "width": cfg.n_embd_per_layer, "table_bytes": e.per_layer_table_bytes}})


async def _probe_inspect(msg: dict, w: Worker) -> None:
    pr, lo = w.probes(), w.loaded()
    tok, session, ids = lo.tokenizer, lo.session, lo.context
    if not ids:
        raise RuntimeError("no conversation to inspect")
    cached = session.cached_prefix(ids)
    end = int(msg.get("end") or len(ids))
    start = msg.get("start")
    start = max(0, end - pr.window) if start is None else int(start)
    lens = min(int(msg.get("lens", 0)), pr.lens_positions, end)
    r = await pr.inspect(ids, cached, start, end, attention=bool(msg.get("attention")),
                         residual=bool(msg.get("residual")), lens=lens)
    cfg = pr.engine.cfg
    pieces = {}
    for layer in r.lens or []:
        for cell in layer:
            for i, _ in cell:
                pieces.setdefault(i, tok.piece(i))
    w.post({"type": "inspection", "n": len(ids), "start": r.start, "end": r.end, "lens_start": r.lens_start,
            "n_layer": cfg.n_layer, "n_head": cfg.n_head, "ms": r.ms, "lens_macs": r.lens_macs,
            "lens_bytes": r.lens_bytes,
            "attention": w.f32(r.attention) if r.attention is not None else None,
            "residual": w.f32(r.residual) if r.residual is not None else None,
            "lens": [[[[i, p] for i, p in cell] for cell in layer] for layer in r.lens] if r.lens else None,
            "pieces": {str(k): v for k, v in pieces.items()}})


async def _forget(msg: dict, w: Worker) -> None:
    """Drop the Python-side conversation, then wipe and check every conversation buffer on the GPU, and redraw the
    KV panel's picture from the KV caches as read back after the wipe. `skip` (tests only) names a buffer the wipe
    leaves alone, to show that the check and the page catch it.

    The cards' states that Forget does not keep (lab/worker/cards.py Forget.WIPE: the retrieval index, the
    Experiments card's runs) go too, in that order: out of the loaded model first, alive through the wipe, so the
    report's read-back covers their buffers (`retrieval.*`, `experiment.*`: non-zero before, zero after), and closed
    only then (buffers freed, the files' ids and names emptied).

    A model whose weights are the user's (Loaded.weights_are_users: trained from scratch here, lab/worker/scratch.py,
    or a file's every weight trained in place, lab/worker/training.py; CONVERSATION buffers, made of the user's text)
    is wiped and read back with the rest, then unloaded: zeros are no model (`unloaded` true)."""
    w.post({"type": "forget", **await _wipe(msg, w, new_chat=False)})


async def _wipe(msg: dict, w: Worker, *, new_chat: bool) -> dict:
    """Forget's and New chat's one way: {report, kv, memory}. The tokenizer's caches and the conversation dropped, the
    loaded model replaced (`Loaded.forgotten` or `renewed`), `forget.wipe` over every CONVERSATION buffer (less what a
    new chat leaves) with the states handed back alive through it and closed after, then the KV and memory pictures
    drawn from its read-back. Without a device (none ever opened) a new chat has nothing to wipe: report None.
    Forget unloads a model whose weights it wiped (`unloaded`); a new chat leaves them (Loaded.left_by_new_chat)."""
    picture, states, rows, held, leave = None, None, 0, [], []
    lo = w.state.loaded
    if lo is not None:
        lo.tokenizer.drop_caches()
        rows = len(lo.session.cached)       # the columns the KV panel showed
        picture = kvview.AfterPicture(lo.engine)
        if lo.held(MEMORY) is not None:     # and the states the memory card showed: the conv rows, the picked head
            pick = msg.get("head")
            # the rows the card showed: at the conversation's end, or (a second Forget) where the rings last stood
            states = memory.StateAfter(lo.engine, memory.conv_span(lo.engine, rows or lo.engine.held[1]),
                                       (int(pick["layer"]), int(pick["head"])) if pick else None)
        w.state.loaded, held = lo.renewed() if new_chat else lo.forgotten()
        if new_chat:
            leave = w.state.loaded.left_by_new_chat()
    try:
        device = w.state.device
        if device is None:
            if new_chat:
                return {"report": None, "kv": None, "memory": None, "unloaded": False}
            raise RuntimeError("no GPU: nothing was ever computed here")
        seen = [c for c in (picture, states) if c is not None]
        report = await forget.wipe(device, on_after=lambda *read: [c(*read) for c in seen], skip=msg.get("skip"),
                                   leave=leave)
    finally:
        for card, state in held:
            card.close(state)
    users = w.state.loaded is not None and w.state.loaded.weights_are_users
    if users and not new_chat:
        unload(w)                           # its weights read back as zeros above: nothing left to run
    kv = mem = None
    if picture is not None:
        kv = picture.picture(rows)
        kv["norms"] = w.f32(kv["norms"])
    if states is not None:
        mem = states.picture()
        if mem["conv"] is not None:
            mem["conv"]["values"] = w.f32(mem["conv"]["values"])
        if mem["delta"] is not None:
            mem["delta"]["norms"] = w.f32(mem["delta"]["norms"])
            if mem["delta"]["head"] is not None:
                mem["delta"]["head"]["values"] = w.f32(mem["delta"]["head"]["values"])
    return {"report": report.to_dict(), "kv": kv, "memory": mem, "unloaded": users and not new_chat}


async def _unload_tab(msg: dict, w: Worker) -> None:
    """The tab is closing or reloading (the page's `pagehide`): every CONVERSATION buffer cleared and read back (the
    user's files too: nothing stays), then every buffer of the model destroyed (`Loaded.close`: each card's state,
    then the engine), and the Python copies dropped (the session's tokens, the tokenizer's text caches). The browser
    may end the worker before any of it runs, or before the GPU runs the clears: docs/privacy.md says what is
    measured. The report goes out last; the page may be gone by then."""
    def log(line) -> None:               # tests and measurements (msg's log): counts only, never the conversation
        if msg.get("log"):
            js.console.info(line())

    log(lambda: "lab unload: started")
    lo, device = w.state.loaded, w.state.device
    w.state = State(device, None, w.state.check_kernels)     # nothing reaches the old conversation from here on
    if lo is not None:
        lo.drop_conversation()
        lo.tokenizer.drop_caches()
    report = None
    try:
        if device is not None:
            report = (await forget.wipe(device)).to_dict()
            log(lambda: f"lab unload: {report['buffers']} buffers cleared and read back, "
                        f"{report['after']} non-zero words after")
    finally:
        if lo is not None:
            lo.close()
    left = len(forget.conversation_buffers(device)) if device is not None else 0
    log(lambda: f"lab unload: destroyed; {left} conversation buffers left")
    w.post({"type": "unloaded", "report": report, "left": left})


# -- the table: one handler a message type (lab/worker/protocol.py INCOMING catalogues them) -----------------
ROUTES: dict[str, Handler] = {
    IN.INIT: _init,
    IN.LOAD: _load,
    IN.CHAT: _chat,
    IN.RESET: _reset,
    IN.PROBE_EMBEDDING: _probe_embedding,
    IN.PROBE_INSPECT: _probe_inspect,
    IN.FORGET: _forget,
    IN.UNLOAD: _unload_tab,
    IN.MEMORY_HEAD: _memory_head,
    IN.KV_PICTURE: _kv_picture,
    IN.PROBE_ROPE: rope.run,
    IN.VERIFY: verify.run,
    IN.VERIFY_KERNELS: verify.run_kernels,
    IN.PERPLEXITY: perplexity.run,
    IN.RETRIEVAL_INDEX: retrieval.index,
    IN.RETRIEVAL_ASK: retrieval.ask,
    IN.RETRIEVAL_RECALL: retrieval.recall,
    IN.RETRIEVAL_DROP: retrieval.drop,
    IN.RETRIEVAL_TUNE: embedder.tune,
    IN.RETRIEVAL_TUNE_SWITCH: embedder.switch,
    IN.RETRIEVAL_TUNE_DOWNLOAD: embedder.download,
    IN.EXPERIMENT_TOKENS: experiments.tokens,
    IN.EXPERIMENT: experiments.run,
    IN.ROUTER: routing.run,
    IN.ROUTER_ABLATE: routing.ablate,
    IN.TRAIN: training.run,
    IN.TRAIN_COMPARE: training.compare,
    IN.TRAIN_ADAPTER: training.adapter,
    IN.TRAIN_SWITCH: training.switch,
    IN.TRAIN_ADAPTER_FILE: training.open_file,
    IN.TRAIN_NEW: scratch.run,
    IN.TRAIN_MODEL: scratch.model,
    IN.GROUNDED_SET: grounded.make_set,
    IN.GROUNDED_EVAL: grounded.measure,
    IN.TOKENIZER_TRAIN: tokenizer.run,
    IN.KV_ROWS: hooks.kv_rows,
    IN.STATE_BYTES: hooks.state_bytes,
    IN.LAST_LOGITS: hooks.last_logits,
    IN.TRAIN_GRADS: hooks.train_grads,
    IN.GREEDY_IDS: hooks.greedy_ids,
    IN.KERNEL_CHECK: hooks.kernel_check,
    IN.WEIGHT_BYTES: hooks.weight_bytes,
    IN.PROFILE: hooks.profile,
    IN.WARM: hooks.warm,
    IN.FFI_COST: hooks.ffi_cost,
}
