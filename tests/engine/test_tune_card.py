"""The Retrieval card's "Tune on these files" natively (lab/worker/embedder.py, issue #44 part 3 in the page), driven as
the page drives it, over the small synthetic Llama 3 (tests/conftest.py `tiny`) with a short text indexed in windows of
16 tokens. One page serves the module's tuning tests, which run in file order:

- every refusal is one line and changes nothing (the index, its buffers, the engine's adapter): the settings' bounds,
  nothing indexed, an architecture with no backward and a quantized file for every weight (the Training card's own
  words), the Training card's adapter on, a window the step cannot take or too short for a query, too few windows for
  a step's pairs, the memory budget;
- a run posts its plan, its steps' progress, the table as it grows (token overlap, untuned, after crops, after query:
  lab/instruments/embedder.py's rows, the CLI's), and its result; every buffer it makes is CONVERSATION but the ops'
  parameters, written once when made; the training's buffers are freed after; the index is embedded again with the
  tuned adapter, in plans of its own (its rows are those of an index of the engine with the adapter on), while the
  engine, the chat's, keeps no adapter; the download is a llama.cpp adapter file of this model holding the GPU's values;
- the switch embeds the index without the adapter (the rows of an untuned index, bit for bit) and with it again;
- Stop ends the steps after the one in flight and the stages after it; the table says so;
- a new chat leaves the adapter's parameters as they are; Forget reads the embedder's and the index's buffers back as
  zeros, then frees them.
The steps themselves are `lab train-embedder`'s, their gradients held to float64 in tests/engine/test_contrastive.py.
"""

from __future__ import annotations

import asyncio
from array import array
from types import SimpleNamespace

import numpy as np
import pytest

from lab import gpu
from lab.engine.backward import TrainError
from lab.engine.lora import DEFAULT_TARGETS, Lora, choose
from lab.format.adapter import read_adapter
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch
from lab.instruments import embedder as runs
from lab.instruments.retrieval import Index, RetrievalError
from lab.instruments.training import needs
from lab.worker import embedder, retrieval, training
from lab.worker.cards import EMBEDDER, INDEX
from tests.conftest import FIXTURES
from tests.engine.cardkit import Page, read
from tests.unit.workerkit import router_over_standins

# 261 tokens: 17 windows of 16 in the index (its last ends at the text's end), 16 side by side to train on
TEXT = (FIXTURES / "perplexity_text.txt").read_text()[:1200]
ASK = {"stage": "both", "steps": 2, "pairs": 3, "rank": 4, "lr": 1e-2, "queries": 4, "seq": 2}
ROWS = ["token overlap", "untuned", "after crops", "after query"]


class File:
    """A picked file as web/worker.js hands it to Python: name, and arrayBuffer() whose to_bytes() is the bytes."""

    def __init__(self, name: str, text: str) -> None:
        self.name, self.raw = name, text.encode()

    async def arrayBuffer(self):
        return SimpleNamespace(to_bytes=lambda: self.raw)


def indexed(page: Page, text: str = TEXT, window: int = 16) -> Index:
    page.send(retrieval.index, files=[File("notes.txt", text)], window=window, stride=window, seq=1)
    return page.w.state.loaded.held(INDEX)


def rows_of(index: Index) -> np.ndarray:
    return np.frombuffer(asyncio.run(index.embeddings()), np.float32).reshape(index.ready, -1)


def fresh_rows(page: Page, prepared) -> np.ndarray:
    """The rows of an index of the same files made now on the engine's own plans (its adapter, if any)."""
    ix = Index(page.engine, page.w.state.loaded.tokenizer, window=16, stride=16)
    try:
        ix.adopt(prepared)
        asyncio.run(ix.build())
        return rows_of(ix)
    finally:
        ix.close()


@pytest.fixture(scope="module")
def page(device):
    p = Page(device)
    indexed(p)
    yield p
    p.close()


def _unchanged(page: Page, index: Index, n_buffers: int) -> None:
    lo = page.w.state.loaded
    assert lo.held(INDEX) is index and index.ready == 17 and lo.held(EMBEDDER) is None
    assert page.engine.lora is None and len(page.engine.device.buffers) == n_buffers


@pytest.mark.parametrize("change, says", [
    ({"steps": 0}, r"the steps a stage: 0 is out of bounds \(1 to 10000\)"),
    ({"pairs": 1}, r"the pairs a step: 1 is out of bounds \(2 to 64\)"),
    ({"rank": 65}, r"the rank: 65 is out of bounds \(1 to 64\)"),
    ({"lr": 2}, "the learning rate: 2.0 is out of bounds"),
    ({"queries": 0}, "the queries: 0 is out of bounds"),
    ({"stage": "all"}, "stage 'all': one of crops, query, or both"),
    ({"pairs": 20}, "16 windows for 20 pairs a step: .* index more text or ask fewer pairs"),
])
def test_refusals_change_nothing(page, change, says):
    index, n = page.w.state.loaded.held(INDEX), len(page.engine.device.buffers)
    start = len(page.posted)
    with pytest.raises(TrainError, match=says) as e:
        page.send(embedder.tune, **{**ASK, **change})
    assert "\n" not in str(e.value) and len(page.posted) == start
    _unchanged(page, index, n)


