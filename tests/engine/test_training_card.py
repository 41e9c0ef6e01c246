"""The Training card's worker side (lab/worker/training.py) natively, on the small synthetic Llama 3 (tests/conftest.py
`tiny`), driven as the page drives it: a run posts its plan, its progress (the held-out loss before, every few steps
and after the last) and its result, and leaves the adapter on the engine with the chat's session reset; Stop ends it
after the step in flight; the with / without replies come from the engine without and with the adapter and leave the
switch as it was; the adapter's bytes are a llama.cpp adapter file of this model; the switch turns it off and on;
Forget's read-back covers every buffer of the training (non-zero before, zero after), then the adapter is off the
engine and the text's windows are emptied; and each refusal is one line a user reads. The panels' probes, made before
the adapter went on, follow the engine's rebuilt plans (lab/instruments/probes.py `_follow_plans`): what they read
with the adapter is what probes made afresh read."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from lab.engine.backward import TrainError
from lab.engine.session import Session
from lab.format import gguf
from lab.format.adapter import read_adapter
from lab.format.model import from_gguf
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch
from lab.instruments.probes import Probes
from lab.text.tokenizer import from_metadata
from lab.worker import training
from lab.worker.cards import TRAINING
from lab.worker.state import Loaded, State, Worker
from tests.conftest import FIXTURES, native_engine, tiny
from tests.unit.workerkit import router_over_standins

T = 16
TEXT = (FIXTURES / "perplexity_text.txt").read_text()[:1200]     # ~250 tokens: 15 windows of 16, 2 held out
ASK = {"type": "train", "text": TEXT, "rank": 4, "steps": 4, "lr": 1e-2, "ctx": T, "batch": 1, "optimizer": "adamw",
       "seq": 1}


@pytest.fixture(scope="module")
def model(device):
    path = tiny("f32")
    header = gguf.read_file(path)
    engine = native_engine(device, path, n_ctx=256, max_batch=64)
    yield engine, header, from_metadata(header.metadata)
    engine.close()


class Page:
    """The worker as the page sees it: what it posted, and a Stop pressed after `stop_after` polls."""

    def __init__(self, model, stop_after: int | None = None) -> None:
        engine, header, tok = model
        self.posted: list[dict] = []
        self.polls, self.stop_after = 0, stop_after
        self.w = Worker(post=self.posted.append, f32=bytes, stop_requested=self._stop, stop_clear=lambda: None,
                        state=State(engine.device, Loaded(engine, header, tok, Session(engine, tok))))

    def _stop(self) -> bool:
        self.polls += 1
        return self.stop_after is not None and self.polls >= self.stop_after

    def send(self, handler, **msg) -> list[dict]:
        start = len(self.posted)
        asyncio.run(handler(msg, self.w))
        return self.posted[start:]

    def of(self, kind: str, posted: list[dict] | None = None) -> list[dict]:
        return [m for m in (self.posted if posted is None else posted) if m["type"] == kind]


@pytest.fixture
def page(model):
    p = Page(model)
    yield p
    lo = p.w.state.loaded
    if lo is not None:
        lo.drop(TRAINING)       # the adapter off the engine for the next test


def test_a_run_reports_and_leaves_the_adapter_on(page):
    lo = page.w.state.loaded
    lo.session.cached += [1, 2, 3]             # a chat's cache: stale once the adapter goes on
    out = page.send(training.run, **ASK)
    (plan,), steps, (done,) = page.of("train-plan", out), page.of("train-progress", out), page.of("train-done", out)
    assert plan["ctx"] == T and plan["held"] >= 1 and plan["train"] + plan["held"] == plan["windows"] >= 2
    assert plan["params"] > 0 and set(plan["memory"]) == {"adapter", "gradients", "optimizer", "tokens", "activations"}
    assert any(label.startswith("lora A|B") for label in plan["labels"])
    assert [m["step"] for m in steps] == [0, 1, 2, 3, 4]
    assert steps[0]["loss"] is None and steps[0]["held"] == done["held_before"]
    assert steps[-1]["held"] == done["held_after"] and all(m["loss"] > 0 for m in steps[1:])
    assert steps[-1]["eta_s"] == 0 and steps[-1]["tokens_per_s"] > 0
    assert done["steps_done"] == 4 and not done["stopped"] and not done["diverged"]
    assert done["ppl_before"] > 1 and done["ppl_after"] > 1
    run = lo.held(TRAINING)
    assert lo.engine.lora is run.trainer.lora and run.on and lo.session.cached == []
    print(f"\nheld-out loss {done['held_before']:.4f} -> {done['held_after']:.4f}, steps {[m['loss'] for m in steps]}")


def test_stop_ends_the_run_after_the_step_in_flight(model):
    page = Page(model, stop_after=2)
    out = page.send(training.run, **{**ASK, "steps": 20})
    (done,) = page.of("train-done", out)
    assert done["stopped"] and done["steps_done"] == 2 and done["held_after"] is not None
    assert page.w.state.loaded.held(TRAINING).trainer.steps_done == 2
    page.w.state.loaded.drop(TRAINING)


def test_replies_without_and_with_then_the_switch_and_the_file(page, model):
    engine, header, _ = model
    page.send(training.run, **ASK)
    run = page.w.state.loaded.held(TRAINING)
    out = page.send(training.compare, prompt="The history of", max_new=6, seq=2)
    (cmp,) = page.of("train-compare", out)
    assert cmp["without"]["tokens"] and cmp["with"]["tokens"]
    assert {m["which"] for m in page.of("train-token", out)} == {"without", "with"}
    assert engine.lora is run.trainer.lora                    # left on, as the switch says
    assert page.send(training.switch, on=False, seq=3) == [{"type": "train-switch", "seq": 3, "on": False}]
    assert engine.lora is None
    page.send(training.compare, prompt="The history of", max_new=2, seq=4)
    assert engine.lora is None                                # left off
    (got,) = page.send(training.adapter, seq=5)
    raw = got["bytes"][:got["size"]]
    assert raw[:4] == b"GGUF"
    adapter = read_adapter(raw, len(raw), from_gguf(header))
    assert len(adapter.pairs) == len(run.trainer.lora.targets)
    page.send(training.switch, on=True, seq=6)
    assert engine.lora is run.trainer.lora
    print(f"\nwithout: {cmp['without']['text']!r}\nwith:    {cmp['with']['text']!r}")


def test_forget_reads_the_training_buffers_back_as_zero(page, monkeypatch):
    page.send(training.run, **ASK)
    lo = page.w.state.loaded
    run = lo.held(TRAINING)
    labels = set(page.of("train-plan")[0]["labels"])
    train, held = run.train, run.held
    with router_over_standins(monkeypatch) as router:
        asyncio.run(router._forget({}, page.w))
    (msg,) = page.of("forget")
    items = {i["label"]: i for i in msg["report"]["items"]}
    ours = [items[label] for label in labels if label in items]
    assert msg["report"]["status"] == "wiped" and ours
    assert all(i["after"] == 0 for i in ours) and any(i["before"] > 0 for i in ours)
    assert any(label.startswith("lora A|B") and items[label]["before"] > 0 for label in labels if label in items)
    assert page.w.state.loaded.held(TRAINING) is None and lo.engine.lora is None
    assert train == [] and held == []
    assert not lo.engine.device.owned_by(run.trainer)


@pytest.mark.parametrize("change, says", [
    ({"text": "Too short."}, "needs at least 32"),
    ({"text": "  "}, "no text to train on"),
    ({"ctx": 1000}, "at most 64 on this engine"),
    ({"rank": 0}, "the rank: 0 is out of bounds"),
    ({"lr": "fast"}, "the learning rate: 'fast' is not a number"),
    ({"optimizer": "lion"}, "optimizer 'lion'"),
])
def test_refusals_say_why(page, change, says):
    with pytest.raises(TrainError, match=says):
        page.send(training.run, **{**ASK, **change})
    assert page.w.state.loaded.held(TRAINING) is None and page.w.state.loaded.engine.lora is None


def test_refusals_before_a_run(page, model):
    with pytest.raises(TrainError, match="train an adapter first"):
        page.send(training.compare, prompt="Hi")
    page.w.state.loaded = None
    with pytest.raises(RuntimeError, match="load a model first"):
        page.send(training.run, **ASK)
    engine = model[0]
    assert training.defaults(engine) == {"refusal": None, "full_refusal": None, "max_ctx": 64}
    assert "KV cache in f16" in training.refusal(SimpleNamespace(cfg=engine.cfg, kv_type="f16"))
    gemma4 = from_gguf(gguf.read_file(synthetic_arch.build("gemma4", "f32", cache_dir() / "synthetic")))
    assert "no backward yet for its" in training.refusal(SimpleNamespace(cfg=gemma4, kv_type="f32"))
    for hybrid in ("lfm2", "qwen35"):       # the short conv and the gated delta-net have their backward
        cfg = from_gguf(gguf.read_file(synthetic_arch.build(hybrid, "f32", cache_dir() / "synthetic")))
        assert training.refusal(SimpleNamespace(cfg=cfg, kv_type="f32")) is None


def test_the_panels_probes_follow_the_adapter(page):
    lo = page.w.state.loaded
    ids = lo.tokenizer.encode(TEXT[:120], add_bos=True)
    early = Probes(lo.engine)
    try:
        plain = asyncio.run(early.inspect(ids, attention=True, residual=True)).residual
        page.send(training.run, **ASK)
        followed = asyncio.run(early.inspect(ids, attention=True, residual=True))
    finally:
        early.close()
    fresh = Probes(lo.engine)
    try:
        made_now = asyncio.run(fresh.inspect(ids, attention=True, residual=True))
    finally:
        fresh.close()
    assert followed.residual == made_now.residual and followed.attention == made_now.attention
    assert followed.residual != plain


TURNS = "".join(json.dumps({"messages": [{"role": "user", "content": f"Say {w}."},
                                         {"role": "assistant", "content": f"{w} {w}."}]}) + "\n"
                for w in ("red", "green", "blue", "black", "white", "grey", "pink", "gold", "teal", "navy", "plum"))


def test_a_run_on_chat_turns_trains_their_answers_alone(page):
    """A .jsonl picked in the card (`chat`): each conversation a window, the plan counts the answers' tokens, the
    steps and the held-out loss take the masks, the with / without prompt is a user's turn, and Forget empties the
    masks with the windows."""
    out = page.send(training.run, **{**ASK, "text": TURNS, "chat": True, "ctx": 48, "batch": 2, "steps": 2})
    (plan,), (done,) = page.of("train-plan", out), page.of("train-done", out)
    assert plan["chat"] and (plan["train"], plan["held"]) == (10, 1) and plan["windows"] == 11
    run = page.w.state.loaded.held(TRAINING)
    assert plan["trained_tokens"] == sum(sum(m[1:]) for m in run.masks) and 3 * 10 <= plan["trained_tokens"] <= 8 * 10
    assert done["steps_done"] == 2 and done["held_before"] > 0 and done["held_after"] > 0
    out = page.send(training.compare, prompt="Say red.", max_new=3, chat=True, system="", seq=2)
    (cmp,) = page.of("train-compare", out)
    plain = page.send(training.compare, prompt="Say red.", max_new=3, seq=3)
    assert cmp["prompt_tokens"] > page.of("train-compare", plain)[0]["prompt_tokens"]     # the template's turn
    masks = run.masks
    run.close()
    assert masks == [] and run.held_masks == []


@pytest.mark.parametrize("text, says", [
    ('{"messages": [{"role": "user", "content": "q"}]}\n', "the file line 1: no assistant message"),
    ("not json\n", "the file line 1: not JSON"),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 80},
                              {"role": "assistant", "content": "a"}]}) + "\n", "longer than a window of 48"),
])
def test_chat_turns_refused_by_line(page, text, says):
    with pytest.raises(TrainError, match=says):
        page.send(training.run, **{**ASK, "text": text, "chat": True, "ctx": 48})
    assert page.w.state.loaded.held(TRAINING) is None
