"""What every handler of the worker reads (lab/worker/router.py routes to them): `Worker`, one object that holds the
current `State` and the ways out to the page. Plain Python: router.py binds the ways out to web/worker.js, a test
binds them to a list and lambdas.

What it does not know: the messages (lab/worker/protocol.py), JS (router.py binds it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from lab import gpu
from lab.engine.engine import Engine
from lab.engine.session import Session
from lab.format import gguf
from lab.gpu.shaders import KernelCache
from lab.instruments.probes import Probes
from lab.text.tokenizer import Tokenizer
from lab.worker import cards as registry   # its CARDS read at each event (a test adds cards of its own)
from lab.worker.cards import PROBES, Card, Forget, S


@dataclass
class Loaded:
    """A loaded model and its conversation. Replaced whole, never edited field by field: on load, unload, Forget,
    new chat and device loss, so that no handler can keep a piece of an old conversation by forgetting a key.
    `cards` holds what the cards and panels made on first use (lab/worker/cards.py: the probes, the KV and memory
    views, the retrieval index of the user's files, the Experiments card's runs); what a new chat, Forget, an unload
    and a lost device do to each is said there, once, and done here by going through CARDS. A state joins `cards`
    when its handler makes it and leaves it when dropped; any change of conversation is still a new Loaded."""
    engine: Engine
    header: gguf.Header
    tokenizer: Tokenizer
    session: Session
    context: list[int] = field(default_factory=list)    # ids the page shows: the last prompt and what followed
    cards: dict[Card, Any] = field(default_factory=dict)   # each card's state, once its handler made it

    # -- a card's state ------------------------------------------------------------------------------------------
    def held(self, card: Card[S]) -> S | None:
        return self.cards.get(card)

    def hold(self, card: Card[S], state: S) -> S:
        if card not in registry.CARDS:       # a state nothing would close: every event goes through CARDS
            raise KeyError(f"card {card.name!r} is not in lab/worker/cards.py CARDS")
        self.cards[card] = state
        return state

    def made(self, card: Card[S], make: Callable[[], S]) -> S:
        """The card's state, made now by `make` when it has none yet."""
        state = self.held(card)
        return self.hold(card, make()) if state is None else state

    def drop(self, card: Card) -> None:
        """Close the card's state now (its buffers freed, zeroed being CONVERSATION; its data emptied) and let it go."""
        state = self.held(card)
        if state is not None:
            card.close(state)
            del self.cards[card]

    # -- the events ------------------------------------------------------------------------------------------------
    def fresh(self) -> Loaded:
        """The conversation dropped with no wipe (the test hooks that run steps of their own, lab/worker/hooks.py):
        as `renewed`, the states a new chat does not keep closed at once."""
        lo, handed = self.renewed()
        for card, state in handed:
            card.close(state)
        return lo

    def renewed(self) -> tuple[Loaded, list[tuple[Card, Any]]]:
        """A new chat: the same model with no conversation; this one's token lists are emptied in place (they may be
        shared). Each card's state goes over to the new one, or (`new_chat` False) is handed back in CARDS order, open:
        the caller holds it alive through the wipe and closes it after (lab/worker/router.py `_reset`)."""
        return self._next(forgetting=False)

    @property
    def weights_are_users(self) -> bool:
        """The model's weights are the user's data, CONVERSATION buffers: a model trained from scratch here
        (lab/worker/scratch.py), or a file's whose every weight the Training card trained in place
        (lab/worker/training.py, full fine-tuning). A new chat leaves them; Forget wipes them and unloads the model."""
        return self.engine.weights.kind == gpu.CONVERSATION

    def left_by_new_chat(self) -> list:
        """The buffers of the user's work that a new chat's wipe leaves: the user's files' (lab/worker/cards.py
        `new_chat_leaves`), and weights that are the user's, the model's."""
        mine = self.engine.weights.buffers() if self.weights_are_users else []
        return mine + [b for card, state in self.cards.items() for b in card.left_by_new_chat(state)]

    def forgotten(self) -> tuple[Loaded, list[tuple[Card, Any]]]:
        """Forget's new chat: as `fresh`, less every card's state Forget does not keep (Forget.WIPE, or one a new
        chat closes), handed back in CARDS order, open: the caller holds them alive through the wipe, so its read-back
        covers their buffers, and then closes them (lab/worker/router.py `_forget`)."""
        return self._next(forgetting=True)

    def _next(self, *, forgetting: bool) -> tuple[Loaded, list[tuple[Card, Any]]]:
        self.drop_conversation()
        kept, handed = {}, []
        for card in registry.CARDS:
            state = self.held(card)
            if state is None:
                continue
            if card.new_chat and not (forgetting and card.forget is Forget.WIPE):
                kept[card] = state
            else:
                handed.append((card, state))
        return Loaded(self.engine, self.header, self.tokenizer, Session(self.engine, self.tokenizer),
                      cards=kept), handed

    def close(self) -> None:
        """An unload (a new load included): the conversation dropped, every card's state closed, then the engine."""
        self.drop_conversation()
        for card in registry.CARDS:
            self.drop(card)
        self.engine.close()

    def device_lost(self) -> None:
        """The device went, and every buffer with it: the conversation dropped, and what a card's state holds on this
        side (its `lost`; a state with none is let go with this object)."""
        self.drop_conversation()
        self.tokenizer.drop_caches()
        for card in registry.CARDS:
            state = self.held(card)
            if state is not None and card.lost(state):
                del self.cards[card]

    def drop_conversation(self) -> None:
        self.session.reset()
        self.context.clear()


@dataclass
class State:
    """Replaced whole when the device is lost; `loaded` is replaced whole (see Loaded)."""
    device: object = None                # BrowserDevice, None before init and after a lost device
    loaded: Loaded | None = None
    check_kernels: KernelCache | None = None   # pipelines of kernel checks (tests, the verification card); no data


@dataclass
class Worker:
    """The one place a handler reads: the current state, and the ways out to the page."""
    post: Callable[[dict], None]                 # a message to the page
    f32: Callable[[bytes], object]               # raw f32 bytes -> what the page receives as a Float32Array
    stop_requested: Callable[[], bool]           # the page's "stop", recorded by web/worker.js while Python is busy
    stop_clear: Callable[[], None]
    state: State = field(default_factory=State)

    def loaded(self) -> Loaded:
        if self.state.loaded is None:
            raise RuntimeError("load a model first")
        return self.state.loaded

    def probes(self) -> Probes:
        lo = self.loaded()
        return lo.made(PROBES, lambda: Probes(lo.engine))

    def device(self):
        if self.state.device is None:
            raise RuntimeError("no GPU device")
        return self.state.device

    def kernels(self) -> KernelCache:
        """The kernel checks' pipelines on the current device: made on first use, and again for a new device."""
        device, st = self.device(), self.state
        if st.check_kernels is None or st.check_kernels.device is not device:
            st.check_kernels = KernelCache(device)
        return st.check_kernels


def clear_staging(device) -> None:
    """Zero the read-back staging buffers after the self-test, a kernel check or a replay: they hold the last numbers
    read, and nothing read for one of those stays for what comes next."""
    for b in device.staging(0):
        device.clear(b)


# Every routed message is answered by one of these: the message as a dict (a File stays a JS object), the worker.
Handler = Callable[[dict, Worker], Awaitable[None]]
