"""The worker's state (lab/worker/router.py) outside the browser: `js` and `pyodide.ffi` are stood in for, so the state
transitions run in CPython. What is checked: after a lost device, Forget and a new chat nothing of the conversation
is left on the Python side, in the state or in lists a handler may still hold."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from lab.engine.session import Session


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
def worker(monkeypatch):
    posted = []
    js = types.ModuleType("js")
    js.postMessage = posted.append
    js.Object = types.SimpleNamespace(fromEntries=dict)
    ffi = types.ModuleType("pyodide.ffi")
    ffi.to_js = lambda x, **_: x
    ffi.create_once_callable = lambda f: f
    pyodide = types.ModuleType("pyodide")
    pyodide.ffi = ffi
    for name, mod in (("js", js), ("pyodide", pyodide), ("pyodide.ffi", ffi)):
        monkeypatch.setitem(sys.modules, name, mod)
    for name in ("lab.worker.router", "lab.gpu.browser"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    w = importlib.import_module("lab.worker.router")
    w.posted = posted
    yield w
    for name in ("lab.worker.router", "lab.gpu.browser"):
        sys.modules.pop(name, None)


def _converse(w):
    tok, eng = _Tok(), _Engine()
    session = Session(eng, tok)
    session.cached += [5, 6, 7]
    w._state = w.State(device=object(), loaded=w.Loaded(eng, None, tok, session, context=[5, 6, 7, 8]))
    return tok, eng, session, w._state.loaded.context


def test_a_lost_device_keeps_nothing_of_the_conversation(worker, monkeypatch):
    tok, eng, session, context = _converse(worker)
    asked = []     # the new device the worker asks for: recorded, not run (there is no browser here)
    monkeypatch.setattr(worker.asyncio, "ensure_future", lambda coro: asked.append(coro.__name__) or coro.close())
    worker._lost("destroyed")
    assert asked == ["_again"]
    assert worker._state.device is None and worker._state.loaded is None
    assert session.cached == [] and context == [] and tok._cache == {}     # emptied where a handler may hold them
    (msg,) = worker.posted
    assert msg["where"] == "device" and "destroyed" in msg["message"] and "nothing of the conversation" in msg["message"]


def test_new_chat_replaces_the_conversation_whole(worker):
    tok, eng, session, context = _converse(worker)
    old = worker._state.loaded
    worker._reset()
    new = worker._state.loaded
    assert new is not old and new.engine is eng and new.tokenizer is tok
    assert new.context == [] and new.session.cached == [] and new.session is not session
    assert session.cached == [] and context == []


def test_unload_frees_the_engine_and_the_conversation(worker):
    tok, eng, session, context = _converse(worker)
    device = worker._state.device
    worker._unload()
    assert worker._state.loaded is None and worker._state.device is device and eng.closed
    assert session.cached == [] and context == []
