"""`lab bench`: a model's load, prefill and decode speed natively (lab/host/bench/native.py), in the page
(lab/host/bench/browser.py) or in the wllama peer (lab/host/bench/wllama.py); `lab bench kernels`: the matvec and
GEMM kernels alone on a table of weight types and shapes. A refused command line is one line on stderr, exit 2."""

from __future__ import annotations

import json
import sys


class _Refused(Exception):
    """A command line `lab bench` cannot run: the message, printed as it is."""


def bench(args) -> int:
    try:
        if args.model == "kernels":
            return _kernels(args)
        if args.backend == "browser":
            return _in_browser(args)
        if args.backend == "wllama":
            return _in_wllama(args)
        return _native(args)
    except _Refused as exc:
        print(exc, file=sys.stderr)
        return 2


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


# --- lab bench kernels

def _kernels(args) -> int:
    from lab.host.bench import native as native_bench
    picked = _kernel_shapes(args, native_bench.KERNEL_SHAPES)
    rows = native_bench.bench_kernels(picked, repeat=args.repeat, disable=args.disable, wgs=_workgroup_sizes(args))
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'type':7s} {'rows x cols':>14s} {'MB':>8s} {'wg':>4s} {'matvec us':>10s} {'GB/s':>8s} "
          f"{'GEMM us':>10s} {'GFLOP/s':>8s}")
    for r in rows:
        print(f"{r['type']:7s} {r['rows']:>7d}x{r['cols']:<6d} {r['weight_bytes'] / 1e6:8.2f} {r['wg']:>4d} "
              f"{r['matvec_us']:10.1f} {r['matvec_gb_s']:8.2f} {r['matmul_us']:10.1f} {r['matmul_gflop_s']:8.1f}")
    return 0


def _kernel_shapes(args, table) -> list[tuple[str, int, int]]:
    """The (type, rows, cols) to time: with --types and --shapes, every type asked at every shape asked, in the table
    or not; else the table's rows of the types or shapes asked (all of them, for neither)."""
    from lab.format.ggml import BY_NAME
    types = list(dict.fromkeys(args.types.split(","))) if args.types else None
    shapes = list(dict.fromkeys(args.shapes.split(","))) if args.shapes else None
    if types and (unknown := [t for t in types if t not in {sh[0] for sh in table}]):
        raise _Refused(f"lab bench kernels: no shapes of type {', '.join(unknown)} (the table has "
                       f"{', '.join(dict.fromkeys(sh[0] for sh in table))})")
    if types and shapes:
        dims = _dims(args.shapes, shapes)
        if bad := [f"{t} {r}x{c}" for t in types for r, c in dims if c % BY_NAME[t].block]:
            raise _Refused(f"lab bench kernels: a row must hold whole blocks: {', '.join(bad)}")
        picked = [(t, r, c) for t in types for r, c in dims]
    else:
        picked = [sh for sh in table if (types is None or sh[0] in types)
                  and (shapes is None or f"{sh[1]}x{sh[2]}" in shapes)]
    if not picked:
        raise _Refused(f"lab bench kernels: no shapes {args.shapes} of types {args.types or 'any'}")
    return picked


def _dims(flag: str, shapes: list[str]) -> list[tuple[int, int]]:
    """(rows, cols) of each ROWSxCOLS; `flag`: --shapes as typed, for the message."""
    try:
        dims = [tuple(int(v) for v in sh.split("x")) for sh in shapes]
        if any(len(d) != 2 or min(d) < 1 for d in dims):
            raise ValueError
    except ValueError:
        raise _Refused(f"lab bench kernels: --shapes {flag}: each shape is ROWSxCOLS, e.g. 14336x4096") from None
    return dims


def _workgroup_sizes(args) -> tuple[int | None, ...]:
    """--wg's sizes; (None,) without it: matvec_wg's own choice."""
    sizes = {str(1 << i): 1 << i for i in range(9)}      # powers of two, 1 to 256
    if args.wg and any(v not in sizes for v in args.wg.split(",")):
        raise _Refused(f"lab bench kernels: --wg {args.wg}: powers of two from 1 to 256")
    return tuple(sizes[v] for v in args.wg.split(",")) if args.wg else (None,)


