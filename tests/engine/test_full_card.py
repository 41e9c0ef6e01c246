"""The Training card's "every weight of the loaded model" mode natively (lab/worker/training.py `run` with full, issue
#43 item 4 in the page), driven as the page drives it, over a fresh engine of the small synthetic Llama 3 in F32
(tests/conftest.py `tiny`) for each test, since a run changes its weights:

- a run's messages: the plan trains every weight (rank None, params the model's every weight, its buffers' labels
  among the plan's), the progress and the result; the weights moved on the GPU and are CONVERSATION buffers now
  (lab.gpu Device.rekind), the same engine still loaded;
- refusals come before anything changes, one line each: a quantized file (pointing at `lab f32-copy MODEL --out
  FILE`), an f16 KV cache, a setting out of bounds, no text; the page learns the first two when the model loads;
- its one reply is the trained model's, it has no adapter to download or switch, and its download is the whole
  model, equal to the GPU's bytes;
- a new chat leaves its weights as they are (read back before and after); Forget reads them back as zeros with the
  rest, then unloads it (`unloaded`), and nothing of it stays on the device.
The steps themselves are `lab train --full`'s, held to float64 and PyTorch in tests/engine/test_full_finetune.py.
"""

from __future__ import annotations

import asyncio

import pytest

from lab import gpu
from lab.engine.backward import TrainError
from lab.format import gguf
from lab.worker import scratch, training
from lab.worker.cards import PROBES, TRAINING
from tests.conftest import FIXTURES
from tests.engine.cardkit import Page, read
from tests.unit.workerkit import router_over_standins

T = 16
TEXT = (FIXTURES / "perplexity_text.txt").read_text()[:1200]     # ~250 tokens: 15 windows of 16, 2 held out
ASK = {"text": TEXT, "steps": 3, "lr": 1e-3, "ctx": T, "batch": 1, "optimizer": "adamw", "full": True, "seq": 3}


@pytest.fixture
def page(device):
    p = Page(device)
    yield p
    p.close()


def test_a_run_trains_every_weight_in_place(page):
    engine = page.engine
    bufs = engine.weights.buffers()
    assert {b.kind for b in bufs} == {gpu.WEIGHTS}                 # a file's, as loaded
    before = [read(engine, b) for b in bufs]
    page.w.probes()                                                 # the panels' probes, made on the file's weights
    posted = page.send(training.run, **{**ASK, "steps": 6})      # a random model's windows: 6 steps to see it learn
    kinds = [m["type"] for m in posted]
    assert kinds[0] == "train-plan" and kinds[-1] == "train-done", kinds
    plan, done = posted[0], posted[-1]
    n_weights = sum(t.n_elements for t in engine.header.tensors if t.name != "rope_freqs.weight")
    assert plan["rank"] is None and plan["full"] and plan["made"] is None
    assert plan["params"] == n_weights, (plan["params"], n_weights)
    assert plan["memory"]["model"] == sum(b.size for b in bufs) and "adapter" not in plan["memory"]
    assert {b.label for b in bufs} <= set(plan["labels"])
    assert [m["step"] for m in posted if m["type"] == "train-progress"] == list(range(7))
    assert done["steps_done"] == 6 and done["held_after"] < done["held_before"]
    lo = page.w.state.loaded
    assert lo.engine is engine and lo.weights_are_users and lo.held(TRAINING).whole
    assert all(b.kind == gpu.CONVERSATION for b in bufs)           # the user's data now
    after = [read(engine, b) for b in bufs]
    assert sum(a != b for a, b in zip(after, before)) == len(bufs)  # every weight buffer moved
    assert lo.held(PROBES) is None      # its embedding row norms were the file's: made again from the trained rows


def test_the_page_learns_the_refusals_when_the_model_loads(device):
    quant = Page(device, "q8_0")
    f16 = Page(device, kv="f16")
    try:
        assert training.defaults(quant.engine)["refusal"] is None        # a LoRA trains on it
        assert "Q8_0" in training.defaults(quant.engine)["full_refusal"]
        assert "f16" in training.defaults(f16.engine)["full_refusal"]
    finally:
        quant.close()
        f16.close()


