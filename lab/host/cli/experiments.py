"""`lab attribute | ablate | patch | steer`: the Lab class's experiments (lab/host/experiments.py) with their JSON
printed, or a table; ablate and patch also through the page's Experiments card (`--backend browser`)."""

from __future__ import annotations

import json
import sys

from lab.host.cli.parsers import settings


def _lab(args):
    from lab.host.experiments import Lab
    return Lab.load(args.model, args.ctx, args.disable, lora=args.lora)


def _ints(text: str | None):
    return None if text is None else [int(x) for x in text.split(",") if x.strip()]


def _progress(args):
    if args.json:
        return None
    return lambda done, total, seconds: print(f"\r{done}/{total} runs, {seconds:.1f} s", end="", file=sys.stderr,
                                              flush=True)


def _experiment_in_page(args, msg: dict) -> int:
    """`--backend browser`: the same experiment through the page's Experiments card (lab/host/bench/browser.py)."""
    from lab.host.bench import browser as bench_browser
    if args.lora:
        raise ValueError("--lora runs natively: the page takes an adapter in its Training card")
    chromium, flags = bench_browser.browser_command(args.chromium, args.chromium_flags, args.chromium_flag)
    try:
        out = bench_browser.experiment_page(args.model, msg, chromium=chromium, args=flags)
    except bench_browser.BenchError as exc:
        print(f"lab {msg['kind']}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, ensure_ascii=False))
    return 0


def attribute(args) -> int:
    lab = _lab(args)
    try:
        target = lab.token(args.target)
        ids = lab.encode(args.prompt)
        res = lab.attribute(ids, target)
    finally:
        lab.close()
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"target {target} {lab.piece(target)!r}: logit {res['logit']:.4f} at position {len(ids) - 1}")
    print(f"  embedding {res['embedding']:+.4f}")
    for r in res["rows"]:
        top = sorted(range(len(r["heads"])), key=lambda h: -abs(r["heads"][h]))[:3]
        print(f"  layer {r['layer']:3d}  attn {r['attn']:+.4f}  mlp {r['mlp']:+.4f}   heads "
              + ", ".join(f"{h}: {r['heads'][h]:+.3f}" for h in top))
    print(f"  remainder {res['remainder']:+.6f}")
    return 0


def ablate(args) -> int:
    if args.backend == "browser":
        return _experiment_in_page(args, {"kind": "ablate", "prompt": args.prompt, "target": args.target,
                                          "what": args.block or "heads", "mode": args.mode, "heads": args.heads or "",
                                          "layers": "" if args.layer is None else str(args.layer)})
    lab = _lab(args)
    try:
        target = lab.token(args.target)
        ids = lab.encode(args.prompt)
        layers = [args.layer] if args.layer is not None else None
        out = lab.ablate(ids, target, layers=layers, heads=_ints(args.heads), block=args.block, mode=args.mode,
                         on_progress=_progress(args))
    finally:
        lab.close()
    if args.json:
        print(json.dumps(out))
        return 0
    print(file=sys.stderr)
    print(f"target {target} {lab.piece(target)!r}: log-probability {out['base_logprob']:.4f} without ablation "
          f"({out['runs']} runs, {out['seconds']:.2f} s)")
    for r in sorted(out["rows"], key=lambda r: r["delta"])[:args.top]:
        what = f"head {r['head']:3d}" if r["head"] is not None else f"{args.block} block"
        print(f"  layer {r['layer']:3d} {what}: {r['logprob']:.4f} ({r['delta']:+.4f})")
    return 0


def patch(args) -> int:
    if args.backend == "browser":
        return _experiment_in_page(args, {"kind": "patch", "clean": args.clean, "corrupt": args.corrupt,
                                          "target": args.target, "foil": args.foil or "", "site": args.site,
                                          "layers": args.layers or ""})
    lab = _lab(args)
    try:
        target = lab.token(args.target)
        foil = lab.token(args.foil) if args.foil else None
        clean, corrupt = lab.encode(args.clean), lab.encode(args.corrupt)
        out = lab.patch(clean, corrupt, target, foil, site=args.site, layers=_ints(args.layers),
                        on_progress=_progress(args))
        out["positions"] = [lab.piece(i) for i in clean]
    finally:
        lab.close()
    if args.json:
        print(json.dumps(out))
        return 0
    print(file=sys.stderr)
    print(f"target {lab.piece(target)!r} - foil {lab.piece(out['foil_id'])!r}: clean {out['clean_diff']:+.3f}, "
          f"corrupted {out['corrupt_diff']:+.3f}; recovery by ({args.site}, layer, position), {out['runs']} runs in "
          f"{out['seconds']:.2f} s:")
    print("layer " + " ".join(f"{p[:7]:>7s}" for p in out["positions"]))
    for layer, row in zip(out["layers"], out["recovery"]):
        print(f"{layer:5d} " + " ".join(f"{v:7.3f}" for v in row))
    if out["sanity"]:
        print(f"sanity: the last layer patched everywhere gives {out['sanity']['diff']:+.4f} "
              f"({'exactly' if out['sanity']['exact'] else 'NOT'} the clean run's)")
    return 0


def steer(args) -> int:
    import math
    lab = _lab(args)
    try:
        ids = lab.encode(args.prompt)
        vector = lab.steering_vector([lab.encode(t) for t in args.plus], [lab.encode(t) for t in args.minus],
                                     args.layer)
        sampler = settings(args)
        plain = lab.generate(ids, args.n, sampler)
        steered = lab.steer(ids, vector, args.layer, args.scale, args.n, sampler)
    finally:
        lab.close()
    out = {"layer": args.layer, "scale": args.scale, "vector_norm": math.sqrt(float((vector * vector).sum())),
           "plain": plain.to_dict(), "steered": steered.to_dict()}
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
        return 0
    print(f"steering vector at layer {args.layer}: norm {out['vector_norm']:.3f}, scale {args.scale}")
    print(f"--- plain\n{args.prompt}{plain.text}\n--- steered\n{args.prompt}{steered.text}")
    return 0
