"""The retrieval embedder tuned on the user's files as a run (issue #44 part 3): the stages' steps
(lab/instruments/contrastive.py) with the index's recall measured before and after each on the same seeded crops,
beside the token-overlap baseline, and the one table that shows them. `lab train-embedder` (lab/host/cli/embedder.py)
and the Retrieval card's "Tune on these files" (lab/worker/embedder.py) both run it from these pieces:

    report = {"overlap": overlap(prepared, queries, seed), "before": await measured(...), "stages": []}
    stage = await train_stage(c, "crops", wins, steps, pairs, rng, on_step, should_stop)
    stage["recall"] = await measured(...)        # or `recall(index, ...)` of an index already built
    report["stages"].append(stage)
    rows(report), markdown(report)              # the table: token overlap, untuned, after each stage

A measurement is a fresh index of the files already prepared (`Index.adopt`: nothing read or tokenised again), its
windows embedded by the model as it is at that moment (the training's adapter included: Trainer puts it on the
engine), then recall@1 and @5 on `queries` random crops of CROP (24) and SHORT (12) tokens, the same crops every time
(`seed`). The overlap row scores each window by the tokens it shares with the crop: a ceiling on verbatim crops, not a
retriever.

What it does not know: files on disk, the page, where the adapter goes after the run.
"""

from __future__ import annotations

import time

from lab.engine.backward import TrainError
from lab.instruments.contrastive import STAGES, Diverged, pairs_of
from lab.instruments.retrieval import CROP, Index, overlap_recall

SHORT = 12      # the short queries' crop (the reference's second column): a question, not a passage's piece
CROPS = (CROP, SHORT)
COLUMNS = (f"recall@1 ({CROP})", f"recall@5 ({CROP})", f"recall@1 ({SHORT})", f"recall@5 ({SHORT})")


def stages_of(stage: str) -> list[str]:
    """The stages a choice runs: one of STAGES, or "both" (STAGES in order, on one adapter)."""
    if stage == "both":
        return list(STAGES)
    if stage not in STAGES:
        raise TrainError(f"stage {stage!r}: one of {', '.join(STAGES)}, or both")
    return [stage]


def overlap(prepared, queries: int, seed: int) -> dict:
    """The token-overlap baseline on each crop length: {"crop24": Recall.to_dict(), "crop12": ...}."""
    return {f"crop{n}": overlap_recall(prepared, queries, seed, n).to_dict() for n in CROPS}


async def recall(index: Index, queries: int, seed: int) -> dict:
    """recall@1 and @5 of a built index on each crop length, the crops of `seed`."""
    return {f"crop{n}": (await index.recall(queries, seed, crop=n)).to_dict() for n in CROPS}


async def measured(engine, tok, prepared, *, window: int, stride: int, queries: int, seed: int,
                   on_progress=None) -> dict:
    """The recall of a fresh index of the prepared files as the model is now (the engine's plans, the adapter a
    Trainer put on them included); the index's buffers are freed after, the files left to their owner.
    on_progress(done, total, seconds): its windows embedded."""
    index = Index(engine, tok, window=window, stride=stride)
    try:
        index.adopt(prepared)
        await index.build(on_progress)
        return await recall(index, queries, seed)
    finally:
        index.close()


async def train_stage(c, stage: str, wins: list[list[int]], steps: int, pairs: int, rng, on_step=None,
                      should_stop=None) -> dict:
    """A stage's steps on the Contrastive `c`, each on `pairs` pairs drawn from `wins` by `rng`:
    {stage, steps (asked), done, losses, seconds, stopped, diverged}. on_step(done, loss, seconds) after each step;
    should_stop() is polled there (a True ends the stage, the step in flight kept). Embeddings that are no numbers
    any more end it as diverged (the step that met them is not counted)."""
    losses, t0 = [], time.perf_counter()
    stopped = diverged = False
    while len(losses) < steps and not stopped:
        try:
            losses.append(await c.step(pairs_of(stage, wins, pairs, rng)))
        except Diverged:
            diverged = True
            break
        if on_step is not None:
            on_step(len(losses), losses[-1], time.perf_counter() - t0)
        stopped = should_stop is not None and bool(should_stop()) and len(losses) < steps
    return {"stage": stage, "steps": steps, "done": len(losses), "losses": losses,
            "seconds": time.perf_counter() - t0, "stopped": stopped, "diverged": diverged}


# -- the table ------------------------------------------------------------------------------------------------
def _cells(rec: dict) -> list[float]:
    return [rec[f"crop{n}"][k] for n in CROPS for k in ("recall_at_1", "recall_at_5")]


def _after(s: dict) -> str:
    losses = s["losses"]
    loss = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "no step"
    if s.get("diverged"):
        return f"after {s['stage']} (diverged after {s['done']} steps, {loss})"
    if s.get("stopped"):
        return f"after {s['stage']} (stopped at step {s['done']} of {s['steps']}, {loss})"
    return f"after {s['stage']} ({s['done']} steps, {loss})"


def rows(report: dict) -> list[tuple[str, list[float]]]:
    """The table's rows measured so far, (name, [recall@1 and @5 on CROP-token crops, then on SHORT-token ones]):
    token overlap, untuned, then after each stage."""
    out = []
    if report.get("overlap"):
        out.append(("token overlap", _cells(report["overlap"])))
    if report.get("before"):
        out.append(("untuned", _cells(report["before"])))
    out += [(_after(s), _cells(s["recall"])) for s in report.get("stages", []) if s.get("recall")]
    return out


def markdown(report: dict) -> list[str]:
    """The table as Markdown lines (`lab train-embedder` prints them)."""
    lines = ["| | " + " | ".join(COLUMNS) + " |", "| --- |" + " --- |" * len(COLUMNS)]
    return lines + [f"| {name} | " + " | ".join(f"{v:.3f}" for v in cells) + " |" for name, cells in rows(report)]
