"""GPU time of one step by kernel family, from timestamp queries: `lab bench --profile` natively and the worker's
`profile` message in the page run this same code, so the two backends' figures compare kernel by kernel.

Each family is timed as one pass holding only its dispatches, in plan order (the barriers between them stay);
the families' sum falls short of the whole pass by what the switches between kernels cost. The median of
`reps` passes is kept: the first pass after a quiet spell runs at lower clocks."""

from __future__ import annotations

import random
import time

from lab import ops
from lab.engine.engine import Engine

REPS = 7
TUNING = ("IN", "BIAS", "ACT")     # pipeline constants that change what a kernel computes; the others only tune


def prime(engine: Engine, t: int, pos: int, seed: int = 0) -> None:
    """Make a step of t tokens at `pos` ready to time: refused as a chat's step would be if the engine cannot run it,
    else t random ids put in the engine's ids buffer. They go in by a step at 0, not at pos: a hybrid's conv and
    recurrent states hold what came before them and cannot be moved to pos as a KV cache can (the engine refuses such
    a step), and a timing needs only the plan at pos, which reads the states whatever they hold: its dispatches and
    their grids are a chat's step's at pos, and a state's size, not its values, sets their work (a prefill of 0..pos
    first would put the states where a chat's are, for no other change in what is timed)."""
    rng = random.Random(seed)
    ids = [rng.randrange(engine.cfg.n_vocab) for _ in range(t)]
    engine.check_step(ids, pos)
    engine.step(ids, 0)


def family(label: str) -> str:
    """A pipeline label without the constants that only tune it (WG, DQ, SG switches)."""
    name, *consts = label.split(" ")
    return " ".join([name, *(c for c in consts if c.split("=")[0] in TUNING)])


async def warm(engine: Engine, ms: float) -> int:
    """Prefill steps back to back for `ms`; the number run. A GPU idle for half a second drops its clocks (the H200
    to 345 of 1,980 MHz) and then runs a 512-token step up to 5x slower (scripts/idle_clock_probe.py): a benchmark
    warms it first, as llama-bench does, and as a chat that is generating keeps it. The steps write K/V at 0..."""
    ids = [0] * engine.max_batch
    t0, steps = time.perf_counter(), 0
    while (time.perf_counter() - t0) * 1e3 < ms:
        engine.step(ids, 0)
        await engine.argmax()
        steps += 1
    return steps


async def median_pass(device, dispatches, writes=(), reps: int = REPS) -> float:
    prepared = device.prepare(dispatches) if isinstance(dispatches, list) else dispatches
    times = sorted([await device.time_pass(prepared, writes) for _ in range(reps)])
    return times[reps // 2]


async def whole_step(engine: Engine, t: int, pos: int, reps: int = REPS) -> float:
    """Seconds of GPU time of the step the chat runs (its prepared plan) for t tokens at `pos`, ids as they lie."""
    return await median_pass(engine.device, engine.prepared(t, pos=pos), engine.step_writes(None, pos, t), reps)


async def by_family(engine: Engine, t: int, pos: int, reps: int = REPS) -> list[dict]:
    """[{family, dispatches, gpu_us, us_per_dispatch}], the whole step first. The step runs on the ids that lie in
    the engine's ids buffer (the caller fills it) and writes K/V at pos..pos+t-1."""
    return await ops_by_family(engine.device, engine.ops_for(t, pos=pos), t, engine.step_writes(None, pos, t), reps)


async def ops_by_family(dev, op_list: list[ops.Op], t: int, writes=(), reps: int = REPS) -> list[dict]:
    """by_family of any op list run for t tokens (training's step: lab.instruments.training.Trainer.window_ops)."""
    plan = ops.dispatches(op_list, t)
    out = [{"family": "whole step", "dispatches": len(plan),
            "gpu_us": round(await median_pass(dev, plan, writes, reps) * 1e6, 1)}]
    for fam in dict.fromkeys(family(d.kernel.label) for d in plan):
        sub = [d for d in plan if family(d.kernel.label) == fam]
        us = await median_pass(dev, sub, writes, reps) * 1e6
        out.append({"family": fam, "dispatches": len(sub), "gpu_us": round(us, 1),
                    "us_per_dispatch": round(us / len(sub), 2)})
    return out
