"""The worker's state (lab/worker/state.py, changed by lab/worker/router.py) outside the browser: `js` and
`pyodide.ffi` are stood in for (tests/unit/workerkit.py), so the state transitions run in CPython. What is checked:
after a lost device, Forget and a new chat nothing of the conversation is left on the Python side, in the state or in
lists a handler may still hold; the retrieval index survives a new chat (the user's files), is alive while Forget
wipes and reads back the GPU and dropped after it, and is dropped by an unload and a lost device. And every card's
state in lab/worker/cards.py CARDS, with cards of the test's own added there (each policy a new card may take), goes
through the four events as its entry says, which fails if the router or `Loaded` lists cards instead of going
through CARDS."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from lab import gpu
from lab.engine.session import Session
from lab.worker import cards
from lab.worker.cards import INDEX, Card, Forget
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
    weights = SimpleNamespace(kind=gpu.WEIGHTS, buffers=list)      # a file's weights: not the conversation's

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
        self.buffers = ["retrieval.embeddings"]     # what a new chat's wipe leaves (Index.buffers)

    def drop(self) -> None:
        self.ids[0].clear()
        self.ids.clear()
        self.names.clear()
        self.dropped = True


class _Device:
    buffers: list = []             # the registry after an unload: nothing left (lab.gpu Device.buffers)


def _converse(router):
    tok, eng = _Tok(), _Engine()
    session = Session(eng, tok)
    session.cached += [5, 6, 7]
    router.worker.state = State(device=_Device(), loaded=Loaded(eng, None, tok, session, context=[5, 6, 7, 8],
                                                               cards={INDEX: _Index()}))
    return tok, eng, session, router.worker.state.loaded.context


def test_a_lost_device_keeps_nothing_of_the_conversation(router, monkeypatch):
    tok, eng, session, context = _converse(router)
    index = router.worker.state.loaded.held(INDEX)
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


def test_new_chat_replaces_the_conversation_whole(router, monkeypatch):
    tok, eng, session, context = _converse(router)
    old = router.worker.state.loaded
    leaves = _forget(router, monkeypatch, lambda: None, "reset")
    assert leaves == [["retrieval.embeddings"]]   # the index's buffers: left as they are, neither read nor cleared
    new = router.worker.state.loaded
    assert tok._cache == {}                      # the tokenizer's chunks of typed text, as Forget drops them
    assert new is not old and new.engine is eng and new.tokenizer is tok
    assert new.context == [] and new.session.cached == [] and new.session is not session
    assert session.cached == [] and context == []
    assert new.held(INDEX) is old.held(INDEX) and not new.held(INDEX).dropped    # the user's files, not the chat
    assert new.cards is not old.cards


def test_unload_frees_the_engine_and_the_conversation(router):
    tok, eng, session, context = _converse(router)
    device = router.worker.state.device
    index = router.worker.state.loaded.held(INDEX)
    router.unload(router.worker)
    assert router.worker.state.loaded is None and router.worker.state.device is device and eng.closed
    assert session.cached == [] and context == []
    assert index.dropped and index.ids == []


class _Report:
    def to_dict(self) -> dict:
        return {"status": "wiped"}


class _Picture:
    """kvview.AfterPicture and memory.StateAfter: nothing read back here, an empty picture."""

    def __init__(self, engine, *_) -> None:
        pass

    def picture(self, rows: int = 0) -> dict:
        return {"norms": b"", "conv": None, "delta": None}


def _forget(router, monkeypatch, during, kind: str = "forget") -> list:
    """Run the router's Forget (or New chat: kind "reset", or the tab's unload: "unload") with `forget.wipe` replaced
    by `during()` (what the test looks at while it runs); returns each wipe's `leave` (the buffers it was told to
    leave)."""
    leaves = []

    async def wipe(device, on_after=None, skip=None, leave=()):
        leaves.append(list(leave))
        during()
        return _Report()

    monkeypatch.setattr(router.forget, "wipe", wipe)
    monkeypatch.setattr(router.kvview, "AfterPicture", _Picture)
    monkeypatch.setattr(router.memory, "StateAfter", _Picture)
    monkeypatch.setattr(router.memory, "conv_span", lambda engine, rows: (0, rows))
    monkeypatch.setattr(router.worker, "f32", bytes)        # no JS typed arrays here
    handler = {"forget": router._forget, "reset": router._reset, "unload": router._unload_tab}[kind]
    asyncio.run(handler({"type": kind}, router.worker))
    assert router.posted[-1]["type"] == {"unload": "unloaded"}.get(kind, kind)
    assert router.posted[-1]["report"] == {"status": "wiped"}
    return leaves


def test_forget_wipes_the_index_while_alive_then_drops_it(router, monkeypatch):
    """The wipe's read-back can only prove buffers that still exist: the index must be dropped after it, not before."""
    tok, eng, session, context = _converse(router)
    index = router.worker.state.loaded.held(INDEX)
    seen = []
    _forget(router, monkeypatch, lambda: seen.append((index.dropped, router.worker.state.loaded.held(INDEX))))
    assert seen == [(False, None)]        # alive through the wipe, and already out of the state
    assert index.dropped and index.ids == [] and index.names == []
    assert router.worker.state.loaded.held(INDEX) is None and session.cached == [] and context == []