@pytest.mark.parametrize("mix, kw, change, says", [
    ("q8_0", {}, {}, "matrices are Q8_0.*`lab f32-copy MODEL --out FILE`"),
    ("f32", {"kv": "f16"}, {}, "KV cache in f16"),
    ("f32", {}, {"ctx": 100}, "a context of 100 tokens: at most 32"),
    ("f32", {}, {"steps": 0}, "the steps: 0 is out of bounds"),
    ("f32", {}, {"lr": 2}, "the learning rate: 2.0 is out of bounds"),
    ("f32", {}, {"text": " "}, "no text to train on"),
    ("f32", {}, {"text": "Too short."}, "needs at least"),
])
def test_refusals_change_nothing(device, mix, kw, change, says):
    page = Page(device, mix, **kw)
    try:
        lo = page.w.state.loaded
        bufs = page.engine.weights.buffers()
        before = read(page.engine, bufs[0])
        with pytest.raises(TrainError, match=says):
            page.send(training.run, **{**ASK, **change})
        assert page.w.state.loaded is lo and lo.held(TRAINING) is None and not page.posted
        assert {b.kind for b in bufs} == {gpu.WEIGHTS} and not lo.weights_are_users
        assert read(page.engine, bufs[0]) == before
    finally:
        page.close()


@pytest.mark.slow      # the reply and download paths are a new model's too, held by test_scratch_card.py by default
def test_its_reply_and_download_and_the_adapter_it_does_not_have(page):
    page.send(training.run, **ASK)
    engine = page.engine
    (reply,) = [m for m in page.send(training.compare, prompt="The history of", max_new=4, seq=3)
                if m["type"] == "train-compare"]
    assert reply["without"] is None and reply["with"]["tokens"] == 4
    for handler, args in ((training.adapter, {}), (training.switch, {"on": False})):
        with pytest.raises(TrainError, match="every weight of the model was trained: it has no adapter"):
            page.send(handler, seq=3, **args)
    (m,) = page.send(scratch.model, seq=3)
    raw = bytes(m["bytes"])[:m["size"]]
    header = gguf.read(raw, file_size=len(raw))
    assert [t.name for t in header.tensors] == [t.name for t in engine.header.tensors]
    assert {t.type.name for t in header.tensors} == {"F32"}
    for name in ("blk.1.ffn_down.weight", "output_norm.weight"):
        t = next(t for t in header.tensors if t.name == name)
        buf = (engine.weights.matrices[name].parts[0].buffer if name in engine.weights.matrices
               else engine.weights.vectors[name])
        assert raw[t.offset:t.offset + t.nbytes] == read(engine, buf)[:t.nbytes], name


def test_a_file_model_is_not_downloaded_whole(page):
    with pytest.raises(TrainError, match="only a model trained here"):
        page.send(scratch.model, seq=1)


@pytest.mark.slow      # the same path as a new model's (Loaded.weights_are_users): test_scratch_card.py runs it
def test_new_chat_leaves_its_weights_and_forget_wipes_them_and_unloads(page, monkeypatch):
    page.send(training.run, **ASK)
    engine, dev = page.engine, page.engine.device
    bufs = engine.weights.buffers()
    trained = [read(engine, b) for b in bufs]
    with router_over_standins(monkeypatch) as router:
        asyncio.run(router._reset({}, page.w))
        (reset,) = [m for m in page.posted if m["type"] == "reset"]
        assert reset["report"]["status"] == "wiped" and not reset["unloaded"]
        assert [read(engine, b) for b in bufs] == trained         # the user's model, kept as it was
        assert page.w.state.loaded.engine is engine and page.w.state.loaded.held(TRAINING) is not None
        asyncio.run(router._forget({}, page.w))
    (forget,) = [m for m in page.posted if m["type"] == "forget"]
    items = {i["label"]: i for i in forget["report"]["items"]}
    ours = [items[b.label] for b in bufs]
    assert forget["unloaded"] and forget["report"]["status"] == "wiped"
    assert all(i["after"] == 0 for i in ours) and all(i["before"] > 0 for i in ours)
    assert page.w.state.loaded is None and not dev.owned_by(engine)