def test_the_training_cards_adapter_and_the_memory_budget_are_refused(page, monkeypatch):
    engine, dev = page.engine, page.engine.device
    index, n = page.w.state.loaded.held(INDEX), len(dev.buffers)
    sizes = needs(engine, 16, ASK["rank"], DEFAULT_TARGETS)
    monkeypatch.setitem(dev.info.limits, "max_storage_buffer_binding_size", max(v for _, v in sizes) - 4)
    with pytest.raises(TrainError, match="rank 4 and context 16 does not fit this GPU"):
        page.send(embedder.tune, **ASK)
    monkeypatch.undo()
    _unchanged(page, index, n)
    with dev.owning(page):
        lora = Lora(dev, choose({t.name: t for t in engine.header.tensors}, engine.cfg.n_layer, rank=2), 4.0,
                    engine.max_batch)
    engine.set_lora(lora)
    try:
        with pytest.raises(TrainError, match="the Training card's adapter is on"):
            page.send(embedder.tune, **ASK)
    finally:
        engine.set_lora(None)
        dev.free(page)


def test_windows_the_step_cannot_take_or_too_short_for_a_query(device):
    p = Page(device)
    try:
        indexed(p, TEXT, window=40)             # a step here runs 32 tokens (cardkit's max_batch)
        with pytest.raises(TrainError, match="windows of 40 tokens: a step here runs at most 32 tokens; index with a "
                                             "window of at most 32"):
            p.send(embedder.tune, **ASK)
        indexed(p, TEXT[:400], window=8)
        with pytest.raises(TrainError, match="the query stage cuts 16-token queries from windows of 8"):
            p.send(embedder.tune, **ASK)
        assert p.w.state.loaded.held(EMBEDDER) is None and p.engine.lora is None
    finally:
        p.close()


def test_nothing_indexed_an_untrainable_model_and_a_quantized_one(device):
    plain = Page(device)
    # gemma4's per-layer inputs have no backward yet (lab.engine.backward.untrainable)
    hybrid = Page(device, path=synthetic_arch.build("gemma4", "f32", cache_dir() / "synthetic"))
    quant = Page(device, "q8_0")
    try:
        with pytest.raises(RetrievalError, match="no index: index some files first"):
            plain.send(embedder.tune, **ASK)
        with pytest.raises(TrainError, match="no backward yet"):
            hybrid.send(embedder.tune, **ASK)
        # every weight: the Training card's full mode's words, from the same function
        with pytest.raises(TrainError) as e:
            quant.send(embedder.tune, **ASK, full=True)
        assert str(e.value) == training.refusal(quant.engine, full=True) and "Q8_0" in str(e.value)
        assert embedder.defaults(quant.engine) == {"refusal": None, "full_refusal": str(e.value), "max_window": 32}
        assert not plain.posted and not hybrid.posted and not quant.posted
    finally:
        for p in (plain, hybrid, quant):
            p.close()


