"""The Training card's grounded answers natively (lab/worker/grounded.py, issue #44 part 4 in the page), driven as the
page drives them on the small synthetic Llama 3: the set made from the files the retrieval card indexed (their ids
decoded), and the held-out rows' replies measured without and with the card's adapter, the switch left as it was;
the refusals in one line each. The set's rules and the measure are held in tests/unit/test_grounded.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from lab.engine.lora import DEFAULT_TARGETS, Lora, choose
from lab.engine.session import Session
from lab.format import gguf
from lab.host.gradcheck import random_params
from lab.instruments import grounded as rules
from lab.instruments.retrieval import Index
from lab.text.tokenizer import from_metadata
from lab.worker import grounded, training
from lab.worker.cards import INDEX, TRAINING
from lab.worker.state import Loaded, State, Worker
from tests.conftest import native_engine, tiny
from tests.engine.test_chat_training import TEXT


@pytest.fixture(scope="module")
def page(device):
    path = tiny("f32")
    header = gguf.read_file(path)
    tok = from_metadata(header.metadata)
    engine = native_engine(device, path, n_ctx=400, max_batch=64)
    posted: list[dict] = []
    w = Worker(post=posted.append, f32=bytes, stop_requested=lambda: False, stop_clear=lambda: None,
               state=State(device, Loaded(engine, header, tok, Session(engine, tok))))
    yield w, posted
    w.state.loaded.close()
    engine.close()


def send(page, handler, **msg) -> list[dict]:
    w, posted = page
    start = len(posted)
    asyncio.run(handler(msg, w))
    return posted[start:]


def test_no_index_no_set(page):
    with pytest.raises(rules.GroundedDataError, match="index some text files in the retrieval card first"):
        send(page, grounded.make_set, seq=1)


def test_the_set_from_the_indexed_files_then_the_measure_without_and_with(page):
    w, _ = page
    lo = w.state.loaded
    index = Index(lo.engine, lo.tokenizer, window=16, stride=8)
    index.prepare([("notes.md", TEXT.encode())])
    asyncio.run(index.build(lambda *a: None, lambda: False))
    lo.hold(INDEX, index)
    (made,) = send(page, grounded.make_set, seq=2)
    assert made["files"] == ["notes.md"] and made["rows"] >= 2 and made["held_rows"] >= 1
    train = [json.loads(line) for line in made["train"].splitlines()]
    held = rules.held_rows(made["held"])
    assert len(train) == made["rows"] and len(held) == made["held_rows"]
    assert sum(not r["answerable"] for r in train) == made["refusals"]
    assert all(r["answer"] in " ".join(r["passages"]) for r in train if r["answerable"])
    # no adapter: the model's replies alone
    out = send(page, grounded.measure, held=made["held"], max_new=2, seq=3)
    rows, (score,) = [m for m in out if m["type"] == "grounded-row"], [m for m in out if m["type"] == "grounded-eval"]
    assert [m["which"] for m in rows] == ["without"] * len(held) and score["with"] is None and not score["stopped"]
    assert score["without"]["rows_should_answer"] + score["without"]["rows_should_refuse"] == len(held)
    # an adapter on the card (as a file's is held): without it, then with it, and left on as the switch says
    run = training.Run(None, [], [], engine=lo.engine, file="a.gguf", name="a")
    dev = lo.engine.device
    table = {t.name: t for t in lo.engine.header.tensors}
    with dev.owning(run):
        run.lora = Lora(dev, choose(table, lo.engine.cfg.n_layer, DEFAULT_TARGETS, 2), 4.0, lo.engine.max_batch)
        dev.write(run.lora.params, random_params(run.lora, 1, b_std=0.5))
    lo.hold(TRAINING, run)
    training.use_adapter(lo, run.lora)
    out = send(page, grounded.measure, held=made["held"], max_new=2, seq=4)
    rows, (score,) = [m for m in out if m["type"] == "grounded-row"], [m for m in out if m["type"] == "grounded-eval"]
    assert [m["which"] for m in rows] == ["without"] * len(held) + ["with"] * len(held)
    assert score["without"] and score["with"] and lo.engine.lora is run.lora
    run.on = False
    training.use_adapter(lo, None)
    send(page, grounded.measure, held=made["held"], max_new=1, seq=5)
    assert lo.engine.lora is None                              # left off
    lo.drop(TRAINING)


@pytest.mark.parametrize("held, says", [
    ("", "no conversation in it"),
    (json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}) + "\n",
     "line 1: not a `lab grounded-data` row"),
])
def test_a_held_out_set_not_made_here_is_refused(page, held, says):
    with pytest.raises(ValueError, match=says):
        send(page, grounded.measure, held=held, max_new=2, seq=6)


def test_a_prompt_past_the_context_is_refused(page):
    row = {"messages": [{"role": "user", "content": "word " * 500}, {"role": "assistant", "content": "a"}],
           "answerable": True, "question": "q", "answer": "a", "passages": ["a"]}
    with pytest.raises(ValueError, match="passes the context of 400"):
        send(page, grounded.measure, held=json.dumps(row) + "\n", max_new=2, seq=7)
