"""The worker's side of the Retrieval card's "Tune on these files" (web/retrieval.js, issue #44 part 3 in the page): the
card's embedder tuned contrastively on the windows of the files it has indexed, then used by its index. The run's
pieces and its table are lab/instruments/embedder.py's, the same `lab train-embedder` runs; lab/worker/router.py
routes the three messages here.

    retrieval-tune {stage, steps, pairs, rank, full, lr, queries, seq}
        -> "retrieval-tune-plan" {seq, stages, steps, pairs, window, windows, tokens, rank | null, full, lr, params,
           queries, memory} once the adapter is made (full: every weight of the model trained instead),
           "retrieval-tune-progress" {seq, phase (measure | train | index), row (measure), stage (train), done,
           total, loss (train), seconds}..., "retrieval-tune-table" {seq, columns, rows} after each measurement, and
           "retrieval-tune-done" {seq, table, stopped, diverged, steps_done, seconds, built, tuned, full, on, params,
           labels}
    retrieval-tune-switch {on, seq} -> "retrieval-tune-progress" (phase index)..., "retrieval-tune-switch" {seq, on,
        built | null}: the index embedded again with the tuned adapter, or without it
    retrieval-tune-download {seq} -> "retrieval-tune-download" {seq, size, bytes, full}: the adapter as a llama.cpp
        adapter GGUF (full: the model, every tensor F32), read from the GPU; nothing of it kept here

The run trains on the index's files as the index holds them (lab.instruments.retrieval Prepared: nothing read or
tokenised again), cut into whole windows of the index's window side by side (contrastive.windows), a LoRA adapter of
the chosen rank (alpha twice it) on every projection, or every weight of an F32 model. Recall is measured on the
card's number of queries, random crops of 24 and 12 tokens, seed 0 (as `lab retrieval-eval` and the card's Measure
recall): before any step, after each stage but the last on a fresh index, and after the last on the index rebuilt with
the tuned embedder, which then replaces the card's index. Every refusal comes first, in one line, before anything
changes: the settings' bounds (lab/settings.py EMBEDDER), a model the Training card could not train (its words:
`lab.worker.training.refusal`), nothing indexed, the Training card's adapter on, a window the engine's step cannot
take, too few windows for a step's pairs, files too short for a crop, the memory budget (`check_fits`). Stop ends the
steps after the step in flight (a stop between stages skips the rest); the adapter keeps what it learned, and the
measurements and the index's rebuild then finish.

The tuned embedder is the card's only: its adapter runs in plans of the index's own (`Index(adapter=)`,
Engine.plans_with), so the chat, the panels and the other cards run the model as they did. Tuning every weight has no
adapter: the model itself changes, for the chat too, and its weights become the user's data (CONVERSATION, through
Device.rekind, as the Training card's full fine-tuning: a new chat leaves them, Forget wipes them and unloads the
model).

Privacy: every buffer the run makes that holds data is CONVERSATION (the training's adapter, gradients, optimizer state
and activations, the pooled sums, the fresh indexes'; the ops' parameters are CONSTANT, written once as they are made,
never with a step's values); the training's are freed (zeroed) when it ends, the tuned adapter is copied into
buffers of its own (`Tuned`, labelled retrieval.embedder, lab/worker/cards.py EMBEDDER). A new chat keeps it, as the
Training card keeps a trained adapter and as it keeps the index: it is made of the user's files, not of the
conversation (its parameters are left as they are; its step scratch is wiped with the conversation's). Forget wipes
its buffers with the rest and reads them back, then frees them; a new model or an unload closes it. A new index uses
it while it is on (the switch), and the switch embeds the files again.

What it does not know: the page (it posts dicts), how a step runs (lab/instruments/contrastive.py).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from lab import gpu
from lab.engine.backward import TrainError
from lab.engine.lora import DEFAULT_TARGETS, Lora
from lab.instruments import contrastive
from lab.instruments.embedder import COLUMNS, measured, overlap, recall, rows, stages_of, train_stage
from lab.instruments.retrieval import MAX_QUERIES, RECALL_QUERIES, Index, RetrievalError
from lab.instruments.training import Optim, adapter_bytes, check_fits, model_bytes
from lab.settings import EMBEDDER
from lab.worker.cards import EMBEDDER as CARD
from lab.worker.cards import INDEX, PROBES
from lab.worker.retrieval import NO_INDEX
from lab.worker.state import Loaded, Worker
from lab.worker.training import max_ctx, number, refusal

SEED = 0            # the adapter's start, the pairs' draws and the crops': one seed, one run, as the CLI's default
ADAPTER_ON = ("the Training card's adapter is on: the embedder is tuned from the model alone (the engine runs one "
              "adapter at a time); untick \"use the adapter\" in the Training card first")


def defaults(engine) -> dict:
    """What the card needs to know of the loaded engine (the "loaded" message's stats.embedder): why it cannot tune a
    LoRA or every weight (the Training card's words), and the longest window a step takes."""
    return {"refusal": refusal(engine), "full_refusal": refusal(engine, full=True), "max_window": max_ctx(engine)}


# -- what the user asked --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ask:
    stages: tuple[str, ...]
    steps: int
    pairs: int
    rank: int
    lr: float
    full: bool
    queries: int

    @classmethod
    def of(cls, msg: dict) -> Ask:
        """The message's settings, each checked against lab/settings.py EMBEDDER's bounds (one line when out)."""
        d, full = EMBEDDER, bool(msg.get("full"))
        return cls(stages=tuple(stages_of(str(msg.get("stage") or d.stage))),
                   steps=number(msg, "steps", int, d.steps, 1, d.max_steps, "the steps a stage"),
                   pairs=number(msg, "pairs", int, d.pairs, 2, d.max_pairs, "the pairs a step"),
                   rank=number(msg, "rank", int, d.rank, 1, d.max_rank, "the rank"),
                   lr=number(msg, "lr", float, d.full_lr if full else d.lr, 1e-8, 1.0, "the learning rate"),
                   full=full, queries=number(msg, "queries", int, RECALL_QUERIES, 1, MAX_QUERIES, "the queries"))


# -- the card's state -------------------------------------------------------------------------------------------
class Tuned:
    """The tuned embedder over the loaded model: a LoRA adapter (`lora`, its buffers this object's, labelled
    retrieval.embedder) that the card's index embeds with while `on`; or, `full`, the model's own weights, tuned in
    place (no adapter: nothing of its own)."""

    def __init__(self, engine, *, full: bool, rank: int | None) -> None:
        self.engine, self.full, self.rank = engine, full, rank
        self.lora: Lora | None = None
        self.on = True

    def keep(self, trained: Lora) -> None:
        """A copy of the training's adapter, made on the GPU (the training's buffers are then freed)."""
        dev = self.engine.device
        with dev.owning(self):
            self.lora = Lora(dev, trained.shapes, trained.alpha, self.engine.max_batch, label="retrieval.embedder")
        dev.run([], copies=[(trained.params, 0, self.lora.params, 0, 4 * trained.n_params)])

    @property
    def adapter(self) -> Lora | None:
        """What an index embeds with: the adapter while on (every weight tuned: the engine's plans, so None)."""
        return self.lora if self.on else None

    @property
    def adapter_buffers(self) -> list:
        """What a new chat leaves (lab/worker/cards.py EMBEDDER): the adapter's parameters; its step scratch is
        wiped with the conversation."""
        return [] if self.lora is None else [self.lora.params]

    def labels(self) -> list[str]:
        """The labels of what it holds, for the page to find in Forget's report (every weight tuned: the model's)."""
        mine = self.engine.weights.buffers() if self.full else self.engine.device.owned_by(self)
        return sorted({b.label for b in mine})

    def close(self) -> None:
        """Forget, an unload, a new run: the adapter's buffers freed (zeroed)."""
        self.engine.device.free(self)
        self.lora = None


def _tuned(w: Worker) -> tuple[Loaded, Tuned]:
    lo = w.loaded()
    state = lo.held(CARD)
    if state is None:
        raise TrainError("tune the embedder first (Tune, above)")
    return lo, state


# -- the handlers ---------------------------------------------------------------------------------------------
def _progress(w: Worker, seq, phase: str, row: str | None = None):
    """on_progress(done, total, seconds) of an index's build, posted as "retrieval-tune-progress"."""
    def post(done: int, total: int, seconds: float) -> None:
        w.post({"type": "retrieval-tune-progress", "seq": seq, "phase": phase, "row": row, "done": done,
                "total": total, "seconds": round(seconds, 3)})
    return post


def _table(report: dict) -> dict:
    return {"columns": list(COLUMNS), "rows": [[name, *cells] for name, cells in rows(report)]}


async def tune(msg: dict, w: Worker) -> None:
    """Tune the embedder on the indexed files' windows, measuring recall before and after each stage; the index is
    then embedded again with it. The tuned embedder before, if any, goes first; every refusal comes before that. A
    failure after the start drops the index too (whatever it embedded with is gone): the card starts again from its
    files, and the page is told so ("retrieval-dropped") before the error."""
    lo, seq = w.loaded(), msg.get("seq")
    ask = Ask.of(msg)
    idx, wins, report = _refusals(lo, ask)
    lo.drop(CARD)                   # the tuned embedder before: its adapter freed (the index using it is replaced)
    lo.session.reset()              # every window and step below overwrites the KV cache
    w.stop_clear()
    measure = {"window": idx.window, "stride": idx.stride, "queries": ask.queries, "seed": SEED}
    c = state = None
    t0 = time.perf_counter()
    try:
        c = await _contrastive(lo, ask, idx.window)
        params = c.trainer.n_params
        w.post(_plan(c, ask, idx, wins, seq))
        report["before"] = await measured(lo.engine, lo.tokenizer, idx.prepared, **measure,
                                          on_progress=_progress(w, seq, "measure", "untuned"))
        w.post({"type": "retrieval-tune-table", "seq": seq, **_table(report)})
        stopped = await _stages(w, seq, c, ask, wins, measure, report)
        last = report["stages"][-1]
        state = Tuned(lo.engine, full=ask.full, rank=None if ask.full else ask.rank)
        if not ask.full and not last["diverged"]:
            state.keep(c.trainer.lora)      # a copy of its own; none when the run diverged (no numbers)
        c.close()                           # the training's buffers freed (zeroed)
        c = None
        built = await _embedded(w, seq, lo, idx, state, ask.queries, last)
    except BaseException:
        if c is not None:
            c.close()
        if state is not None:
            state.close()
        lo.drop(INDEX)
        w.post({"type": "retrieval-dropped", "seq": seq})
        raise
    finally:
        lo.session.reset()
    kept = lo.held(CARD) is state
    w.post({"type": "retrieval-tune-done", "seq": seq, "table": _table(report), "stopped": stopped,
            "diverged": last["diverged"], "steps_done": sum(s["done"] for s in report["stages"]),
            "seconds": round(time.perf_counter() - t0, 3), "built": built.to_dict(), "tuned": kept,
            "full": ask.full, "on": kept, "params": params, "labels": state.labels() if kept else []})


def _refusals(lo: Loaded, ask: Ask) -> tuple[Index, list[list[int]], dict]:
    """Every refusal of a run, before anything changes, each in one line; (the index, the windows trained on, the
    report with its token-overlap row)."""
    engine = lo.engine
    reason = refusal(engine, ask.full)
    if reason:
        raise TrainError(reason)
    idx = lo.held(INDEX)
    if idx is None or not idx.ready:
        raise RetrievalError(NO_INDEX)
    if engine.lora is not None:
        raise TrainError(ADAPTER_ON)
    T, first, top = idx.window, idx.first, max_ctx(engine)
    if T + first > top:
        raise TrainError(f"windows of {T} tokens" + (" behind BOS" if first else "") + f": a step here runs at most "
                         f"{top} tokens; index with a window of at most {top - first} to tune")
    if "query" in ask.stages and T < contrastive.QUERY:
        raise TrainError(f"the query stage cuts {contrastive.QUERY}-token queries from windows of {T}: index with a "
                         f"window of at least {contrastive.QUERY}, or tune the crops stage alone")
    wins = contrastive.windows(idx.prepared.ids, T)
    contrastive.pairs_of(ask.stages[0], wins, ask.pairs, random.Random(SEED))     # too few windows for a step
    report = {"overlap": overlap(idx.prepared, ask.queries, SEED), "stages": []}  # files too short for a crop
    check_fits(engine, T + first, ask.rank, DEFAULT_TARGETS, 1, ask.full)         # the memory budget
    return idx, wins, report


async def _contrastive(lo: Loaded, ask: Ask, T: int) -> contrastive.Contrastive:
    """The training: the adapter on the engine (Trainer sets it), or, full, the model's every weight, which become
    the user's data now (Device.rekind: Forget finds them by kind); what the device refuses, named."""
    engine = lo.engine
    c = contrastive.Contrastive(engine, lo.tokenizer, T=T, pairs=ask.pairs, rank=ask.rank, alpha=2.0 * ask.rank,
                                seed=SEED, full=ask.full,
                                optim=Optim("adamw", lr=ask.lr, steps=ask.steps * len(ask.stages), clip=1.0))
    try:
        if ask.full:
            engine.weights.rekind(gpu.CONVERSATION)
            lo.drop(PROBES)         # the embedding inspector's row norms were the file's rows'
        await engine.device.flush_errors()
    except BaseException:
        c.close()
        raise
    return c


def _plan(c, ask: Ask, idx: Index, wins: list, seq) -> dict:
    tr = c.trainer
    memory = {k: v for k, v in tr.memory().items() if v} | {"pooled sums": c.sums.size}
    return {"type": "retrieval-tune-plan", "seq": seq, "stages": list(ask.stages), "steps": ask.steps,
            "pairs": ask.pairs, "window": idx.window, "windows": len(wins), "tokens": idx.prepared.n_tokens,
            "rank": None if ask.full else ask.rank, "full": ask.full, "lr": ask.lr, "params": tr.n_params,
            "queries": ask.queries, "memory": memory}


async def _stages(w: Worker, seq, c, ask: Ask, wins: list, measure: dict, report: dict) -> bool:
    """Each stage's steps (their progress posted), and a fresh index's recall after each but the last (the index
    embedded again measures that one); True when Stop ended the run (the stages after it skipped)."""
    lo, rng = w.loaded(), random.Random(SEED)
    for i, stage in enumerate(ask.stages):
        def on_step(done, loss, seconds, stage=stage):
            w.post({"type": "retrieval-tune-progress", "seq": seq, "phase": "train", "stage": stage, "done": done,
                    "total": ask.steps, "loss": loss, "seconds": round(seconds, 3)})
        s = await train_stage(c, stage, wins, ask.steps, ask.pairs, rng, on_step, w.stop_requested)
        report["stages"].append(s)
        stopped = s["stopped"] or bool(w.stop_requested())
        if s["diverged"] or stopped or i + 1 == len(ask.stages):
            return stopped
        s["recall"] = await measured(lo.engine, lo.tokenizer, lo.held(INDEX).prepared, **measure,
                                     on_progress=_progress(w, seq, "measure", f"after {stage}"))
        w.post({"type": "retrieval-tune-table", "seq": seq, **_table(report)})
    return False


async def _embedded(w: Worker, seq, lo: Loaded, idx: Index, state: Tuned, queries: int, last: dict):
    """The card's index embedded again, its files taken over (nothing read again), by the tuned embedder (none after a
    divergence), and the last stage's recall measured on it; it replaces the index before, and the tuned embedder is
    held (a diverged adapter is not: it holds no numbers)."""
    new = Index(lo.engine, lo.tokenizer, window=idx.window, stride=idx.stride, adapter=state.adapter)
    try:
        new.adopt(idx.prepared)
        built = await new.build(_progress(w, seq, "index"))
        if not last["diverged"]:
            last["recall"] = await recall(new, queries, SEED)
    except BaseException:
        new.close()
        raise
    idx.close()                     # its buffers; its files are the new index's now
    lo.hold(INDEX, new)
    if state.full or state.lora is not None:
        lo.hold(CARD, state)
    return built


async def switch(msg: dict, w: Worker) -> None:
    """The tuned adapter on or off for the card's search: the index (if any) embedded again with it, or without it,
    in place of the one before once whole (a Stop keeps the windows done, as Index's own)."""
    lo, state = _tuned(w)
    if state.full:
        raise TrainError("every weight was tuned: the model itself is the tuned embedder, with no adapter to switch "
                         "(load the file again for the untuned one)")
    state.on = bool(msg.get("on"))
    seq, idx, built = msg.get("seq"), lo.held(INDEX), None
    if idx is not None and idx.prepared.spans:
        new = Index(lo.engine, lo.tokenizer, window=idx.window, stride=idx.stride, adapter=state.adapter)
        new.adopt(idx.prepared)
        lo.session.reset()          # the windows overwrite the KV cache
        w.stop_clear()
        try:
            built = (await new.build(_progress(w, seq, "index"), lambda: bool(w.stop_requested()))).to_dict()
        except BaseException:
            new.close()
            raise
        idx.close()
        lo.hold(INDEX, new)
    w.post({"type": "retrieval-tune-switch", "seq": seq, "on": state.on, "built": built})


async def download(msg: dict, w: Worker) -> None:
    """The tuned adapter as a llama.cpp adapter GGUF, read from the GPU (every weight tuned: the model as a GGUF of
    F32 tensors, as the Training card's full fine-tune's); nothing of it is kept here."""
    lo, state = _tuned(w)
    engine = lo.engine
    raw = await (model_bytes(engine) if state.full
                 else adapter_bytes(engine, state.lora, name=f"llm-lab embedder r{state.rank}"))
    size = len(raw)
    w.post({"type": "retrieval-tune-download", "seq": msg.get("seq"), "size": size, "full": state.full,
            "bytes": w.f32(raw + bytes(-size % 4))})
