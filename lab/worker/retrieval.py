"""The worker's side of the retrieval card, "Ask your files" (lab/worker/router.py routes the four messages here; the
card is web/retrieval.js; the index itself is lab/instruments/retrieval.py).

    retrieval-index {files, window, stride, seq}  ->  "retrieval-plan" {seq, files, refused, windows, tokens,
        tokenize_s} before any GPU work, "retrieval-progress" {seq, what: "index", done, total, seconds, eta_s}
        after the first window and every POLL_S, then "retrieval-ready" {seq, built, files, windows}
    retrieval-ask {question, k, compare, settings, max_new, seq}  ->  "retrieval-hits" {seq, hits, prompt,
        prompt_tokens}, "retrieval-token" {seq, which: "rag" | "plain", piece}..., then "retrieval-answer"
        {seq, rag, plain | null}
    retrieval-recall {queries, seed, seq}  ->  "retrieval-progress" {seq, what: "recall", ...}..., then
        "retrieval-recall" {seq, recall}
    retrieval-drop {seq}  ->  "retrieval-dropped" {seq}

The index belongs to the loaded model (its state `cards.INDEX` in `Loaded.cards`), embedded by the card's tuned
embedder while it is on ("Tune on these files": lab/worker/embedder.py, `cards.EMBEDDER`): a new chat keeps it (the
user's files are not the conversation), Forget wipes it with the rest and then drops it (router.py `_forget`), a new
load, an unload and a lost device drop it (lab/worker/cards.py says so). A new index replaces the old one, which is
dropped before the new files are read.

Embedding windows and questions overwrites the engine's KV cache from position 0, as a perplexity run does, so the
chat session is told its cache holds nothing (`session.reset()`) before each build, search and recall. The answer
with passages and the one without run with the same Settings (so the same seed), one after the other on the same
session, which keeps its own account of what the cache then holds.

Stop is the page's "stop" message, recorded by web/worker.js while Python is busy: a build keeps the windows it
embedded (searchable), a recall reports the queries it ran, an answer ends at its next token (and the answer without
passages is then not started).

What it does not know: the page (it posts dicts), how a window is embedded or searched (lab/instruments/retrieval.py),
chat templates (lab/text/chat.py renders the packed messages).
"""

from __future__ import annotations

from lab.instruments.retrieval import (
    ASK_K,
    MAX_K,
    MAX_QUERIES,
    MAX_WINDOW,
    MIN_WINDOW,
    RECALL_QUERIES,
    STRIDE,
    WINDOW,
    Index,
    RetrievalError,
    pack_messages,
)
from lab.settings import MAX_NEW, Settings
from lab.text import chat
from lab.worker.cards import EMBEDDER, INDEX
from lab.worker.state import Loaded, Worker

NO_INDEX = "no index: index some files first (pick or drop text files above, then press Index)"


def defaults(n_ctx: int) -> dict:
    """The card's inputs for a model loaded with a context of n_ctx: window and stride (their defaults and bounds),
    k and the recall's queries (lab/instruments/retrieval.py is their one home; "loaded" carries them to the page)."""
    return {"window": WINDOW, "stride": STRIDE, "min_window": MIN_WINDOW,
            "max_window": min(MAX_WINDOW, n_ctx - 1), "k": ASK_K, "max_k": MAX_K, "queries": RECALL_QUERIES,
            "max_queries": MAX_QUERIES}


def _int(msg: dict, key: str, default: int) -> int:
    """An integer field; its default only when the page left it out (a 0 is refused by the check, not replaced)."""
    v = msg.get(key)
    return default if v is None else int(v)


def _index_of(lo: Loaded) -> Index:
    idx = lo.held(INDEX)
    if idx is None or not idx.ready:
        raise RetrievalError(NO_INDEX)
    return idx


def _progress(w: Worker, seq, what: str):
    """on_progress(done, total, seconds) posting "retrieval-progress"; the time left is the rate so far applied to
    what remains (after the first window, the estimate before the rest)."""
    def post(done: int, total: int, seconds: float) -> None:
        eta = seconds / done * (total - done) if done else None
        w.post({"type": "retrieval-progress", "seq": seq, "what": what, "done": done, "total": total,
                "seconds": round(seconds, 3), "eta_s": None if eta is None else round(eta, 1)})
    return post


