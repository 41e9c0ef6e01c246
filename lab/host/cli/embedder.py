"""`lab train-embedder`: the retrieval card's embedder tuned contrastively on the files it indexes
(lab/instruments/contrastive.py), natively, with the index's recall measured before and after each stage on the
same random crops, beside the token-overlap baseline: the run's pieces and its table are lab/instruments/embedder.py's,
which the Retrieval card's "Tune on these files" runs too."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

from lab.host.cli.retrieval import _read_files
from lab.host.loading import open_engine


def train_embedder(args) -> int:
    from lab.instruments import contrastive, embedder
    from lab.instruments.retrieval import Index
    from lab.instruments.training import Optim, adapter_bytes, model_bytes
    files, _digests, _refused = _read_files(args.files, "lab train-embedder")
    stages = embedder.stages_of(args.stage)
    n = max(args.window, contrastive.QUERY) + 1
    _header, tok, engine, _t = open_engine(args.model, max(args.ctx, n), max_batch=n, disable=args.disable)
    c = None
    try:
        prepared = Index(engine, tok, window=args.window, stride=args.stride).prepare(files)
        wins = contrastive.windows(prepared.ids, args.window)
        measure = dict(window=args.window, stride=args.stride, queries=args.queries, seed=args.seed)
        report = {"model": Path(args.model).name, "files": [{"name": f, "tokens": len(i)}
                                                            for f, i in zip(prepared.names, prepared.ids)],
                  "tokens": prepared.n_tokens, "train_windows": len(wins), "window": args.window,
                  "temperature": contrastive.TEMPERATURE, "pairs": args.batch, "lr": args.lr,
                  "overlap": embedder.overlap(prepared, args.queries, args.seed),
                  "before": asyncio.run(embedder.measured(engine, tok, prepared, **measure)), "stages": []}
        contrastive.pairs_of(stages[0], wins, args.batch, random.Random(0))       # refused before any training
        c = contrastive.Contrastive(engine, tok, T=args.window, pairs=args.batch, rank=args.lora_rank,
                                    alpha=2.0 * args.lora_rank, seed=args.seed, full=args.full,
                                    optim=Optim("adamw", lr=args.lr, steps=args.steps * len(stages), clip=1.0))
        rng = random.Random(args.seed)
        for stage in stages:
            def on_step(done, loss, _seconds, stage=stage):
                print(f"\rlab train-embedder: {stage} step {done}/{args.steps}, loss {loss:.4f}   ", end="",
                      file=sys.stderr, flush=True)
            s = asyncio.run(embedder.train_stage(c, stage, wins, args.steps, args.batch, rng, on_step))
            print(file=sys.stderr)
            s["recall"] = asyncio.run(embedder.measured(engine, tok, prepared, **measure))
            report["stages"].append(s)
            if s["diverged"]:
                break
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
    from lab.instruments.embedder import markdown
    head = (f"{r['model']} on {len(r['files'])} file(s), {r['tokens']:,} tokens, {r['train_windows']} windows of "
            f"{r['window']}; {r['pairs']} pairs a step, temperature {r['temperature']}, lr {r['lr']}")
    return "\n".join([head, *markdown(r), f"{r['params']:,} parameters in {r['out']}"])
