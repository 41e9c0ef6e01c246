"""`lab train-embedder`: the retrieval card's embedder tuned contrastively on the files it indexes
(lab/instruments/contrastive.py), natively, with the index's recall measured before and after each stage on the
same random crops (lab/instruments/retrieval.py), beside the token-overlap baseline."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path

from lab.host.cli.retrieval import _build, _read_files
from lab.host.loading import open_engine

SHORT = 12      # the short queries' crop (the reference's second column): a question, not a passage's piece


def _recall(engine, tok, files, args) -> dict:
    """recall@1 and @5 of a fresh index of the files (the model as it is now) on CROP- and SHORT-token crops."""
    from lab.instruments.retrieval import CROP, Index
    index = Index(engine, tok, window=args.window, stride=args.stride)

    async def run():
        await _build(index, files, "lab train-embedder")
        return {f"crop{n}": (await index.recall(args.queries, args.seed, crop=n)).to_dict() for n in (CROP, SHORT)}
    try:
        return asyncio.run(run())
    finally:
        index.drop()


def _stage(c, stage: str, wins, args, rng) -> dict:
    from lab.instruments.contrastive import pairs_of
    losses, t0 = [], time.perf_counter()
    for step in range(args.steps):
        losses.append(asyncio.run(c.step(pairs_of(stage, wins, args.batch, rng))))
        print(f"\rlab train-embedder: {stage} step {step + 1}/{args.steps}, loss {losses[-1]:.4f}   ", end="",
              file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {"stage": stage, "steps": args.steps, "losses": losses, "seconds": time.perf_counter() - t0}


def train_embedder(args) -> int:
    from lab.instruments import contrastive
    from lab.instruments.retrieval import CROP, Index, overlap_recall
    from lab.instruments.training import Optim, adapter_bytes, model_bytes
    files, _digests, _refused = _read_files(args.files, "lab train-embedder")
    stages = list(contrastive.STAGES) if args.stage == "both" else [args.stage]
    n = max(args.window, contrastive.QUERY) + 1
    _header, tok, engine, _t = open_engine(args.model, max(args.ctx, n), max_batch=n, disable=args.disable)
    c = None
    try:
        prepared = Index(engine, tok, window=args.window, stride=args.stride).prepare(files)
        wins = contrastive.windows(prepared.ids, args.window)
        report = {"model": Path(args.model).name, "files": [{"name": f, "tokens": len(i)}
                                                            for f, i in zip(prepared.names, prepared.ids)],
                  "tokens": prepared.n_tokens, "train_windows": len(wins), "window": args.window,
                  "temperature": contrastive.TEMPERATURE, "pairs": args.batch, "lr": args.lr,
                  "overlap": {f"crop{k}": overlap_recall(prepared, args.queries, args.seed, k).to_dict()
                              for k in (CROP, SHORT)},
                  "before": _recall(engine, tok, files, args), "stages": []}
        contrastive.pairs_of(stages[0], wins, args.batch, random.Random(0))       # refused before any training
        c = contrastive.Contrastive(engine, tok, T=args.window, pairs=args.batch, rank=args.lora_rank,
                                    alpha=2.0 * args.lora_rank, seed=args.seed, full=args.full,
                                    optim=Optim("adamw", lr=args.lr, steps=args.steps * len(stages), clip=1.0))
        rng = random.Random(args.seed)
        for stage in stages:
            report["stages"].append(_stage(c, stage, wins, args, rng) | {"recall": _recall(engine, tok, files, args)})
        out = Path(args.out)
        tr = c.trainer
        out.write_bytes(asyncio.run(model_bytes(engine) if args.full else
                                    adapter_bytes(engine, tr.lora, name=f"llm-lab embedder r{args.lora_rank}")))
        report |= {"out": str(out), "params": tr.n_params, "mode": "full" if args.full else "lora"}
    finally:
        if c is not None:
            c.close()
        engine.close()
    print(json.dumps(report) if args.json else _table(report))
    return 0


def _table(r: dict) -> str:
    row = lambda name, rec: (f"| {name} | {rec['crop24']['recall_at_1']:.3f} | {rec['crop24']['recall_at_5']:.3f} "  # noqa: E731
                             f"| {rec['crop12']['recall_at_1']:.3f} | {rec['crop12']['recall_at_5']:.3f} |")
    lines = [f"{r['model']} on {len(r['files'])} file(s), {r['tokens']:,} tokens, {r['train_windows']} windows of "
             f"{r['window']}; {r['pairs']} pairs a step, temperature {r['temperature']}, lr {r['lr']}",
             "| | recall@1 (24) | recall@5 (24) | recall@1 (12) | recall@5 (12) |", "| --- | --- | --- | --- | --- |",
             row("token overlap", r["overlap"]), row("untuned", r["before"])]
    for s in r["stages"]:
        lines.append(row(f"after {s['stage']} ({s['steps']} steps, loss {s['losses'][0]:.3f} -> "
                         f"{s['losses'][-1]:.3f})", s["recall"]))
    return "\n".join(lines + [f"{r['params']:,} parameters in {r['out']}"])
