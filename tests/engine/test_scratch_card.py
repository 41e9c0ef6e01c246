"""The Training card's "a new model" mode natively (lab/worker/scratch.py, issue #44 part 2 in the page), driven as the
page drives it, over a model loaded before (the small synthetic Llama 3, tests/conftest.py `tiny`):

- a run unloads the model before only once everything is checked, then posts model-info and loaded under the page's
  load seq (made: the preset's shape), the plan (every weight trained: no rank), the progress and the result; the new
  model is the loaded one, its weights CONVERSATION buffers, and the steps moved them;
- every refusal is one line and leaves the model before loaded, untouched (its engine still runs);
- its one reply is the model's own ("with"), it has no adapter to download or switch, and its download is the
  model as the GPU holds it, a GGUF whose vocabulary and tensors are the run's;
- a new chat leaves its weights as they are (read back before and after); Forget reads them back as zeros with
  the rest, then unloads it (`unloaded`), and nothing of it stays on the device.
The steps themselves are `lab train --scratch`'s, held to llama.cpp and to float64 in tests/engine/test_scratch.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from lab import gpu
from lab.engine.backward import TrainError
from lab.format import gguf
from lab.format import untrained as shapes
from lab.text.tokenizer import train as bpe
from lab.worker import scratch, training
from lab.worker.cards import TRAINING
from tests.conftest import FIXTURES
from tests.engine.cardkit import Page, read
from tests.unit.workerkit import router_over_standins

T = 16
TEXT = (FIXTURES / "perplexity_text.txt").read_text()[:1500]
VOCAB = 300


@pytest.fixture(scope="module")
def vocab_json():
    return bpe.train([TEXT], VOCAB).dumps()


def ask(vocab_json, **change):
    return {"tokenizer": vocab_json, "tokenizer_name": "tok.json", "text": TEXT, "preset": "nano", "steps": 3,
            "lr": 3e-3, "ctx": T, "batch": 2, "optimizer": "adamw", "seed": 7, "seq": 5, "load_seq": 9, **change}


@pytest.fixture
def page(device):
    p = Page(device)
    yield p
    p.close()


def test_a_new_model_is_made_loaded_and_trained(page, vocab_json):
    dev = page.w.state.device
    posted = page.send(scratch.run, **ask(vocab_json))
    kinds = [m["type"] for m in posted]
    assert kinds[:3] == ["model-info", "loaded", "train-plan"] and kinds[-1] == "train-done"
    info, loaded, plan, done = posted[0], posted[1], posted[2], posted[-1]
    assert info["seq"] == loaded["seq"] == 9 and info["made"]["preset"] == "nano"
    assert info["summary"]["made"] == info["made"] and info["summary"]["budget"]["fits"]
    assert loaded["stats"]["made"] and loaded["stats"]["upload_mb_s"] is None
    shape = shapes.preset("nano", T)
    assert plan["made"]["layers"] == shape.layers and plan["rank"] is None and plan["seq"] == 5
    assert plan["params"] == shape.n_params(VOCAB) == info["made"]["params"]
    assert plan["memory"]["model"] == 4 * shape.n_params(VOCAB)
    progress = [m for m in posted if m["type"] == "train-progress"]
    assert [m["step"] for m in progress] == [0, 1, 2, 3]
    assert done["steps_done"] == 3 and done["held_after"] < done["held_before"]
    lo = page.w.state.loaded
    assert lo.engine is not page.engine and lo.weights_are_users and lo.engine.cfg.n_vocab == VOCAB
    assert not dev.owned_by(page.engine)                        # the model before: unloaded, every buffer freed
    bufs = lo.engine.weights.buffers()
    assert bufs and all(b.kind == gpu.CONVERSATION for b in bufs)
    assert set(b.label for b in bufs) <= set(plan["labels"])
    assert lo.held(TRAINING).made == info["made"]
    assert lo.tokenizer.encode("the law") == bpe.from_dict(json.loads(vocab_json)).tokenizer().encode("the law")


def test_the_same_seed_draws_the_same_model(page, vocab_json):
    page.send(scratch.run, **ask(vocab_json, steps=1))
    first = read(page.w.state.loaded.engine, page.w.state.loaded.engine.weights.embedding.parts[0].buffer)
    page.send(scratch.run, **ask(vocab_json, steps=1))      # the model made before is unloaded like any other
    again = page.w.state.loaded.engine
    assert read(again, again.weights.embedding.parts[0].buffer) == first
    page.send(scratch.run, **ask(vocab_json, steps=1, seed=8))
    other = page.w.state.loaded.engine
    assert read(other, other.weights.embedding.parts[0].buffer) != first


@pytest.mark.parametrize("change, says", [
    ({"tokenizer": "{not json"}, "tok.json is refused"),
    ({"tokenizer": json.dumps({"format": "other"})}, "not a tokenizer file of this lab"),
    ({"tokenizer": json.dumps({"format": "llm-lab-bpe", "version": 1, "merges": [7]})}, "tok.json is refused"),
    ({"tokenizer": "x" * (scratch.MAX_TOKENIZER + 1)}, "at most"),
    ({"preset": "huge"}, "preset 'huge': one of nano, 4m, 16m"),
    ({"text": "Too short."}, "needs at least 32"),
    ({"text": " "}, "no text to train on"),
    ({"ctx": 100_000}, "at most 4096 for a model trained here"),
    ({"steps": 0}, "the steps: 0 is out of bounds"),
    ({"seed": -1}, "the seed: -1 is out of bounds"),
])
def test_refusals_leave_the_model_before(page, vocab_json, change, says):
    lo = page.w.state.loaded
    with pytest.raises((TrainError, ValueError), match=says):
        page.send(scratch.run, **ask(vocab_json, **change))
    assert page.w.state.loaded is lo and lo.engine is page.engine and not page.posted
    assert page.engine.device.owned_by(page.engine)              # its buffers are all there


def test_its_reply_download_and_the_adapter_it_does_not_have(page, vocab_json):
    page.send(scratch.run, **ask(vocab_json))
    lo = page.w.state.loaded
    (reply,) = [m for m in page.send(training.compare, prompt="the law", max_new=4, seq=5)
                if m["type"] == "train-compare"]
    assert reply["without"] is None and reply["with"]["tokens"] == 4
    for handler, args in ((training.adapter, {}), (training.switch, {"on": False})):
        with pytest.raises(TrainError, match="no adapter"):
            page.send(handler, seq=5, **args)
    (m,) = page.send(scratch.model, seq=5)
    raw = bytes(m["bytes"])[:m["size"]]
    header = gguf.read(raw, file_size=len(raw))
    assert header.metadata["general.architecture"] == "llama" and len(header.metadata["tokenizer.ggml.tokens"]) == VOCAB
    t = next(t for t in header.tensors if t.name == "blk.1.ffn_down.weight")
    w = lo.engine.weights.matrices["blk.1.ffn_down.weight"]
    assert raw[t.offset:t.offset + t.nbytes] == read(lo.engine, w.parts[0].buffer)


def test_a_file_model_is_not_downloaded_whole(page):
    with pytest.raises(TrainError, match="only a model trained here"):
        page.send(scratch.model, seq=1)


def test_new_chat_leaves_its_weights_and_forget_wipes_them_and_unloads(page, vocab_json, monkeypatch):
    page.send(scratch.run, **ask(vocab_json))
    lo = page.w.state.loaded
    engine, dev = lo.engine, lo.engine.device
    bufs = engine.weights.buffers()
    before = [read(engine, b) for b in bufs]
    with router_over_standins(monkeypatch) as router:
        asyncio.run(router._reset({}, page.w))
        (reset,) = [m for m in page.posted if m["type"] == "reset"]
        assert reset["report"]["status"] == "wiped" and not reset["unloaded"]
        assert [read(engine, b) for b in bufs] == before        # the user's model, kept as it was
        assert page.w.state.loaded.engine is engine and page.w.state.loaded.held(TRAINING) is not None
        page.send(training.run, text=TEXT, rank=2, steps=1, lr=1e-3, ctx=T, batch=1, optimizer="adamw", seq=6)
        asyncio.run(router._reset({}, page.w))                   # a LoRA run on it: the model is still left
        assert [read(engine, b) for b in bufs] == before
        asyncio.run(router._forget({}, page.w))
    (forget,) = [m for m in page.posted if m["type"] == "forget"]
    items = {i["label"]: i for i in forget["report"]["items"]}
    ours = [items[b.label] for b in bufs]
    assert forget["unloaded"] and forget["report"]["status"] == "wiped"
    assert all(i["after"] == 0 for i in ours) and all(i["before"] > 0 for i in ours)
    assert page.w.state.loaded is None and not dev.owned_by(engine)


def test_a_trainer_refused_leaves_the_untrained_model_and_says_so(page, vocab_json, monkeypatch):
    def refused(*_, **__):
        raise TrainError("full fine-tuning at context 16 does not fit this GPU: a buffer")
    monkeypatch.setattr(scratch, "Trainer", refused)
    with pytest.raises(TrainError, match="does not fit this GPU: a buffer; the untrained model stays loaded"):
        page.send(scratch.run, **ask(vocab_json))
    assert [m["type"] for m in page.posted] == ["model-info", "loaded"]
    lo = page.w.state.loaded
    assert lo.weights_are_users and lo.held(TRAINING) is None and lo.engine is not page.engine


@pytest.mark.slow
def test_the_embedding_inspector_follows_the_trained_rows(page, vocab_json):
    """A made model's embedding row norms are its weights' kind (CONVERSATION: Forget wipes them) and are made again
    at each query: after more steps they are the trained rows' norms, not the drawn ones'."""
    import math

    from lab.instruments.probes import Probes
    page.send(scratch.run, **ask(vocab_json, steps=1))
    lo = page.w.state.loaded
    engine, run = lo.engine, lo.held(TRAINING)
    probes = Probes(engine)
    table = engine.weights.embedding
    try:
        def row_norm(tid: int) -> float:
            (part,) = table.parts
            raw = engine.device.read_sync(part.buffer, 4 * tid * table.cols, 4 * table.cols)
            return math.sqrt(sum(v * v for v in memoryview(raw).cast("f")))
        first = asyncio.run(probes.embedding(5)).norm
        assert probes.norms.kind == gpu.CONVERSATION and first == pytest.approx(row_norm(5), rel=1e-5)
        run.trainer.optim = run.trainer.optim.__class__(lr=0.5, steps=10)     # steps large enough to show
        for _ in range(2):
            asyncio.run(run.trainer.step(run.train[:run.trainer.batch]))
        moved = asyncio.run(probes.embedding(5)).norm
        assert moved != pytest.approx(first, rel=1e-4) and moved == pytest.approx(row_norm(5), rel=1e-5)
    finally:
        probes.close()