# -- every card's state, by its entry in lab/worker/cards.py ----------------------------------------------------------
def test_every_card_constant_is_registered():
    """A card's constant that CARDS lacks would be made and never closed (Loaded.hold refuses it at run time)."""
    declared = [v for v in vars(cards).values() if isinstance(v, Card)]
    assert set(declared) == set(cards.CARDS) and len(cards.CARDS) == len({c.name for c in cards.CARDS})


# Cards of the test's own, one for each policy a new card may take, added to CARDS: no router code names them.
EXTRA = (Card("kept-view"), Card("user-data", close_with="drop", lost_with="forget_all", forget=Forget.WIPE),
         Card("per-chat", lost_with="close", new_chat=False),
         Card("user-file", forget=Forget.WIPE, new_chat_leaves="files"))


class _Recorder:
    """A card's state that records every method called on it, in the log all states and the engine share."""

    def __init__(self, card: Card, log: list) -> None:
        self.card, self.log, self.calls = card, log, []

    def __getattr__(self, method: str):
        if method == self.card.new_chat_leaves:      # the buffers a new chat leaves: stand-ins named after the card
            return [f"{self.card.name} buffer"]

        def call() -> None:
            self.calls.append(method)
            self.log.append((self.card.name, method))
        return call


@pytest.fixture
def every_card(router, monkeypatch):
    """The loaded model holding a recording state for every card of CARDS and EXTRA; the shared log of their calls
    (the engine's close included)."""
    monkeypatch.setattr(cards, "CARDS", cards.CARDS + EXTRA)
    tok, eng, session, context = _converse(router)
    log = []
    monkeypatch.setattr(eng, "close", lambda: log.append(("engine", "close")), raising=False)
    lo = router.worker.state.loaded
    for card in cards.CARDS:
        if card is not INDEX:
            lo.hold(card, _Recorder(card, log))
    lo.cards[INDEX] = _Recorder(INDEX, log)       # replaces _converse's index: every state records
    return {card: lo.held(card) for card in cards.CARDS}, log


def test_unload_closes_every_card_then_the_engine(router, every_card):
    states, log = every_card
    router.unload(router.worker)
    assert log == [(c.name, c.close_with) for c in cards.CARDS] + [("engine", "close")]


def test_a_lost_device_drops_what_every_card_holds(router, every_card, monkeypatch):
    states, log = every_card
    monkeypatch.setattr(router.asyncio, "ensure_future", lambda coro: coro.close())
    old = router.worker.state.loaded
    router._lost(router.worker, "destroyed")
    assert log == [(c.name, c.lost_with) for c in cards.CARDS if c.lost_with is not None]
    assert set(old.cards) == {c for c in cards.CARDS if c.lost_with is None}   # let go with the old model, untouched


def test_a_new_chat_keeps_or_closes_each_card(router, every_card, monkeypatch):
    """As Forget: what a new chat does not keep is out of the loaded model and open while the wipe reads back, and
    closed after it; the wipe leaves exactly the buffers the kept states name in `new_chat_leaves`."""
    states, log = every_card
    during = []
    leaves = _forget(router, monkeypatch, lambda: during.append((dict(router.worker.state.loaded.cards), list(log))),
                     "reset")
    new = router.worker.state.loaded
    kept = {c: states[c] for c in cards.CARDS if c.new_chat}
    assert during == [(kept, [])] and new.cards == kept
    assert log == [(c.name, c.close_with) for c in cards.CARDS if not c.new_chat]
    assert leaves == [[f"{c.name} buffer" for c in cards.CARDS if c.new_chat_leaves]]
    assert {c.name for c in cards.CARDS if c.new_chat_leaves} >= {"index", "training", "user-file"}


def test_forget_leaves_nothing_out_of_its_wipe(router, every_card, monkeypatch):
    assert _forget(router, monkeypatch, lambda: None) == [[]]


def test_the_tabs_unload_wipes_every_card_alive_then_closes_everything(router, every_card, monkeypatch):
    """pagehide: the wipe runs with every card's state still open (its buffers read back), nothing left out of it, the
    loaded model already out of reach; then every state is closed, then the engine; the Python copies are dropped."""
    states, log = every_card
    tok = router.worker.state.loaded.tokenizer
    session, context = router.worker.state.loaded.session, router.worker.state.loaded.context
    during = []
    leaves = _forget(router, monkeypatch, lambda: during.append((router.worker.state.loaded, list(log))), "unload")
    assert leaves == [[]] and during == [(None, [])]
    assert log == [(c.name, c.close_with) for c in cards.CARDS] + [("engine", "close")]
    assert router.worker.state.loaded is None and router.worker.state.device is not None
    assert session.cached == [] and context == [] and tok._cache == {}


def test_forget_keeps_or_wipes_each_card_by_its_policy(router, every_card, monkeypatch):
    """What Forget does not keep is out of the loaded model and still open while the wipe reads the GPU back, and
    closed after it, in CARDS order."""
    states, log = every_card
    gone = [c for c in cards.CARDS if c.forget is Forget.WIPE or not c.new_chat]
    during = []
    _forget(router, monkeypatch, lambda: during.append((dict(router.worker.state.loaded.cards), list(log))))
    kept = {c: states[c] for c in cards.CARDS if c not in gone}
    assert during == [(kept, [])]                  # none closed yet, none left in the state
    assert router.worker.state.loaded.cards == kept
    assert log == [(c.name, c.close_with) for c in gone]
