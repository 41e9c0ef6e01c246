"""The worker's state (lab/worker/state.py, changed by lab/worker/router.py) outside the browser: `js` and
`pyodide.ffi` are stood in for (tests/unit/workerkit.py), so the state transitions run in CPython. What is checked:
after a lost device, Forget and a new chat nothing of the conversation is left on the Python side, in the state or in
lists a handler may still hold; the retrieval index survives a new chat (the user's files), is alive while Forget
wipes and reads back the GPU and dropped after it, and is dropped by an unload and a lost device."""

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


class _Index:
    """As lab.instruments.retrieval.Index.drop: the files' ids and names emptied in place (the buffers freed)."""

    def __init__(self) -> None:
        self.ids = [[11, 12, 13]]
        self.names = ["notes.txt"]
        self.dropped = False

    def drop(self) -> None:
        self.ids[0].clear()
        self.ids.clear()
        self.names.clear()
        self.dropped = True


def _converse(router):
    tok, eng = _Tok(), _Engine()
    session = Session(eng, tok)
    session.cached += [5, 6, 7]
    router.worker.state = State(device=object(), loaded=Loaded(eng, None, tok, session, context=[5, 6, 7, 8],
                                                               index=_Index()))
    return tok, eng, session, router.worker.state.loaded.context


def test_a_lost_device_keeps_nothing_of_the_conversation(router, monkeypatch):
    tok, eng, session, context = _converse(router)
    index = router.worker.state.loaded.index
    asked = []     # the new device the worker asks for: recorded, not run (there is no browser here)
    monkeypatch.setattr(router.asyncio, "ensure_future", lambda coro: asked.append(coro.__name__) or coro.close())
    router._lost(router.worker, "destroyed")
    assert asked == ["_again"]
    assert router.worker.state.device is None and router.worker.state.loaded is None
    assert session.cached == [] and context == [] and tok._cache == {}     # emptied where a handler may hold them
    assert index.dropped and index.ids == [] and index.names == []
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
    assert new.index is old.index and not new.index.dropped          # the user's files, not the conversation


def test_unload_frees_the_engine_and_the_conversation(router):
    tok, eng, session, context = _converse(router)
    device = router.worker.state.device
    index = router.worker.state.loaded.index
    router._unload(router.worker)
    assert router.worker.state.loaded is None and router.worker.state.device is device and eng.closed
    assert session.cached == [] and context == []
    assert index.dropped and index.ids == []


def test_forget_wipes_the_index_while_alive_then_drops_it(router, monkeypatch):
    """The wipe's read-back can only prove buffers that still exist: the index must be dropped after it, not before."""
    tok, eng, session, context = _converse(router)
    index = router.worker.state.loaded.index
    seen = []

    class _Report:
        def to_dict(self) -> dict:
            return {"status": "wiped"}

    async def wipe(device, on_after=None, skip=None):
        seen.append((index.dropped, router.worker.state.loaded.index))
        return _Report()

    class _Picture:
        def __init__(self, engine) -> None:
            pass

        def picture(self, rows: int) -> dict:
            return {"norms": b""}

    monkeypatch.setattr(router.forget, "wipe", wipe)
    monkeypatch.setattr(router.kvview, "AfterPicture", _Picture)
    monkeypatch.setattr(router.worker, "f32", bytes)        # no JS typed arrays here
    asyncio.run(router._forget({"type": "forget"}, router.worker))
    assert seen == [(False, None)]        # alive through the wipe, and already out of the state
    assert index.dropped and index.ids == [] and index.names == []
    assert router.worker.state.loaded.index is None and session.cached == [] and context == []
    assert router.posted[-1]["type"] == "forget"
