"""The worker's side of the perplexity card (lab/worker/router.py routes "perplexity" here; the card is
web/perplexity.js).

    perplexity {text, n_ctx, seq}  ->  "perplexity-progress" {seq, chunk, chunks, ppl, n_tokens} after each chunk,
                                       then "perplexity" {seq, result (lab.instruments.perplexity.Result.to_dict())}

Cancel is the page's "stop" message, which web/worker.js itself records (`labStopRequested`) while Python is busy;
the run polls it after every step and returns the chunks it finished, with `stopped` set.

The run overwrites the engine's KV cache from position 0, so the session is told first that its cache holds nothing
(`session.reset()`): the next chat turn prefills its whole prompt, and the panels recompute what they show. The text
and its ids live only in this call's locals; the run's GPU buffers (kind CONVERSATION) are freed, zeroed, when it ends.

What it does not know: the page (it posts dicts), the windowing convention (lab/instruments/perplexity.py).
"""

from __future__ import annotations

from lab.instruments.perplexity import Perplexity, PerplexityError, tokens_of
from lab.settings import PERPLEXITY_CTX, PERPLEXITY_MAX_CTX, PERPLEXITY_MIN_CTX
from lab.worker.state import Worker


async def run(msg: dict, w: Worker) -> None:
    loaded = w.loaded()
    seq = msg.get("seq")
    n_ctx = int(msg.get("n_ctx") or PERPLEXITY_CTX)
    if not PERPLEXITY_MIN_CTX <= n_ctx <= PERPLEXITY_MAX_CTX:
        raise PerplexityError(f"a window of {n_ctx} tokens: choose {PERPLEXITY_MIN_CTX} .. {PERPLEXITY_MAX_CTX}")
    text = str(msg.get("text") or "")
    if not text.strip():
        raise PerplexityError("paste some text first")
    tok, engine = loaded.tokenizer, loaded.engine
    ids = tokens_of(tok, text)
    del text
    loaded.session.reset()           # before the first step: a cancelled or failed run has overwritten the cache too
    w.stop_clear()

    def progress(i: int, n: int, ppl: float) -> None:
        w.post({"type": "perplexity-progress", "seq": seq, "chunk": i, "chunks": n, "ppl": ppl, "n_tokens": len(ids)})

    pp = Perplexity(engine)
    try:
        res = await pp.run(ids, n_ctx, bos_id=tok.bos_id, add_bos=tok.add_bos, on_chunk=progress,
                           should_stop=lambda: bool(w.stop_requested()))
    finally:
        pp.close()
        ids.clear()
    w.post({"type": "perplexity", "seq": seq, "result": res.to_dict()})
