"""The Training card's adapter file (lab/worker/training.py `open_file`) natively, on the small synthetic Llama 3 the
committed adapter was made for (tests/fixtures/lora), driven as the page drives it, with a stand-in for the page's
File (`size`, `slice(a, b).arrayBuffer()`): the adapter is checked against the model, read in slices, put on the
engine as the card's adapter, and the last position's logits are llama.cpp's with it (and, switched off, without
it); the download is the same adapter; each hostile file is one line naming what is wrong, and leaves the card's
adapter and the engine as they were; closing it (Forget, an unload) takes it off the engine and frees its buffers.
The page itself: tests/browser/test_adapter_file_page.py."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from lab.engine.backward import TrainError
from lab.engine.session import Session
from lab.format import gguf
from lab.format.adapter import read_adapter
from lab.format.model import from_gguf
from lab.text.tokenizer import from_metadata
from lab.worker import training
from lab.worker.cards import TRAINING
from lab.worker.state import Loaded, State, Worker
from tests.conftest import FIXTURES, native_engine, tiny

FIX = FIXTURES / "lora"
LLAMA_TOL = 2e-3    # as tests/engine/test_lora_engine.py: both f32, summed in other orders (measured ~1.4e-5)


class File:
    """The page's File as the worker sees it: its size, its name, and slices read as bytes."""

    def __init__(self, raw: bytes, name: str) -> None:
        self.raw, self.name, self.size = raw, name, len(raw)
        self.reads: list[tuple[int, int]] = []

    def slice(self, start: int, end: int):
        self.reads.append((start, end))
        part = self.raw[start:end]

        async def array_buffer():
            return SimpleNamespace(to_bytes=lambda: part)
        return SimpleNamespace(arrayBuffer=array_buffer)


@pytest.fixture(scope="module")
def model(device):
    path = tiny("f32")
    header = gguf.read_file(path)
    engine = native_engine(device, path, n_ctx=64, max_batch=16)
    yield engine, header, from_metadata(header.metadata), path
    engine.close()


@pytest.fixture
def w(model):
    engine, header, tok, _ = model
    posted: list[dict] = []
    worker = Worker(post=posted.append, f32=bytes, stop_requested=lambda: False, stop_clear=lambda: None,
                    state=State(engine.device, Loaded(engine, header, tok, Session(engine, tok))))
    worker.posted = posted
    yield worker
    worker.state.loaded.drop(TRAINING)


def _send(w, handler, **msg) -> dict:
    asyncio.run(handler(msg, w))
    return w.posted[-1]


def _last_logits(engine, ids, cols) -> np.ndarray:
    engine.step(ids, 0)
    V = engine.cfg.n_vocab
    return np.frombuffer(engine.device.read_sync(engine.scratch.logits, 0, 4 * V), np.float32)[cols]