async def index(msg: dict, w: Worker) -> None:
    lo = w.loaded()
    seq = msg.get("seq")
    lo.drop(INDEX)                      # the new files replace the old ones, whatever becomes of them
    tuned = lo.held(EMBEDDER)           # the card's tuned embedder while it is on (lab/worker/embedder.py)
    new = Index(lo.engine, lo.tokenizer, window=_int(msg, "window", WINDOW), stride=_int(msg, "stride", STRIDE),
                adapter=None if tuned is None else tuned.adapter)
    files = []
    for f in msg.get("files") or []:
        files.append((str(f.name), (await f.arrayBuffer()).to_bytes()))
    if not files:
        raise RetrievalError("no files: pick or drop one or more text files (.txt, .md) first")
    try:
        plan = new.prepare(files)       # bad files are refused by name; RetrievalError when none is left
    finally:
        files.clear()                   # the decoded text lives on as ids in the index, the raw bytes do not
    planned = plan.to_dict()
    w.post({"type": "retrieval-plan", "seq": seq, **planned})
    lo.session.reset()                  # before the first window: a stopped or failed build has overwritten it too
    w.stop_clear()
    try:
        built = await new.build(_progress(w, seq, "index"), lambda: bool(w.stop_requested()))
    except BaseException:
        new.drop()
        raise
    lo.hold(INDEX, new)
    w.post({"type": "retrieval-ready", "seq": seq, "built": built.to_dict(), "files": planned["files"],
            "windows": built.done})


async def ask(msg: dict, w: Worker) -> None:
    lo = w.loaded()
    seq = msg.get("seq")
    idx = _index_of(lo)
    question = str(msg.get("question") or "").strip()
    if not question:
        raise RetrievalError("type a question first")
    k = _int(msg, "k", ASK_K)
    if not 1 <= k <= MAX_K:
        raise RetrievalError(f"k = {k}: choose 1 .. {MAX_K} passages")
    settings = Settings.from_dict(msg.get("settings") or {})
    max_new = int(msg.get("max_new") or MAX_NEW)
    tok, md, session = lo.tokenizer, lo.header.metadata, lo.session

    session.reset()                     # the search embeds the question over the KV cache
    hits = await idx.search(tok.encode(question), k)
    messages = pack_messages(question, hits)
    ids = chat.render_chat(tok, md, messages)
    w.post({"type": "retrieval-hits", "seq": seq, "hits": [h.to_dict() for h in hits],
            "prompt": chat.render_text(tok, md, messages), "prompt_tokens": len(ids)})
    if len(ids) >= lo.engine.n_ctx:
        raise RetrievalError(f"the packed prompt has {len(ids):,} tokens and the context holds {lo.engine.n_ctx:,}: "
                             f"ask for fewer passages (k), or index with a smaller window")
    session.reset()                     # the search's steps wrote the cache after the reset above
    w.stop_clear()

    async def answer(prompt: list[int], which: str) -> dict:
        def on_token(tid: int, piece: str) -> None:
            w.post({"type": "retrieval-token", "seq": seq, "which": which, "piece": piece})
        res = (await session.generate(prompt, settings, max_new, on_token=on_token,
                                      should_stop=w.stop_requested)).to_dict()
        del res["prompt_ids"]           # the page has the prompt's text and length from "retrieval-hits"
        return res

    rag = await answer(ids, "rag")
    plain = None
    if msg.get("compare") and rag["stop"] != "stopped":
        plain = await answer(chat.render_chat(tok, md, [{"role": "user", "content": question}]), "plain")
    w.post({"type": "retrieval-answer", "seq": seq, "rag": rag, "plain": plain})


async def recall(msg: dict, w: Worker) -> None:
    lo = w.loaded()
    seq = msg.get("seq")
    idx = _index_of(lo)
    if msg.get("queries") is None:
        raise RetrievalError("say how many queries to measure recall on")
    lo.session.reset()                  # the queries are embedded over the KV cache
    w.stop_clear()
    res = await idx.recall(int(msg["queries"]), int(msg.get("seed") or 0),
                           _progress(w, seq, "recall"), lambda: bool(w.stop_requested()))
    w.post({"type": "retrieval-recall", "seq": seq, "recall": res.to_dict()})


async def drop(msg: dict, w: Worker) -> None:
    if w.state.loaded is not None:
        w.state.loaded.drop(INDEX)
    w.post({"type": "retrieval-dropped", "seq": msg.get("seq")})
