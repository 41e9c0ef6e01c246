"""`lab train` and `lab gradcheck`: a LoRA adapter, a full fine-tune or a model from scratch trained natively on a
text file (lab.instruments.training), and the whole model's gradients held to float64 central differences
(lab.host.gradcheck)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def train(args) -> int:
    from lab.instruments.training import Optim, Trainer, model_bytes
    if args.backend == "browser":
        return _train_in_page(args)
    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    engine, tok, out = _scratch(args) if args.scratch else _model(args)
    try:
        data = _data(args, text, tok, engine)
        if args.scratch and args.steps == 0:        # the untrained model, as drawn: what a run from it starts at
            out.write_bytes(asyncio.run(model_bytes(engine)))
            print(json.dumps({"out": str(out), "steps": 0}) if args.json else f"{out}: untrained")
            return 0
        optim = Optim(args.optimizer, lr=args.lr, steps=args.steps, warmup=args.warmup,
                      weight_decay=args.weight_decay, clip=args.clip if args.optimizer == "adamw" else 0.0)
        alpha = 2.0 * args.lora_rank if args.lora_alpha is None else args.lora_alpha
        tr = Trainer(engine, T=args.ctx, batch=args.batch, rank=args.lora_rank, alpha=alpha,
                     targets=tuple(t for t in args.lora_targets.split(",") if t), seed=args.seed, optim=optim,
                     full=args.full or args.scratch)
    except BaseException:
        engine.close()
        raise
    losses, held_losses, samples, spent, first_step = _steps(args, tr, tok, data)
    out.write_bytes(asyncio.run(tr.model_bytes() if tr.full else tr.adapter_bytes()))
    profile = None
    if args.profile:        # one window's pass by kernel family (timestamp queries), after the run
        from lab.instruments.profile import ops_by_family
        profile = asyncio.run(ops_by_family(engine.device, tr.window_ops, args.ctx, tr.writes(*data.window(0))))
    # tokens/s over the steps after the first (the first one pays for the pipelines' first dispatches)
    timed = spent - first_step if args.steps > 1 else spent
    per_step = args.batch * args.ctx
    report = {"losses": losses, "held_out": held_losses, "samples": samples,
              "tokens_per_s": per_step * max(1, args.steps - 1) / timed,
              "out": str(out), "seconds": spent, "first_step_s": first_step, "windows": len(data.wins),
              "held_out_windows": len(data.held), "trained_tokens": data.trained_tokens,
              "data": "chat turns" if data.masks is not None else "text",
              "params": tr.n_params, "steps": args.steps, "memory": tr.memory(),
              "profile": profile, "mode": "scratch" if args.scratch else "full" if args.full else "lora",
              "adapter": engine.device.info.name}
    tr.close()
    engine.close()
    if args.json:
        print(json.dumps(report))
    else:
        held_at = f", held out {held_losses[0][1]:.4f} -> {held_losses[-1][1]:.4f}" if data.held else ""
        print(f"{args.steps} steps of {args.batch} x {args.ctx} tokens: loss {losses[0]:.4f} -> {losses[-1]:.4f}"
              f"{held_at}, {report['tokens_per_s']:.1f} tokens/s; {tr.n_params:,} parameters in {out}")
    return 0


SAMPLE_PROMPT = 8      # tokens of a window a checkpoint's sample continues


@dataclass
class Data:
    """A run's windows of --ctx tokens and those held out; from a .jsonl of chat turns, a mask each of the tokens
    trained (its assistant's: lab.instruments.chatdata), None for a text's windows (every token after the first)."""
    wins: list
    held: list
    masks: list | None = None
    held_masks: list | None = None

    def window(self, i: int, held: bool = False) -> tuple:
        wins, masks = (self.held, self.held_masks) if held else (self.wins, self.masks)
        return wins[i], None if masks is None else masks[i]

    def batch(self, s: int, n: int) -> tuple:
        from lab.instruments.training import batch_of
        return batch_of(self.wins, s, n), None if self.masks is None else batch_of(self.masks, s, n)

    @property
    def trained_tokens(self) -> int:
        return (sum(len(w) - 1 for w in self.wins) if self.masks is None
                else sum(sum(m[1:]) for m in self.masks))


def _data(args, text: str, tok, engine) -> Data:
    """The text's windows (as `lab tokenize`: no BOS, no specials), or with a .jsonl file its conversations, one a
    window padded to --ctx, trained on the assistant's tokens (the last --held-out share of each held out)."""
    from lab.instruments import chatdata
    from lab.instruments.training import split
    if not str(args.data).endswith(".jsonl"):
        return Data(*split(tok.encode(text), args.ctx, args.held_out))
    wins, held, masks, held_masks = chatdata.windows(text, tok, engine.header.metadata, args.ctx, args.held_out,
                                                     str(args.data))
    return Data(wins, held, masks, held_masks)


def _steps(args, tr, tok, data: Data):
    """Run the steps: (losses, [[step, held-out loss], ...], [[step, sample], ...], seconds in steps, seconds of the
    first). The held-out loss and the sample (--sample N tokens) before the first step, every tenth of the run and
    after the last, each its own passes outside the timed steps."""
    from lab.instruments.training import held_out_loss
    every = max(1, args.steps // 10)

    def checkpoint():
        return asyncio.run(held_out_loss(tr, data.held, data.held_masks))

    def sample():
        return asyncio.run(_sample(tr, tok, *data.window(0, held=bool(data.held)), args.sample))
    held_losses = [[0, checkpoint()]] if data.held else []
    samples = [[0, sample()]] if args.sample else []
    losses, spent, first_step = [], 0.0, 0.0
    for s in range(args.steps):
        t0 = time.perf_counter()
        losses.append(asyncio.run(tr.step(*data.batch(s, args.batch))))     # the loss's read waits for the step
        spent += (dt := time.perf_counter() - t0)
        first_step = dt if s == 0 else first_step
        at = ""
        if (s + 1) % every == 0 or s + 1 == args.steps:
            if data.held:
                held_losses.append([s + 1, checkpoint()])
                at += f", held out {held_losses[-1][1]:.4f}"
            if args.sample:
                samples.append([s + 1, sample()])
                at += f", sample {samples[-1][1]!r}"
        if not args.json:
            print(f"step {s + 1}/{args.steps}: loss {losses[-1]:.4f}{at}", file=sys.stderr, flush=True)
    return losses, held_losses, samples, spent, first_step


async def _sample(tr, tok, window: list[int], mask: list[bool] | None, n: int) -> str:
    """The model's greedy continuation, n tokens, as the model stands (a checkpoint's sample): of a text window's
    first SAMPLE_PROMPT tokens, or of a conversation's prompt (its tokens before the first trained one), a held-out
    one where there are. Its steps overwrite the KV cache, which each training window writes afresh from position 0,
    so the run is unchanged by it."""
    from lab.engine.session import Session
    from lab.settings import Settings
    cut = SAMPLE_PROMPT if mask is None else mask.index(True)
    res = await Session(tr.engine, tok).generate(window[:cut], Settings(greedy=True), n)
    return (tok.decode(window[:cut]) if mask is None else "") + res.text


def _model(args):
    """(engine, tokenizer, out path) for training MODEL: a LoRA adapter, or with --full its weights."""
    from lab.host import gradcheck as gc
    from lab.host.loading import read_model
    if not args.model:
        raise ValueError("no MODEL to train: name a GGUF, or train a new one with --scratch")
    given = [f for f in _SHAPE if getattr(args, f) is not None]
    given += [f for f in ("tokenizer", "preset") if getattr(args, f)]
    if given:
        named = ", ".join("--" + f.replace("_", "-") for f in given)
        raise ValueError(f"{named}: for a model trained from scratch; add --scratch (and no MODEL)")
    _, _, tok = read_model(args.model)
    suffix = ".trained.gguf" if args.full else ".lora.gguf"
    out = Path(args.out or Path(args.model).name.removesuffix(".gguf") + suffix)
    return gc.open_engine(args.model, args.ctx, args.disable), tok, out


_SHAPE = ("layers", "width", "heads", "kv_heads", "ffn")


def _scratch(args):
    """(engine, tokenizer, out path) for --scratch: the shape (a preset, changed by the flags given) and the trained
    tokenizer's vocabulary as an untrained llama, its weights drawn from --seed."""
    from lab.format import untrained
    from lab.host.loading import open_untrained
    from lab.settings import SCRATCH_PRESETS
    from lab.text.tokenizer import train as bpe
    if args.model:
        raise ValueError(f"--scratch trains a new model: drop MODEL ({args.model})")
    if args.full:
        raise ValueError("--scratch already trains every weight: drop --full")
    if not args.tokenizer or not args.out:
        raise ValueError("--scratch needs --tokenizer FILE.json (a `lab tokenizer-train` file) and --out model.gguf")
    shape = dict(zip(("layers", "width", "heads", "ffn"), SCRATCH_PRESETS[args.preset])) if args.preset else {}
    shape.update({f: getattr(args, f) for f in _SHAPE if getattr(args, f) is not None})
    missing = [f for f in ("layers", "width", "heads") if f not in shape]
    if missing:
        raise ValueError(f"--scratch needs the model's --{', --'.join(missing)} (or a --preset)")
    vocab = bpe.load(args.tokenizer)
    _, tok, engine = open_untrained(untrained.Shape(ctx=args.ctx, **shape), vocab, args.seed, disable=args.disable)
    return engine, tok, Path(args.out)


# What the Training card asks for and what it fixes: a flag set otherwise is refused, not silently dropped.
_PAGE_FIXED = {"lora_alpha": None, "warmup": 0, "weight_decay": 0.0, "clip": 1.0, "seed": 0, "profile": False,
               "disable": [], "full": False, "scratch": False, "held_out": 0.0, "sample": 0, "tokenizer": None,
               "preset": None,
               "layers": None, "width": None, "heads": None, "kv_heads": None, "ffn": None}


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
                 disable=args.disable, full=args.full, masked=args.masked,
                 targets=tuple(t for t in args.lora_targets.split(",") if t))
    if args.json:
        print(json.dumps(r))
    else:
        for row in r["tensors"]:
            print(f"{row['tensor']:48s} {row['worst_rel_err']:.2e}  (largest gradient {row['largest_grad']:.3e})")
        if r.get("missing"):
            print(f"no gradient found for {len(r['missing'])} tensors: {', '.join(r['missing'][:4])}")
        print(f"loss {r['loss_gpu']:.6f} (float64 {r['loss_float64']:.6f}); worst relative error "
              f"{r['worst_rel_err']:.2e} over {len(r['tensors'])} tensors, tolerance {r['tolerance']:.0e}: "
              f"{'ok' if r['ok'] else 'FAILED'}")
    return 0 if r["ok"] else 1
