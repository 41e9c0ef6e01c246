"""The attention backward's GPU time by variant (the lanes, the tiles), natively, at the shapes of the models training
runs: what the tiles gain where (docs/performance.md). A benchmark, not a test: the kernels' correctness is
tests/kernels/test_backward_attention.py's. (Tiles of 64 or 32 query rows by 32 or 16 keys were measured on the H100
within 10% of each other, 64 x 32 the fastest at heads of 128 and 256: docs/results/2026-12-07-training-tiles-h100.)

    python scripts/bench_attention_back.py [--reps 7] > attention_back.json

Prints one JSON object: the adapter and, per (model, T), each variant's median GPU time of one step's attention
backward (timestamp queries: lab.gpu Device.time_pass) in microseconds, at pos 0 over T keys (a training window).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab import gpu, ops  # noqa: E402
from lab.host.native import open_native  # noqa: E402
from lab.ops import backward_attention as ba  # noqa: E402
from lab.gpu.shaders import KernelCache  # noqa: E402

# (name, n_head, n_kv_head, head_dim): the models of docs/performance.md's training table
SHAPES = [("smollm2-135m", 9, 3, 64), ("qwen2.5-0.5b", 14, 2, 64), ("llama-3.1-8b", 32, 8, 128),
          ("gemma-3-270m", 4, 1, 256)]


def _variants(dev, hd: int) -> list[tuple[str, dict]]:
    return [("lanes", dict(tiles=False))] + ([("tiles", dict(tiles=True))] if ba.can_tile(dev, hd) else [])


def bench(dev, kernels, name: str, nh: int, nkv: int, hd: int, T: int, reps: int) -> dict:
    rng = np.random.default_rng(0)
    conv = gpu.CONVERSATION

    def up(rows: int, width: int, label: str) -> gpu.Buffer:
        b = dev.buffer(4 * rows * width, conv, label)
        dev.write(b, (rng.standard_normal(rows * width) * 0.5).astype(np.float32).tobytes())
        return b
    q, o, do = (up(T, nh * hd, n) for n in ("q", "o", "do"))
    k, v = (up(T, nkv * hd, n) for n in ("k", "v"))
    dq, dk, dv = up(T, nh * hd, "dq"), up(T, nkv * hd, "dk"), up(T, nkv * hd, "dv")
    stats = dev.buffer(ba.stats_bytes(T, nh), conv, "stats")
    step = ops.make_step(dev, "bench step")
    res = {}
    for label, kw in _variants(dev, hd):
        try:
            plan = ba.attention_back(dev, kernels, q, k, v, o, do, dq, dk, dv, stats, step, n_head=nh,
                                     n_kv_head=nkv, head_dim=hd, n_ctx=T, max_tokens=T, **kw)
        except gpu.GpuError as e:         # e.g. lavapipe's loop budget
            res[label] = str(e)
            continue
        dispatches = ops.dispatches(plan, T)
        writes = [(step, 0, ops.step_bytes(0, T, T))]
        times = [asyncio.run(dev.time_pass(dispatches, writes)) for _ in range(reps + 2)][2:]
        res[label] = round(statistics.median(times) * 1e6, 1)
    for b in (q, o, do, k, v, dq, dk, dv, stats, step):
        dev.destroy(b)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--ctx", default="128,512")
    args = ap.parse_args()
    dev = open_native()
    kernels = KernelCache(dev)
    out = {"adapter": dev.info.name, "us": {}}
    for name, nh, nkv, hd in SHAPES:
        for T in (int(x) for x in args.ctx.split(",")):
            out["us"][f"{name} T={T}"] = bench(dev, kernels, name, nh, nkv, hd, T, args.reps)
            print(name, T, out["us"][f"{name} T={T}"], file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
