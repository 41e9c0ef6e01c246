"""The worker's state (lab/worker/state.py, changed by lab/worker/router.py) outside the browser: `js` and
`pyodide.ffi` are stood in for (tests/unit/workerkit.py), so the state transitions run in CPython. What is checked:
after a lost device, Forget and a new chat nothing of the conversation is left on the Python side, in the state or in
lists a handler may still hold."""

from __future__ import annotations

import asyncio

import pytest

from lab.engine.session import Session
from lab.worker.state import Loaded, State
from tests.unit.workerkit import router_over_standins


class _Tok:
    def __init__(self) -> None:
        self._cache = {"the secret": [1, 2]}     # what BPE caches: chunks of typed text

    def drop_caches(self) -> int:                # as lab.text.tokenizer.base.Tokenizer.drop_caches
        n = len(self._cache)
        self._cache.clear()
        return n


class _Engine:
    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def router(monkeypatch):
    with router_over_standins(monkeypatch) as r:
        yield r


def _converse(router):
    tok, eng = _Tok(), _Engine()
    session = Session(eng, tok)
    session.cached += [5, 6, 7]
    router.worker.state = State(device=object(), loaded=Loaded(eng, None, tok, session, context=[5, 6, 7, 8]))
    return tok, eng, session, router.worker.state.loaded.context


def test_a_lost_device_keeps_nothing_of_the_conversation(router, monkeypatch):
    tok, eng, session, context = _converse(router)
    asked = []     # the new device the worker asks for: recorded, not run (there is no browser here)
    monkeypatch.setattr(router.asyncio, "ensure_future", lambda coro: asked.append(coro.__name__) or coro.close())
    router._lost(router.worker, "destroyed")
    assert asked == ["_again"]
    assert router.worker.state.device is None and router.worker.state.loaded is None
    assert session.cached == [] and context == [] and tok._cache == {}     # emptied where a handler may hold them
    (msg,) = router.posted
    assert msg["where"] == "device" and "destroyed" in msg["message"]
    assert "nothing of the conversation" in msg["message"]


def test_new_chat_replaces_the_conversation_whole(router):
    tok, eng, session, context = _converse(router)
    old = router.worker.state.loaded
    asyncio.run(router._reset({"type": "reset"}, router.worker))
    new = router.worker.state.loaded
    assert new is not old and new.engine is eng and new.tokenizer is tok
    assert new.context == [] and new.session.cached == [] and new.session is not session
    assert session.cached == [] and context == []


def test_unload_frees_the_engine_and_the_conversation(router):
    tok, eng, session, context = _converse(router)
    device = router.worker.state.device
    router._unload(router.worker)
    assert router.worker.state.loaded is None and router.worker.state.device is device and eng.closed
    assert session.cached == [] and context == []