def test_a_run_measures_tunes_and_embeds_the_index_with_it(page, monkeypatch):
    lo, engine, dev = page.w.state.loaded, page.engine, page.engine.device
    untuned = rows_of(lo.held(INDEX))
    events = []         # ("make", buffer), ("write", buffer), ("run", [buffers a run's writes and copies fill])
    register, write, run = dev._register, dev.write, dev.run

    def registered(*a, **kw):
        events.append(("make", register(*a, **kw)))
        return events[-1][1]

    def written(buf, data, offset=0):
        events.append(("write", buf))
        write(buf, data, offset)

    def ran(dispatches, writes=(), copies=()):
        events.append(("run", [b for b, _, _ in writes] + [c[2] for c in copies]))
        run(dispatches, writes, copies)
    monkeypatch.setattr(dev, "_register", registered)
    monkeypatch.setattr(dev, "write", written)
    monkeypatch.setattr(dev, "run", ran)
    out = page.send(embedder.tune, **ASK)
    monkeypatch.undo()

    kinds = [m["type"] for m in out]
    assert kinds[0] == "retrieval-tune-plan" and kinds[-1] == "retrieval-tune-done", kinds
    plan, done = out[0], out[-1]
    assert plan["stages"] == ["crops", "query"] and plan["windows"] == 16 and plan["rank"] == 4 and plan["params"] > 0
    train = [(m["stage"], m["done"]) for m in out if m["type"] == "retrieval-tune-progress" and m["phase"] == "train"]
    assert train == [("crops", 1), ("crops", 2), ("query", 1), ("query", 2)]
    tables = [m["rows"] for m in out if m["type"] == "retrieval-tune-table"]
    assert [[r[0].split(" (")[0] for r in t] for t in tables] == [ROWS[:2], ROWS[:3]]    # the table grows
    rows = done["table"]["rows"]
    assert done["table"]["columns"] == ["recall@1 (24)", "recall@5 (24)", "recall@1 (12)", "recall@5 (12)"]
    assert [r[0].split(" (")[0] for r in rows] == ROWS and rows[2][0].startswith("after crops (2 steps, loss ")
    assert all(0 <= r1 <= r5 <= 1 and 0 <= s1 <= s5 <= 1 for _, r1, r5, s1, s5 in rows)
    prepared = lo.held(INDEX).prepared
    assert rows[0][1:] == runs.rows({"overlap": runs.overlap(prepared, 4, 0)})[0][1]    # the CLI's baseline
    assert done["tuned"] and done["on"] and not done["stopped"] and not done["diverged"] and done["steps_done"] == 4
    print("", *rows, sep="\n")

    # what the run made: CONVERSATION, but the ops' parameters (shapes, offsets, the rotary table), written as they are
    # made and never again (no step's values reach them); the training's buffers (its adapter, gradients, moments,
    # activations, pooled sums) freed after it
    made = [b for kind, b in events if kind == "make"]
    assert made and {b.kind for b in made} <= {gpu.CONVERSATION, gpu.CONSTANT}
    for i, (kind, b) in enumerate(events):
        if kind == "make" and b.kind == gpu.CONSTANT:       # filled as it is made (a kernel's output would not be)
            assert events[i + 1][0] == "write" and events[i + 1][1] is b, b.label
        if kind == "write" and b.kind == gpu.CONSTANT:
            assert events[i - 1][0] == "make" and events[i - 1][1] is b, b.label
        if kind == "run":
            assert not [x.label for x in b if x.kind == gpu.CONSTANT]
    assert not any(b.label.startswith(("lora ", "adamw", "train ", "contrastive")) for b in dev.buffers)

    # the index embeds with the tuned adapter, the chat's engine with none
    state, index = lo.held(EMBEDDER), lo.held(INDEX)
    assert engine.lora is None and index.adapter is state.lora is not None and index.ready == 17
    assert set(done["labels"]) == {b.label for b in dev.owned_by(state)} and len(done["labels"]) == 2
    tuned = rows_of(index)
    engine.set_lora(state.lora)
    try:
        assert np.abs(tuned - fresh_rows(page, prepared)).max() < 1e-5      # plans of its own = the engine's with it
    finally:
        engine.set_lora(None)
    assert np.abs(tuned - untuned).max() > 1e-3
    # a question embeds with it, the engine's plans built again since (its own are not the engine's)
    assert asyncio.run(index.search(lo.tokenizer.encode("the history"), 2))

    (got,) = page.send(embedder.download, seq=3)
    raw = bytes(got["bytes"])[:got["size"]]
    adapter = read_adapter(raw, len(raw), engine.cfg, {t.name: tuple(t.shape) for t in engine.header.tensors})
    assert not got["full"] and adapter.bases == tuple(state.lora.targets) and adapter.alpha == 8.0
    want = array("f", read(engine, state.lora.params))
    p = adapter.pairs[-1]
    t = state.lora.targets[p.base]
    assert raw[p.b_offset:p.b_offset + p.b_nbytes] == want[t.b:t.b + t.rank * t.n_out].tobytes()


def test_the_switch_embeds_the_index_without_and_with_it(page):
    lo = page.w.state.loaded
    state = lo.held(EMBEDDER)
    tuned = rows_of(lo.held(INDEX))
    (off,) = [m for m in page.send(embedder.switch, on=False, seq=4) if m["type"] == "retrieval-tune-switch"]
    assert not off["on"] and off["built"]["done"] == 17 and lo.held(INDEX).adapter is None
    prepared = lo.held(INDEX).prepared
    assert np.array_equal(rows_of(lo.held(INDEX)), fresh_rows(page, prepared))        # the untuned model's rows
    page.send(embedder.switch, on=True, seq=5)
    assert lo.held(INDEX).adapter is state.lora and np.array_equal(rows_of(lo.held(INDEX)), tuned)


@pytest.mark.slow
def test_stop_ends_the_steps_and_the_stages_after(page, monkeypatch):
    polls = []
    monkeypatch.setattr(page.w, "stop_requested", lambda: polls.append(1) or len(polls) >= 1)
    out = page.send(embedder.tune, **{**ASK, "steps": 3})
    monkeypatch.undo()
    done = out[-1]
    names = [r[0] for r in done["table"]["rows"]]
    assert done["stopped"] and done["steps_done"] == 1 and done["tuned"]
    assert names[2:] == [names[2]] and names[2].startswith("after crops (stopped at step 1 of 3, loss ")


