"""`lab grounded-data` and `lab grounded-eval`: the set a LoRA learns to answer from the sources or decline on, made
from the user's files by rule, and a model's replies to its held-out rows measured (lab.instruments.grounded).
Training is `lab train MODEL --data SET.jsonl`: a .jsonl of chat turns trains on the assistant's tokens alone."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from lab.host.cli.retrieval import _read_files


def grounded_data(args) -> int:
    from lab.instruments import grounded
    from lab.instruments.retrieval import read_text
    raw, _digests, _refused = _read_files(args.files, "lab grounded-data")
    files = []
    for name, data in raw:
        try:
            files.append((name, read_text(name, data)))
        except ValueError as exc:
            print(f"lab grounded-data: refused {exc}", file=sys.stderr)
    if not files:
        raise grounded.GroundedDataError("no readable text file among FILES")
    train, held = grounded.make_set(files, seed=args.seed, refusals=args.refusals, held_out=args.held_out,
                                    per_passage=args.per_passage)
    out = Path(args.out)
    held_out = out.with_name(out.name.removesuffix(".jsonl") + ".heldout.jsonl")
    for path, rows in ((out, train), (held_out, held)):
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    count = lambda rows: {"rows": len(rows), "refusals": sum(not r["answerable"] for r in rows)}   # noqa: E731
    report = {"out": str(out), "held_out": str(held_out), "train": count(train), "held": count(held),
              "files": [name for name, _ in files]}
    print(json.dumps(report) if args.json else
          f"{out}: {report['train']['rows']} rows ({report['train']['refusals']} decline); {held_out}: "
          f"{report['held']['rows']} held-out rows ({report['held']['refusals']} decline)")
    return 0


def grounded_eval(args) -> int:
    from lab.host import index_file
    from lab.host.loading import open_engine, read_model
    from lab.instruments import grounded
    rows = grounded.held_rows(Path(args.set).read_text(encoding="utf-8"), args.set)
    rows = rows[:args.limit] if args.limit else rows
    model = read_model(args.model)
    saved = index_file.load(args.index, index_file.model_info(args.model, model[0], model[1])) if args.index else None
    header, tok, engine, _t = open_engine(args.model, args.ctx, disable=args.disable, model=model, lora=args.lora)
    try:
        score, replies = asyncio.run(_replies(args, rows, header, tok, engine, saved))
    finally:
        engine.close()
    report = {"model": Path(args.model).name, "lora": args.lora, "set": args.set, "retrieved": bool(args.index),
              **score.to_dict(), "replies": replies}
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        pct = lambda v: "-" if v is None else f"{100 * v:.0f}%"     # noqa: E731
        print(f"{len(rows)} rows: refuses when it should {pct(report['refuses_when_it_should'])} "
              f"(of {score.should_refuse}), refuses when it should not {pct(report['refuses_when_it_should_not'])} "
              f"(of {score.should_answer}), grounding {pct(report['grounding'])} (of {score.answered} replies)")
    return 0


async def _replies(args, rows, header, tok, engine, saved):
    """Each row's greedy reply (at most -n tokens) to its prompt: its own passages, or with an index the question's
    -k retrieved ones (then it should answer when one of them holds its answer); scored (grounded.Score). Every
    prompt is rendered and measured against the context before the first reply, so a row too long is refused by its
    line before any time is spent."""
    from lab.engine.session import Session
    from lab.instruments import grounded
    from lab.instruments.retrieval import Index, pack_messages
    from lab.settings import Settings
    from lab.text import chat
    asks = []
    index = None
    if saved is not None:
        index = Index(engine, tok, window=saved.window, stride=saved.stride)
        await index.restore(saved.prepared(), saved.embeddings.tobytes())
    try:
        for r in rows:
            if index is None:
                messages, sources, answerable = r["messages"][:-1], r["passages"], r["answerable"]
            else:
                hits = await index.search(tok.encode(r["question"]), args.k)
                messages, sources = pack_messages(r["question"], hits), [h.text for h in hits]
                answerable = r["answer"] is not None and any(grounded.holds(s, r["answer"]) for s in sources)
            asks.append((r, chat.render_chat(tok, header.metadata, messages), sources, answerable))
    finally:
        if index is not None:
            index.close()
    r, prompt, _s, _a = max(asks, key=lambda a: len(a[1]))
    if len(prompt) + args.n > engine.n_ctx:
        raise grounded.GroundedDataError(
            f"{args.set} line {r['line']}: its prompt is {len(prompt)} tokens, with -n {args.n} for the reply more "
            f"than the context of {engine.n_ctx}: run with --ctx {len(prompt) + args.n} or more")
    score, out = grounded.Score(), []
    for i, (r, prompt, sources, answerable) in enumerate(asks):
        res = await Session(engine, tok).generate(prompt, Settings(greedy=True), args.n)
        out.append({"line": r["line"], "answerable": answerable, "reply": res.text,
                    **score.add(answerable, res.text, sources)})
        print(f"\rlab grounded-eval: {i + 1}/{len(rows)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return score, out
