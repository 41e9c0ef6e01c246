"""A model trained from scratch by the lab and by PyTorch eager from the same start, on the same windows in the same
order (issue #44 part 2: "record ours against PyTorch on the same data, same init, same order"): the loss curves side
by side and the final difference. Natively (wgpu) here or on the lent GPU; PyTorch through scripts/torch_train_bench.py
with `--torch-python` (a Python with torch; the CPU here, CUDA there).

    python scripts/bench_scratch.py --corpus README.md docs/*.md --preset nano --ctx 64 --batch 4 --steps 200 \
        --lr 3e-3 [--torch-python /work/torchvenv/bin/python] --out DIR

1. A byte-level BPE vocabulary of --vocab tokens trained on the corpus (`lab tokenizer-train`); bytes per token.
2. The untrained model drawn from --seed (`lab train --scratch --steps 0`): the start both sides load.
3. `lab train --scratch` with the run's settings, the last --held-out share of the windows held out (their loss
   measured through the run): the same start, since the same shape and seed draw the same weights.
4. PyTorch: torch_train_bench.py --full on the untrained file, the same windows (the same held-out share left out,
   the steps wrapping over the rest alike) and AdamW with the same schedule and clip.

Writes DIR/scratch.json: {corpus, vocab, bytes_per_token, shape, params, run, lab: {losses, held_out, tokens_per_s,
adapter}, torch: {losses, tokens_per_s, device} or null, final: the mean of the last tenth of the steps' losses for
each and their difference}, and DIR/scratch.svg: the two training curves overlaid, the held-out points beside them.
Prints a summary line. `--plot FILE.json` draws the SVG of an earlier run's JSON (next to it) and does nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def lab(*argv: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "lab.host.cli", *argv, "--json"], check=True, capture_output=True,
                         text=True, cwd=ROOT)
    return json.loads(out.stdout.splitlines()[-1])


def svg(report: dict) -> str:
    """The run's loss curves as an SVG: the lab's training loss (a line), PyTorch's (a dashed line), the lab's held-out
    loss (dots), one scale; the title says the model, the run and the final difference."""
    W, H, L, R, T, B = 720, 360, 56, 16, 48, 40
    lab, torch = report["lab"]["losses"], (report["torch"] or {}).get("losses") or []
    held = report["lab"]["held_out"]
    values = lab + torch + [h for _, h in held]
    lo, hi = min(values), max(values)
    steps = len(lab)
    x = lambda s: L + (W - L - R) * s / max(1, steps)                           # noqa: E731
    y = lambda v: T + (H - T - B) * (hi - v) / (hi - lo or 1)                   # noqa: E731
    line = lambda vs: " ".join(f"{x(i + 1):.1f},{y(v):.1f}" for i, v in enumerate(vs))   # noqa: E731
    f = report["final"]
    title = (f"{report['preset']}: {report['params']:,} parameters, {report['run']['steps']} steps of "
             f"{report['run']['batch']} x {report['run']['ctx']} tokens on {report['lab']['adapter'].split(' (')[0]}")
    sub = f"last tenth: lab {f['lab']:.3f}" + (f", PyTorch {f['torch']:.3f} ({f['difference']:+.4f})" if torch else "")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="18" font-size="13">{title}</text>', f'<text x="{L}" y="34" fill="#555">{sub}</text>',
           f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#bbb"/>']
    for v in (lo, (lo + hi) / 2, hi):
        out.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    out += [f'<text x="{x(0):.1f}" y="{H - B + 16}">0</text>',
            f'<text x="{x(steps):.1f}" y="{H - B + 16}" text-anchor="end">{steps}</text>',
            f'<text x="{(L + W - R) / 2}" y="{H - 8}" text-anchor="middle">step</text>',
            f'<polyline points="{line(lab)}" fill="none" stroke="#1f5fbf" stroke-width="1.5"/>']
    if torch:
        out.append(f'<polyline points="{line(torch)}" fill="none" stroke="#d9730d" stroke-width="1.5" '
                   f'stroke-dasharray="5,3"/>')
    out += [f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3.5" fill="#2a9d4a"/>' for s, v in held]
    legend = [("#1f5fbf", "", "the lab: training loss"), ("#d9730d", "5,3", "PyTorch eager: training loss")][
        :2 if torch else 1]
    for i, (color, dash, text) in enumerate(legend):
        yy = T + 16 + 16 * i
        out += [f'<line x1="{W - R - 230}" x2="{W - R - 206}" y1="{yy}" y2="{yy}" stroke="{color}" stroke-width="1.5"'
                + (f' stroke-dasharray="{dash}"' if dash else "") + "/>",
                f'<text x="{W - R - 200}" y="{yy + 4}">{text}</text>']
    yy = T + 16 + 16 * len(legend)
    out += [f'<circle cx="{W - R - 218}" cy="{yy}" r="3.5" fill="#2a9d4a"/>',
            f'<text x="{W - R - 200}" y="{yy + 4}">the lab: held-out loss</text>', "</svg>"]
    return "\n".join(out) + "\n"


def main() -> None:
    from lab.settings import SCRATCH_PRESETS
    if sys.argv[1:2] == ["--plot"]:
        src = Path(sys.argv[2])
        src.with_suffix(".svg").write_text(svg(json.loads(src.read_text())))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", nargs="+", required=True, help="text files, joined in the order given")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--preset", choices=tuple(SCRATCH_PRESETS), default="nano")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held-out", type=float, default=0.1)
    ap.add_argument("--torch-python", help="a Python with torch for the peer (none: the lab alone)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    from lab.text.tokenizer import train as bpe
    args.out.mkdir(parents=True, exist_ok=True)
    text = "".join(Path(p).read_text(encoding="utf-8") for p in args.corpus)
    with tempfile.TemporaryDirectory() as tmp:
        corpus, tok, init = Path(tmp) / "corpus.txt", Path(tmp) / "tok.json", Path(tmp) / "init.gguf"
        corpus.write_text(text, encoding="utf-8")
        trained = bpe.train([text], args.vocab)
        trained.save(tok)
        bpt = bpe.bytes_per_token(trained.tokenizer(), [text], len(text.encode("utf-8")))
        common = ["--data", str(corpus), "--ctx", str(args.ctx), "--batch", str(args.batch), "--lr", str(args.lr),
                  "--seed", str(args.seed)]       # no warm-up: the peer's schedule has none
        shape = ["--scratch", "--preset", args.preset, "--tokenizer", str(tok)]
        lab("train", *shape, *common, "--steps", "0", "--out", str(init))
        ours = lab("train", *shape, *common, "--steps", str(args.steps), "--held-out", str(args.held_out),
                   "--out", str(Path(tmp) / "trained.gguf"))
        peer = None
        if args.torch_python:
            got = subprocess.run([args.torch_python, str(ROOT / "scripts" / "torch_train_bench.py"), str(init),
                                  "--full", "--data", str(corpus), "--ctx", str(args.ctx), "--batch", str(args.batch),
                                  "--steps", str(args.steps), "--lr", str(args.lr), "--warmup-steps", "1",
                                  "--held-out", str(args.held_out)],
                                 check=True, capture_output=True, text=True, cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                     [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])})
            peer = json.loads(got.stdout.splitlines()[-1])
    tail = max(1, args.steps // 10)
    final = {"lab": sum(ours["losses"][-tail:]) / tail}
    if peer:
        final["torch"] = sum(peer["losses"][-tail:]) / tail
        final["difference"] = final["lab"] - final["torch"]
    report = {"corpus": [str(p) for p in args.corpus], "corpus_bytes": len(text.encode("utf-8")),
              "vocab": len(trained.tokens), "bytes_per_token": bpt, "preset": args.preset,
              "shape": SCRATCH_PRESETS[args.preset], "params": ours["params"],
              "run": {k: getattr(args, k) for k in ("ctx", "batch", "steps", "lr", "seed", "held_out")},
              "lab": {k: ours[k] for k in ("losses", "held_out", "tokens_per_s", "adapter", "windows",
                                           "held_out_windows")},
              "torch": {k: peer.get(k) for k in ("losses", "tokens_per_s", "device")} if peer else None,
              "final": final}
    (args.out / "scratch.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "scratch.svg").write_text(svg(report))
    held = ours["held_out"]
    print(f"{args.preset}: {ours['params']:,} parameters, {len(trained.tokens)} tokens ({bpt:.2f} bytes each); "
          f"training loss {ours['losses'][0]:.3f} -> {final['lab']:.3f} (last tenth), held out {held[0][1]:.3f} -> "
          f"{held[-1][1]:.3f}; {ours['tokens_per_s']:.0f} tokens/s on {ours['adapter']}"
          + (f"; PyTorch {final['torch']:.3f} ({final['difference']:+.4f}), {peer['tokens_per_s']:.0f} tokens/s on "
             f"{peer.get('device')}" if peer else ""))


if __name__ == "__main__":
    main()
