"""What every handler of the worker reads (lab/worker/router.py routes to them): `Worker`, one object that holds the
current `State` and the ways out to the page. Plain Python: router.py binds the ways out to web/worker.js, a test
binds them to a list and lambdas.

What it does not know: the messages (lab/worker/protocol.py), JS (router.py binds it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from lab.engine.engine import Engine
from lab.engine.session import Session
from lab.format import gguf
from lab.gpu.shaders import KernelCache
from lab.instruments import kvview, memory
from lab.instruments.experiments import Experiments
from lab.instruments.probes import Probes
from lab.instruments.retrieval import Index
from lab.text.tokenizer import Tokenizer


@dataclass
class Loaded:
    """A loaded model and its conversation. Replaced whole, never edited field by field: on load, unload, Forget,
    new chat and device loss, so that no handler can keep a piece of an old conversation by forgetting a key.
    The retrieval index (set by the card's build, as probes and kv_view are on first use) is the user's files, not
    the conversation: a new chat keeps it; Forget wipes it and then drops it (lab/worker/router.py `_forget`); a new
    load, an unload and a lost device drop it. The Experiments card's `experiments` (its buffers) go the same way."""
    engine: Engine
    header: gguf.Header
    tokenizer: Tokenizer
    session: Session
    probes: Probes | None = None                        # built on the first panel request, freed with the engine
    kv_view: kvview.KvView | None = None                # the KV panel's norms pass, built on the first chat
    memory: memory.MemoryView | None = None             # a hybrid's state reads for the memory card, likewise
    context: list[int] = field(default_factory=list)    # ids the page shows: the last prompt and what followed
    index: Index | None = None                          # the retrieval card's index of the user's files
    experiments: Experiments | None = None              # the Experiments card's runs, made on its first experiment

    def fresh(self, *, keep_index: bool = True) -> Loaded:
        """The same model with no conversation; this one's token lists are emptied in place (they may be shared).
        The new one holds this one's index and experiments, unless keep_index is false: the caller then owns them
        (Forget wipes their buffers before dropping the index and closing the experiments)."""
        self.drop_conversation()
        keep = keep_index
        return Loaded(self.engine, self.header, self.tokenizer, Session(self.engine, self.tokenizer), self.probes,
                      kv_view=self.kv_view, memory=self.memory, index=self.index if keep else None,
                      experiments=self.experiments if keep else None)

    def drop_conversation(self) -> None:
        self.session.reset()
        self.context.clear()

    def drop_experiments(self) -> None:
        """Free the experiments' GPU buffers (zeroed, being CONVERSATION)."""
        if self.experiments is not None:
            self.experiments.close()
            self.experiments = None

    def drop_index(self) -> None:
        """Free the index's GPU buffers (zeroed, being CONVERSATION) and empty its files' ids and names in place."""
        if self.index is not None:
            self.index.drop()
            self.index = None


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
        if lo.probes is None:
            lo.probes = Probes(lo.engine)
        return lo.probes

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