def test_an_adapter_file_is_llama_cpps_and_the_cards_adapter(w, model):
    engine, _, _, path = model
    with np.load(FIX / "logits.npz") as z:
        golden = {k: z[k] for k in z.files}
    ids, cols = [int(i) for i in golden["ids"]], golden["cols"]
    raw = (FIX / "adapter.gguf").read_bytes()
    f = File(raw, "adapter.gguf")
    m = _send(w, training.open_file, file=f, seq=3)
    assert m["type"] == "train-adapter-file" and m["seq"] == 3 and m["file"] == "adapter.gguf"
    assert m["pairs"] == 28 and m["ranks"] == [2, 4] and m["alpha"] == 8.0 and m["types"] == ["F32"]
    assert max(e - s for s, e in f.reads) < len(raw)          # slices, never the whole file at once
    lo = w.state.loaded
    run = lo.held(TRAINING)
    assert run.trainer is None and engine.lora is run.lora and run.on
    assert m["labels"] == run.labels() and set(m["memory"]) == {"adapter", "activations"}
    with_adapter = _last_logits(engine, ids, cols)
    e1 = float(np.abs(with_adapter - golden["with_adapter"][-1]).max())
    assert _send(w, training.switch, on=False, seq=3) == {"type": "train-switch", "seq": 3, "on": False}
    assert engine.lora is None
    e0 = float(np.abs(_last_logits(engine, ids, cols) - golden["without"][-1]).max())
    print(f"\nlast position vs llama.cpp: with the file's adapter {e1:.2e}, without {e0:.2e}")
    assert e1 < LLAMA_TOL and e0 < LLAMA_TOL
    # the download: the same pairs and values, as F32
    got = _send(w, training.adapter, seq=3)
    out = bytes(got["bytes"])[:got["size"]]
    cfg = from_gguf(gguf.read_file(path))
    a_in, a_out = read_adapter(raw, len(raw), cfg), read_adapter(out, len(out), cfg)
    assert a_out.bases == a_in.bases and a_out.alpha == a_in.alpha
    for p, q in zip(a_in.pairs, a_out.pairs):
        assert raw[p.a_offset:p.a_offset + p.a_nbytes] == out[q.a_offset:q.a_offset + q.a_nbytes]
        assert raw[p.b_offset:p.b_offset + p.b_nbytes] == out[q.b_offset:q.b_offset + q.b_nbytes]
    # the replies without and with it, the switch left as it was (off)
    got = _send(w, training.compare, prompt="The old lighthouse keeper", max_new=3, seq=4)
    assert got["type"] == "train-compare" and got["with"]["tokens"] == got["without"]["tokens"] == 3
    assert got["with"]["text"] != got["without"]["text"] and engine.lora is None
    # closing it (Forget, an unload): off the engine, its buffers freed
    _send(w, training.switch, on=True, seq=3)
    lo.drop(TRAINING)
    assert engine.lora is None and not engine.device.owned_by(run)


def test_a_training_run_replaces_the_files_adapter_and_a_file_the_runs(w, model):
    engine = model[0]
    _send(w, training.open_file, file=File((FIX / "adapter.gguf").read_bytes(), "adapter.gguf"), seq=1)
    lo = w.state.loaded
    from_file = lo.held(TRAINING)
    text = (FIXTURES / "perplexity_text.txt").read_text()[:600]
    _send(w, training.run, text=text, rank=2, steps=1, lr=1e-2, ctx=16, batch=1, optimizer="sgd", seq=2)
    run = lo.held(TRAINING)
    assert run.trainer is not None and engine.lora is run.lora and not engine.device.owned_by(from_file)
    _send(w, training.open_file, file=File((FIX / "adapter.gguf").read_bytes(), "adapter.gguf"), seq=3)
    assert lo.held(TRAINING).trainer is None and not engine.device.owned_by(run.trainer) and run.train == []


def _nan_in_first_a(raw: bytes) -> bytes:
    p = read_adapter(raw, len(raw), from_gguf(gguf.read_file(tiny("f32")))).pairs[0]
    return raw[:p.a_offset] + struct.pack("<f", float("nan")) + raw[p.a_offset + 4:]


HOSTILE = [
    ("cut.gguf", lambda raw, model: raw[:300], "adapter file: "),
    ("model.gguf", lambda raw, model: model.read_bytes(), "general.type is missing: not a LoRA adapter"),
    ("nan.gguf", lambda raw, model: _nan_in_first_a(raw), "not finite numbers"),
    ("other.gguf", lambda raw, model: raw.replace(b"llama", b"qwen3", 1), "another architecture"),
    ("junk.gguf", lambda raw, model: b"not a gguf file at all" * 10, "adapter file: "),
]


@pytest.mark.parametrize("name,make,says", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_file_is_one_line_and_changes_nothing(w, model, name, make, says):
    engine, _, _, path = model
    raw = (FIX / "adapter.gguf").read_bytes()
    _send(w, training.open_file, file=File(raw, "adapter.gguf"), seq=1)
    lo = w.state.loaded
    run, buffers = lo.held(TRAINING), len(engine.device.buffers)
    with pytest.raises(TrainError) as e:
        asyncio.run(training.open_file({"file": File(make(raw, path), name), "seq": 2}, w))
    line = str(e.value)
    print(f"\n{line}")
    assert line.startswith(f"{name} is refused: ") and says in line and "\n" not in line
    assert lo.held(TRAINING) is run and engine.lora is run.lora          # the adapter before, as it was
    assert len(engine.device.buffers) == buffers                          # nothing made, nothing left