# --- lab bench MODEL --backend browser | wllama

def _in_browser(args) -> int:
    from lab.host.bench import browser as bench_browser
    from lab.instruments.profile import REPS
    _real_model_for(args, "the page chats")

    def run(path, chromium, flags):
        return bench_browser.bench_browser(path, prompts=_ints(args.prompts or "32"), decode_tokens=args.decode or 8,
                                           chromium=chromium, args=flags, int8=args.int8,
                                           profile=REPS if args.profile else 0, warm_gpu_s=args.warm_gpu, kv=args.kv)
    return _in_page(args, run)


def _in_wllama(args) -> int:
    from lab.host.bench import wllama as bench_wllama
    _real_model_for(args, "wllama takes text prompts")
    if args.profile or args.int8 or args.kv != "f32":
        raise _Refused("lab bench: --profile, --int8 and --kv are the lab's; wllama has none of them "
                       "(its cache is f16)")

    def run(path, chromium, flags):
        return bench_wllama.bench_wllama(path, prompts=_ints(args.prompts or "32"), decode_tokens=args.decode or 8,
                                         chromium=chromium, args=flags, warm_gpu_s=args.warm_gpu)
    return _in_page(args, run)


def _real_model_for(args, why: str) -> None:
    """A browser's --synthetic file keeps a real model's header and tokenizer (`why`): refused for a name without
    one among the cached real models."""
    from lab.host import models
    if args.synthetic and args.synthetic not in models.MODELS:
        raise _Refused(f"lab bench: --synthetic {args.synthetic} has no real model to take the header and tokenizer "
                       f"from ({why}): only {', '.join(models.MODELS)} run in the browser")


def _in_page(args, run) -> int:
    """`run(path, chromium, flags)` on the file to bench (browser_args.model_file) in the browser the flags name,
    its result printed as JSON (one line with --json)."""
    from lab.host.bench import browser as bench_browser
    from lab.host.bench import browser_args
    chromium, flags = bench_browser.browser_command(args.chromium, args.chromium_flags, args.chromium_flag)
    try:
        with browser_args.model_file(args.model, args.synthetic) as path:
            res = run(path, chromium, flags)
    except bench_browser.BenchError as exc:
        raise _Refused(f"lab bench: {exc}") from None
    print(json.dumps(res, indent=None if args.json else 2))
    return 0


# --- lab bench MODEL, natively

def _native(args) -> int:
    import tempfile
    from pathlib import Path

    from lab.host.bench import native as native_bench
    with tempfile.TemporaryDirectory() as tmp:
        path = _synthetic_file(args.synthetic, Path(tmp)) if args.synthetic else args.model
        if args.profile:
            t = max(_ints(args.prompts or "1"))
            for row in native_bench.profile_step(path, t=t, context=max(_ints(args.contexts) or (0,)),
                                                 disable=args.disable, warm_gpu_s=args.warm_gpu, kv=args.kv):
                print(json.dumps(row))
            return 0
        res = native_bench.bench_model(path, prompts=_ints(args.prompts or "128,512"), contexts=_ints(args.contexts),
                                       decode_tokens=args.decode or 32, max_batch=args.batch, disable=args.disable,
                                       warm_gpu_s=args.warm_gpu, kv=args.kv)
    print(json.dumps(res, indent=None if args.json else 2))
    return 0


def _synthetic_file(name: str, folder):
    """A random GGUF of the --synthetic model's shapes and types written in `folder`, with the placeholder vocabulary:
    the same bytes llama.cpp benchmarks (scripts/device_llamacpp.sh)."""
    from lab.host.synthetic import releases as synthetic
    if name not in synthetic.SPECS:
        raise _Refused(f"lab bench: --synthetic {name!r} is not one of {', '.join(synthetic.SPECS)}")
    return synthetic.write(name, folder / f"{name}.gguf", vocab=True)
