"""The worker as the page sees it, natively, for the Training card's tests (tests/engine/test_full_card.py,
test_scratch_card.py) and the Retrieval card's tuning (test_tune_card.py): a fresh engine of the small synthetic
Llama 3 (tests/conftest.py `tiny`) loaded, what the handlers post in a list, and a GPU buffer read back."""

from __future__ import annotations

import asyncio

from lab.engine.session import Session
from lab.format import gguf
from lab.text.tokenizer import from_metadata
from lab.worker.state import Loaded, State, Worker
from tests.conftest import native_engine, tiny


class Page:
    """A fresh engine of the tiny file (mix; or the file at `path`; kw to the engine) loaded as the page's model;
    `posted`, what the handlers sent."""

    def __init__(self, device, mix: str = "f32", path=None, **kw) -> None:
        path = tiny(mix) if path is None else path
        header = gguf.read_file(path)
        tok = from_metadata(header.metadata)
        self.engine = native_engine(device, path, n_ctx=64, max_batch=32, **kw)
        self.posted: list[dict] = []
        self.w = Worker(post=self.posted.append, f32=bytes, stop_requested=lambda: False, stop_clear=lambda: None,
                        state=State(device, Loaded(self.engine, header, tok, Session(self.engine, tok))))

    def send(self, handler, **msg) -> list[dict]:
        start = len(self.posted)
        asyncio.run(handler(msg, self.w))
        return self.posted[start:]

    def close(self) -> None:
        lo = self.w.state.loaded
        if lo is not None:
            lo.close()
        self.engine.close()           # a second close of an unloaded one is harmless


def read(engine, buf) -> bytes:
    return asyncio.run(engine.device.read(buf, 0, buf.size))
