"""What a loaded model holds for its cards and panels besides the conversation, and what each event does to it: one
`Card` an entry, all of them in CARDS. lab/worker/state.py `Loaded` keeps each card's state (`Loaded.cards`) and
runs the events over CARDS; lab/worker/router.py says when (new chat, Forget, unload, a lost device).

A card's state is made on first use, by the handler that needs it (`Loaded.made`, `Loaded.hold`), never at load. Then:
- a new chat (`Loaded.renewed`) keeps it, or takes it out and hands it to router.py `_reset`, which holds it alive
  through the same `forget.wipe` as Forget's and closes it after (`new_chat` False: the Experiments card's runs). The
  wipe leaves the buffers a kept state names in `new_chat_leaves` (the user's files: the retrieval index and its
  tuned embedder's parameters, a trained adapter's parameters) and clears and reads back every other CONVERSATION
  buffer, kept states' included;
- Forget (`Loaded.forgotten`) keeps it (Forget.KEEP), or takes it out of the loaded model and hands it to router.py
  `_forget`, which holds it alive through `forget.wipe`, so that the wipe's read-back covers its CONVERSATION buffers
  (non-zero before, zero after), and closes it after the wipe (Forget.WIPE; a state a new chat closes goes that way too);
- an unload (and so a new load) closes it: `close_with` names its method that frees its GPU buffers (zeroed, being
  CONVERSATION) and empties what it holds of the user's data on this side;
- a lost device calls `lost_with`, its method that drops what it holds on this side (its buffers went with the
  device), and lets it go; None: nothing to drop, the state goes with the loaded model.

Adding a card's state: its entry here (a constant, and its place in CARDS: tests/unit/test_worker_state.py fails on
a constant CARDS lacks), its handlers in its own module (as lab/worker/retrieval.py, experiments.py).

What it does not know: the handlers and their messages, the page (web/cards.js is the page's side of the same idea).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from lab.instruments.experiments import Experiments
    from lab.instruments.kvview import KvView
    from lab.instruments.memory import MemoryView
    from lab.instruments.probes import Probes
    from lab.instruments.retrieval import Index

S = TypeVar("S")


class Forget(Enum):
    KEEP = "keep"     # kept: nothing of the user's on this side; its buffers, alive, are wiped with the rest
    WIPE = "wipe"     # the user's data: out of the loaded model, alive through the wipe (read back), then closed


@dataclass(frozen=True, eq=False)     # compared and hashed by identity: `Loaded.cards` is keyed by the entry
class Card(Generic[S]):
    """One kind of per-model state (S, its class), and what each event does to it."""
    name: str                         # what tests and messages call it
    close_with: str = "close"         # the state's method that frees its buffers and empties its data
    lost_with: str | None = None      # the state's method for a lost device; None: nothing on this side to drop
    new_chat: bool = True             # a new chat keeps it (False: closed after the wipe, made again on first use)
    new_chat_leaves: str | None = None    # the state's attribute listing the buffers a new chat leaves as they are
    forget: Forget = Forget.KEEP

    def close(self, state: S) -> None:
        getattr(state, self.close_with)()

    def lost(self, state: S) -> bool:
        """Drop what the state holds on this side; False when it holds nothing to drop (it is kept as it is)."""
        if self.lost_with is None:
            return False
        getattr(state, self.lost_with)()
        return True

    def left_by_new_chat(self, state: S) -> list:
        """The buffers of the user's files a new chat's wipe leaves as they are (none unless `new_chat_leaves`)."""
        return [] if self.new_chat_leaves is None else list(getattr(state, self.new_chat_leaves))


PROBES: Card[Probes] = Card("probes")                 # the panels' probe plans, made on the first panel request
KV_VIEW: Card[KvView] = Card("kv_view")               # the KV card's norms pass, made on the first chat
MEMORY: Card[MemoryView] = Card("memory")             # a hybrid's state reads for the memory card, likewise
INDEX: Card[Index] = Card("index", close_with="drop", lost_with="drop", forget=Forget.WIPE,   # the user's files
                          new_chat_leaves="buffers")
EXPERIMENTS: Card[Experiments] = Card("experiments", lost_with="close", forget=Forget.WIPE,   # its runs' buffers
                                      new_chat=False)
TRAINING: Card = Card("training", lost_with="lost", forget=Forget.WIPE,   # lab.worker.training.Run: the adapter
                      new_chat_leaves="adapter_buffers")
EMBEDDER: Card = Card("embedder", forget=Forget.WIPE,     # lab.worker.embedder.Tuned: the retrieval card's tuned
                      new_chat_leaves="adapter_buffers")  # embedder, made of the user's files as the index is

# Every card's state a loaded model may hold, in the order an unload, a lost device and Forget go through them (the
# index before the tuned embedder, whose adapter the index's plans run).
CARDS: tuple[Card, ...] = (INDEX, EMBEDDER, EXPERIMENTS, TRAINING, PROBES, KV_VIEW, MEMORY)
