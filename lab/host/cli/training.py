"""`lab train` and `lab gradcheck`: a LoRA adapter trained natively on a text file (lab.instruments.training), and the
whole model's gradients held to float64 central differences (lab.host.gradcheck)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path


def train(args) -> int:
    from lab.host import gradcheck as gc
    from lab.host.loading import read_model
    from lab.instruments.training import Optim, Trainer, batch_of, windows
    if args.backend == "browser":
        return _train_in_page(args)
    header, cfg, tok = read_model(args.model)
    with open(args.data, encoding="utf-8") as f:
        ids = tok.encode(f.read())          # as `lab tokenize`: no BOS, no special tokens
    wins = windows(ids, args.ctx)
    optim = Optim(args.optimizer, lr=args.lr, steps=args.steps, warmup=args.warmup,
                  weight_decay=args.weight_decay, clip=args.clip if args.optimizer == "adamw" else 0.0)
    engine = gc.open_engine(args.model, args.ctx, args.disable)
    alpha = 2.0 * args.lora_rank if args.lora_alpha is None else args.lora_alpha
    try:
        tr = Trainer(engine, T=args.ctx, batch=args.batch, rank=args.lora_rank, alpha=alpha,
                     targets=tuple(t for t in args.lora_targets.split(",") if t), seed=args.seed, optim=optim,
                     full=args.full)
    except BaseException:
        engine.close()
        raise
    suffix = ".trained.gguf" if args.full else ".lora.gguf"
    out = Path(args.out or Path(args.model).name.removesuffix(".gguf") + suffix)
    losses, marks = [], [time.perf_counter()]
    for s in range(args.steps):
        losses.append(asyncio.run(tr.step(batch_of(wins, s, args.batch))))     # the loss's read waits for the step
        marks.append(time.perf_counter())
        if not args.json:
            print(f"step {s + 1}/{args.steps}: loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
    out.write_bytes(asyncio.run(tr.model_bytes() if args.full else tr.adapter_bytes()))
    profile = None
    if args.profile:        # one window's pass by kernel family (timestamp queries), after the run
        from lab.instruments.profile import ops_by_family
        profile = asyncio.run(ops_by_family(engine.device, tr.window_ops, args.ctx, tr.writes(wins[0])))
    # tokens/s over the steps after the first (the first one pays for the pipelines' first dispatches)
    timed = marks[-1] - marks[1] if args.steps > 1 else marks[-1] - marks[0]
    per_step = args.batch * args.ctx
    report = {"losses": losses, "tokens_per_s": per_step * max(1, args.steps - 1) / timed, "out": str(out),
              "seconds": marks[-1] - marks[0], "first_step_s": marks[1] - marks[0], "windows": len(wins),
              "params": tr.n_params, "steps": args.steps, "memory": tr.memory(), "profile": profile,
              "mode": "full" if args.full else "lora",
              "adapter": engine.device.info.name}
    tr.close()
    engine.close()
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{args.steps} steps of {args.batch} x {args.ctx} tokens: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
              f"{report['tokens_per_s']:.1f} tokens/s; {tr.n_params:,} parameters in {out}")
    return 0


# What the Training card asks for and what it fixes: a flag set otherwise is refused, not silently dropped.
_PAGE_FIXED = {"lora_alpha": None, "warmup": 0, "weight_decay": 0.0, "clip": 1.0, "seed": 0, "profile": False,
               "disable": [], "full": False}


def _train_in_page(args) -> int:
    """`--backend browser`: the same run on the page's Training card (lab/host/bench/browser.py train_page)."""
    from lab.engine.lora import DEFAULT_TARGETS
    from lab.host.bench import browser as bench_browser
    differ = [k for k, v in _PAGE_FIXED.items() if getattr(args, k) != v]
    if args.lora_targets != ",".join(DEFAULT_TARGETS):
        differ.append("lora_targets")
    if differ:
        named = ", ".join("--" + d.replace("_", "-") for d in differ)
        raise ValueError(f"--backend browser trains as the Training card does: {named} cannot be set there")
    chromium, flags = bench_browser.browser_command(args.chromium, args.chromium_flags, args.chromium_flag)
    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    try:
        out = bench_browser.train_page(args.model, text, ctx=args.ctx, batch=args.batch, steps=args.steps,
                                       rank=args.lora_rank, lr=args.lr, optimizer=args.optimizer,
                                       chromium=chromium, args=flags,
                                       adapter_out=Path(args.out) if args.out else None)
    except bench_browser.BenchError as exc:
        print(f"lab train: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


def f32_copy(args) -> int:
    """`lab f32-copy MODEL --out FILE`: the model with every tensor dequantized to F32 (lab.host.f32copy), what full
    fine-tuning trains."""
    from lab.host.f32copy import f32_copy as copy
    from lab.host.loading import read_model
    src, out = Path(args.model), Path(args.out)
    if out.exists() and out.resolve() == src.resolve():
        raise ValueError(f"--out {out} is the model itself: write the copy elsewhere")
    read_model(src)                         # a file the lab reads, or its refusal in words
    t0 = time.perf_counter()
    copy(src, out)
    report = {"model": str(src), "out": str(out), "bytes": out.stat().st_size,
              "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(report) if args.json else f"{out}: {report['bytes']:,} bytes, every tensor F32 "
                                                f"({report['seconds']} s)")
    return 0


def gradcheck(args) -> int:
    from lab.host import gradcheck as gc
    r = gc.check(args.model, T=args.ctx, batch=args.batch, rank=args.rank, samples=args.samples, seed=args.seed,
                 disable=args.disable, full=args.full)
    if args.json:
        print(json.dumps(r))
    else:
        for row in r["tensors"]:
            print(f"{row['tensor']:48s} {row['worst_rel_err']:.2e}  (largest gradient {row['largest_grad']:.3e})")
        print(f"loss {r['loss_gpu']:.6f} (float64 {r['loss_float64']:.6f}); worst relative error "
              f"{r['worst_rel_err']:.2e} over {len(r['tensors'])} tensors, tolerance {r['tolerance']:.0e}: "
              f"{'ok' if r['ok'] else 'FAILED'}")
    return 0 if r["ok"] else 1
