"""The worker's messages (lab/worker/protocol.py) against its router (lab/worker/router.py), outside the browser over
the stand-ins of tests/unit/workerkit.py: every routed type is catalogued and every catalogued type routed; every
type the worker posts is catalogued; an id-answered question answers under its id, with `error` when it fails; any
other handler's failure reaches the page as an error message."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from lab.worker import protocol
from lab.worker.state import Worker
from tests.unit.workerkit import Message, router_over_standins

WORKER_SOURCES = sorted((Path(__file__).resolve().parents[2] / "lab" / "worker").glob("*.py"))


@pytest.fixture
def router(monkeypatch):
    with router_over_standins(monkeypatch) as r:
        yield r


def test_every_routed_type_is_catalogued_and_every_catalogued_type_routed(router):
    routed, catalogued = set(router.ROUTES), set(protocol.INCOMING)
    assert routed - catalogued == set(), "routed but not in protocol.INCOMING"
    assert catalogued - routed == set(), "in protocol.INCOMING but not routed"
    assert catalogued & set(protocol.BY_WORKER_JS) == set(), "web/worker.js takes these before Python sees them"


def test_every_posted_type_is_catalogued(router):
    """What the worker's modules post by name, and what its id-answered questions answer under their own type."""
    literal = {t for path in WORKER_SOURCES for t in re.findall(r'"type": "([a-z-]+)"', path.read_text())}
    answered = {t for t, handler in router.ROUTES.items() if getattr(handler, "answers_by_id", False)}
    assert literal, "the pattern no longer finds what the worker posts"
    posted = literal | answered
    assert posted - set(protocol.OUTGOING) == set(), "posted but not in protocol.OUTGOING"
    assert set(protocol.OUTGOING) - posted == set(), "in protocol.OUTGOING but never posted"


def _worker(posted: list) -> Worker:
    return Worker(post=posted.append, f32=bytes, stop_requested=lambda: False, stop_clear=lambda: None)


def test_an_answered_question_answers_under_its_id():
    posted = []

    @protocol.answered
    async def ask(msg: dict, w: Worker) -> dict:
        if msg["n"] < 0:
            raise ValueError(f"n = {msg['n']}")
        return {"double": 2 * msg["n"]}

    w = _worker(posted)
    asyncio.run(ask({"type": "double", "id": 3, "n": 21}, w))
    asyncio.run(ask({"type": "double", "id": 4, "n": -1}, w))
    assert posted == [{"type": "double", "id": 3, "double": 42},
                      {"type": "double", "id": 4, "error": "ValueError: n = -1"}]


@pytest.mark.parametrize("msg, answer", [
    ({"type": "last-logits", "id": 7, "ids": [1, 2]}, "RuntimeError: load a model first"),
    ({"type": "weight-bytes", "id": 8, "name": "token_embd.weight", "offset": 0, "size": 4},
     "RuntimeError: load a model first"),
    ({"type": "kernel-check", "id": 9, "cases": []}, "RuntimeError: no GPU device"),
])
def test_the_hooks_answer_a_failure_under_the_id(router, msg, answer):
    """Through the router, as the page asks: no device and no model here, so each question fails, under its id."""
    asyncio.run(router.handle(Message(**msg)))
    assert router.posted == [{"type": msg["type"], "id": msg["id"], "error": answer}]


def test_other_failures_reach_the_page_as_errors(router):
    asyncio.run(router.handle(Message(type="probe-rope", pos=0, layer=0, seq=5)))
    asyncio.run(router.handle(Message(type="read-header")))
    assert router.posted == [
        {"type": "error", "where": "probe-rope", "message": "load a model first", "seq": 5},
        {"type": "error", "where": "read-header", "message": "unknown message type 'read-header'"}]