def test_new_chat_keeps_the_adapter_and_forget_wipes_it(page, monkeypatch):
    lo, engine = page.w.state.loaded, page.engine
    state = lo.held(EMBEDDER)
    params = read(engine, state.lora.params)
    labels = set(state.labels())
    with router_over_standins(monkeypatch) as router:
        asyncio.run(router._reset({}, page.w))
        assert page.w.state.loaded.held(EMBEDDER) is state and read(engine, state.lora.params) == params
        (reset,) = [m for m in page.posted if m["type"] == "reset"]
        wiped = {i["label"] for i in reset["report"]["items"]}
        assert "retrieval.embedder u = x A^T [tokens, r]" in wiped and not any("A|B" in w for w in wiped
                                                                              if w.startswith("retrieval."))
        asyncio.run(router._forget({}, page.w))
    (forget,) = [m for m in page.posted if m["type"] == "forget"]
    items = {i["label"]: i for i in forget["report"]["items"]}
    # the report lists the buffers that held anything: the adapter's parameters and the index's rows among them
    ours = [i for k, i in items.items() if k in labels or k.startswith("retrieval.")]
    assert forget["report"]["status"] == "wiped" and not forget["unloaded"]
    assert all(i["after"] == 0 for i in ours)
    assert items[next(x for x in labels if "A|B" in x)]["before"] > 0
    assert next(i for k, i in items.items() if k.startswith("retrieval.index"))["before"] > 0
    assert page.w.state.loaded.held(EMBEDDER) is None and page.w.state.loaded.held(INDEX) is None
    assert not engine.device.owned_by(state) and state.lora is None


def test_a_stage_ends_where_the_embeddings_stop_being_numbers():
    """train_stage, the CLI's and the card's: a Diverged step ends the stage, not counted (no GPU: a stand-in)."""
    from lab.instruments.contrastive import Diverged

    class Steps:
        n = 0

        async def step(self, batch):
            self.n += 1
            if self.n == 3:
                raise Diverged("no numbers")
            return 1.0 / self.n
    import random
    wins = [list(range(i, i + 8)) for i in range(0, 80, 8)]
    s = asyncio.run(runs.train_stage(Steps(), "crops", wins, 5, 2, random.Random(0)))
    assert s["diverged"] and s["done"] == 2 and s["losses"] == [1.0, 0.5] and not s["stopped"]
    assert runs.rows({"stages": [{**s, "recall": {f"crop{n}": {"recall_at_1": 0, "recall_at_5": 0}
                                                  for n in runs.CROPS}}]})[0][0] == \
        "after crops (diverged after 2 steps, loss 1.000 -> 0.500)"


@pytest.mark.slow
def test_every_weight_tuned_is_the_model_itself(device, monkeypatch):
    """full: no adapter; the model's weights move and become the user's data (CONVERSATION), the index is embedded
    by the model as tuned, there is no switch, the download is the model, and Forget wipes the weights and unloads."""
    from lab.format import gguf
    p = Page(device)
    try:
        indexed(p)
        engine, lo = p.engine, p.w.state.loaded
        bufs = engine.weights.buffers()
        before = read(engine, bufs[0])
        out = p.send(embedder.tune, **{**ASK, "stage": "query", "steps": 1, "full": True, "lr": 1e-3})
        plan, done = out[0], out[-1]
        assert plan["rank"] is None and plan["full"] and done["full"] and done["tuned"]
        assert [r[0].split(" (")[0] for r in done["table"]["rows"]] == ["token overlap", "untuned", "after query"]
        assert lo.weights_are_users and all(b.kind == gpu.CONVERSATION for b in bufs)
        assert read(engine, bufs[0]) != before
        assert lo.held(INDEX).adapter is None and engine.lora is None and set(done["labels"]) == {b.label for b in bufs}
        with pytest.raises(TrainError, match="every weight was tuned: the model itself is the tuned embedder"):
            p.send(embedder.switch, on=False, seq=3)
        (got,) = p.send(embedder.download, seq=4)
        raw = bytes(got["bytes"])[:got["size"]]
        header = gguf.read(raw, file_size=len(raw))
        assert got["full"] and [t.name for t in header.tensors] == [t.name for t in engine.header.tensors]
        with router_over_standins(monkeypatch) as router:
            asyncio.run(router._forget({}, p.w))
        (forget,) = [m for m in p.posted if m["type"] == "forget"]
        assert forget["unloaded"] and forget["report"]["status"] == "wiped" and p.w.state.loaded is None
    finally:
        p.close()
