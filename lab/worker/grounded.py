"""The worker's side of the Training card's grounded answers (issue #44 part 4 in the page, web/training.js): the set
a LoRA learns to answer from the sources or decline on, made from the files the retrieval card indexed, and the
model's replies to its held-out rows measured with and without the card's adapter. The set and the measure are
lab.instruments.grounded's, as `lab grounded-data` and `lab grounded-eval` run them.

    grounded-set {seq} -> "grounded-set" {seq, files, train, held (each a .jsonl text), rows, refusals, held_rows,
        held_refusals}: the indexed files' text (their token ids decoded) made into the set; nothing is kept here
    grounded-eval {held (.jsonl text), max_new, seq} -> "grounded-row" {seq, which, done, total, answerable, refused,
        grounding}... then "grounded-eval" {seq, without, with (each Score.to_dict, or null), stopped}: each held-out
        row's greedy reply to its own passages, by the model without the adapter and with it (a run that trained
        every weight, or none trained: the model as it is, under "with" or "without")

The replies run on a session of their own from an empty cache, as the Training card's with / without replies do; the
adapter is left as the switch says and the chat's session is reset. Stop (the page's) ends the measure after the
reply in flight; the rows measured so far are reported. The held-out text comes from the page each time (it keeps
the set as the user's data until Forget): nothing of it stays in the worker.

What it does not know: the page (it posts dicts), how a row is made or scored (lab/instruments/grounded.py).
"""

from __future__ import annotations

import json

from lab.engine.session import Session
from lab.instruments import grounded
from lab.settings import TRAINING, Settings
from lab.text import chat
from lab.worker.cards import INDEX
from lab.worker.cards import TRAINING as CARD
from lab.worker.state import Worker
from lab.worker.training import number, use_adapter

NO_FILES = "no files: index some text files in the retrieval card first; the set is made from them"
MAX_ROWS = 500      # held-out rows a measure takes: a reply each, twice


def _json_lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


async def make_set(msg: dict, w: Worker) -> None:
    lo = w.loaded()
    index = lo.held(INDEX)
    if index is None or not index.prepared.names:
        raise grounded.GroundedDataError(NO_FILES)
    p, tok = index.prepared, lo.tokenizer
    files = [(name, tok.decode(ids)) for name, ids in zip(p.names, p.ids)]
    train, held = grounded.make_set(files)
    count = lambda rows: sum(not r["answerable"] for r in rows)     # noqa: E731
    w.post({"type": "grounded-set", "seq": msg.get("seq"), "files": [n for n, _ in files], "train": _json_lines(train),
            "held": _json_lines(held), "rows": len(train), "refusals": count(train), "held_rows": len(held),
            "held_refusals": count(held)})


async def measure(msg: dict, w: Worker) -> None:
    lo = w.loaded()
    seq, tok = msg.get("seq"), lo.tokenizer
    rows = grounded.held_rows(str(msg.get("held") or ""), "the held-out set")
    if len(rows) > MAX_ROWS:
        raise grounded.GroundedDataError(f"{len(rows)} held-out rows: at most {MAX_ROWS} a measure")
    max_new = number(msg, "max_new", int, TRAINING.max_new, 1, lo.engine.n_ctx // 2, "the reply's tokens")
    prompts = [chat.render_chat(tok, lo.engine.header.metadata, r["messages"][:-1]) for r in rows]
    longest = max(len(p) for p in prompts)
    if longest + max_new > lo.engine.n_ctx:
        raise grounded.GroundedDataError(f"a held-out prompt is {longest} tokens: with {max_new} for the reply it "
                                         f"passes the context of {lo.engine.n_ctx}; load the model with a longer one")
    state = lo.held(CARD)
    lora = None if state is None or state.whole else state.lora
    runs = (("without", None), ("with", lora)) if lora is not None else (("with" if state else "without", None),)
    session, scores, stopped = Session(lo.engine, tok), {"without": None, "with": None}, False
    w.stop_clear()
    try:
        for which, adapter in runs:
            use_adapter(lo, adapter)
            score = grounded.Score()
            for i, (r, prompt) in enumerate(zip(rows, prompts)):
                session.reset()
                res = await session.generate(prompt, Settings(greedy=True), max_new, should_stop=w.stop_requested)
                got = score.add(r["answerable"], res.text, r["passages"])
                w.post({"type": "grounded-row", "seq": seq, "which": which, "done": i + 1, "total": len(rows),
                        "answerable": r["answerable"], **got})
                stopped = bool(w.stop_requested())
                if stopped:
                    break
            scores[which] = score.to_dict()
            if stopped:
                break
    finally:
        session.reset()
        lo.session.reset()
        use_adapter(lo, state.lora if state is not None and state.on else None)
    w.post({"type": "grounded-eval", "seq": seq, **scores, "stopped": stopped})
