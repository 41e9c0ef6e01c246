"""The Training card's other mode (web/training.js "a new model"): a llama model trained from scratch in the tab, on a
vocabulary the user trained (the Tokenizer card's, or a `lab tokenizer-train` JSON file) and a text, in one of
lab.settings SCRATCH_PRESETS' shapes; then loaded as the page's model, so every card reads it. `lab train --scratch`
is the same run natively (lab/host/cli/training.py); the weights start as lab.format.untrained says, drawn on the GPU.

    train-new {tokenizer (the JSON file as text), tokenizer_name, text, preset, steps, lr, ctx, batch, optimizer,
               seed, seq (the card's), load_seq (the page's load seq: the new model's messages carry it)}
        -> "model-info" {seq: load_seq, summary, made} once the model before is unloaded (the page drops it then),
           "loaded" {seq: load_seq, stats (made true)} once the weights are drawn, then the card's own messages as
           lab/worker/training.py's run posts them: "train-plan" (its `made`: the shape), "train-progress"...,
           "train-done"
    train-model {seq} -> "train-model" {seq, size, bytes}: the model as it is now, a GGUF llama.cpp loads (every
        tensor F32, the vocabulary in its header: lab.instruments.training model_bytes), read from the GPU

Everything that can be refused is refused before the model loaded now is touched, each in one line: no GPU, the
settings (lab/worker/training.py Ask), the preset, a tokenizer file that is not one (lab.text.tokenizer.train
from_dict checks every field; a hostile file is refused there, never repaired), the text (empty, over MAX_TEXT, too
short for a window trained on and one held out), the model's memory budget on this GPU. Then the model before is
unloaded (its conversation and every card's state go with it, as a new load's do), the new engine made with its
weights of kind CONVERSATION (they are made of the user's text) and drawn, and the run trains every weight
(Trainer full=True) as a full fine-tune does. A Trainer refused past that point (its own buffers over this GPU's
limits) leaves the untrained model loaded, and says so.

The model's weights are the user's work, and the user's data: a new chat leaves them (lab/worker/state.py
`Loaded.left_by_new_chat`); Forget wipes and reads them back with every other CONVERSATION buffer, then unloads the
model (lab/worker/router.py `_wipe`: `unloaded`). Nothing of the vocabulary's file or the text is kept here past the
run: the tokenizer lives with the loaded model (as a file's does), the text's windows in the card's Run.

What it does not know: the page, how a step runs (lab/instruments/training.py), how weights are drawn (lab/ops/init.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from lab import gpu
from lab.engine import budget
from lab.engine.backward import TrainError
from lab.engine.load import untrained, validate
from lab.engine.scratch import prefill_batch
from lab.format import gguf
from lab.format import untrained as shapes
from lab.instruments.training import Trainer, model_bytes
from lab.settings import SCRATCH_PRESETS, TRAINING
from lab.text.tokenizer.train import from_dict
from lab.worker import training
from lab.worker.cards import TRAINING as CARD
from lab.worker.loading import arrived, unload
from lab.worker.state import Worker

MAX_TOKENIZER = 8 << 20     # bytes of a tokenizer file: a 65,536-token vocabulary's JSON is about 2 MB


def _vocabulary(raw: str, name: str):
    """The trained vocabulary in a tokenizer file's text, or TrainError naming what is wrong with it."""
    if len(raw) > MAX_TOKENIZER:
        raise TrainError(f"{name} is {len(raw):,} characters: a tokenizer file of this lab is at most "
                         f"{MAX_TOKENIZER:,}")
    try:
        return from_dict(json.loads(raw))
    except (ValueError, TypeError, KeyError, RecursionError) as e:    # JSONDecodeError is a ValueError
        raise TrainError(f"{name} is refused: {e}") from None


@dataclass
class Checked:
    """A run asked for, everything checked: the settings, the model's shape, header, config and tokenizer, the text's
    windows (trained on and held out), the rows a step runs and the memory budget counted."""
    ask: training.Ask
    preset: str
    seed: int
    tokenizer_name: str
    shape: shapes.Shape
    header: gguf.Header
    cfg: object
    tok: object
    train: list[list[int]]
    held: list[list[int]]
    rows: int
    counted: budget.Budget

    def made(self) -> dict:
        """The new model's shape, for the page (model-info's and the plan's `made`)."""
        s = self.shape
        return {"preset": self.preset, "layers": s.layers, "width": s.width, "heads": s.heads,
                "kv_heads": s.kv_heads, "ffn": s.ffn, "ctx": s.ctx, "vocab": self.cfg.n_vocab,
                "params": s.n_params(self.cfg.n_vocab), "tokenizer": self.tokenizer_name, "seed": self.seed}


def _check(msg: dict, device) -> Checked:
    """Every refusal a run can meet before the model loaded now is touched (TrainError, or the budget's)."""
    ask = training.Ask.of(msg, min(TRAINING.max_ctx, shapes.MAX_CTX), "for a model trained here")
    preset = str(msg.get("preset") or "")
    if preset not in SCRATCH_PRESETS:
        raise TrainError(f"preset {preset!r}: one of {', '.join(SCRATCH_PRESETS)}")
    seed = training.number(msg, "seed", int, 0, 0, 2**31 - 1, "the seed")
    name = str(msg.get("tokenizer_name") or "the tokenizer file")
    vocab = _vocabulary(str(msg.get("tokenizer") or ""), name)
    text = training.text_of(msg)
    shape = shapes.preset(preset, ask.ctx)
    header = gguf.read(shapes.header_bytes(shape, vocab.kvs()))
    cfg, tok = validate(header)
    train, held = training.windows(text, tok, ask.ctx)     # as `lab train --scratch` cuts them
    del text
    rows = max(ask.ctx, prefill_batch(device.info))
    counted = budget.count(device.info.limits, header, cfg, shape.ctx, max_batch=rows, int8=False, kv="f32")
    try:
        budget.check(counted)
    except Exception:
        training.empty(train, held)
        raise
    return Checked(ask, preset, seed, name, shape, header, cfg, tok, train, held, rows, counted)


async def _made(w: Worker, c: Checked, load_seq) -> None:
    """The model before unloaded, the page told (model-info), the new engine made and drawn, held as the loaded
    model and the page told again (loaded)."""
    unload(w)
    made = c.made()
    summary = gguf.summary(c.header)
    summary.update(file_name=f"a new {c.preset} model (trained here)", prefix_bytes=0, parse_ms=0.0,
                   budget=c.counted.card(c.cfg), made=made)
    w.post({"type": "model-info", "summary": summary, "seq": load_seq, "made": made})
    t0 = time.perf_counter()
    engine = untrained(w.state.device, c.header, c.cfg, c.shape, c.seed, n_ctx=c.shape.ctx, max_batch=c.rows,
                       weights_kind=gpu.CONVERSATION, counted=c.counted)
    try:
        await w.state.device.flush_errors()
    except BaseException:
        engine.close()
        raise
    w.post(arrived(w, engine, c.header, c.tok, load_seq, upload_s=0.0, build_s=time.perf_counter() - t0, made=True))


async def run(msg: dict, w: Worker) -> None:
    """Check everything, unload the model before, make and draw the new one, load it, train it."""
    device = w.state.device
    if device is None:
        raise TrainError("no GPU: the lab cannot train without WebGPU")
    c = _check(msg, device)
    ask = c.ask
    try:
        await _made(w, c, msg.get("load_seq"))
        lo = w.loaded()
        try:
            trainer = Trainer(lo.engine, T=ask.ctx, batch=ask.batch, full=True, optim=ask.optim())
        except TrainError as e:
            raise TrainError(f"{e}; the untrained model stays loaded") from None
    except BaseException:
        training.empty(c.train, c.held)       # the text's windows, whatever stopped the run
        raise
    state = lo.hold(CARD, training.Run(trainer, c.train, c.held, made=c.made()))
    await device.flush_errors()
    w.stop_clear()
    try:
        await training.run_steps(state, ask, w, msg.get("seq"))
    finally:
        lo.session.reset()                   # the steps overwrote the KV cache


async def model(msg: dict, w: Worker) -> None:
    """The loaded model as it is now, a GGUF of every tensor in F32, read from the GPU; nothing of it is kept here.
    Its weights must be the user's (Loaded.weights_are_users): a model made here, or a file's every weight trained in
    place (lab/worker/training.py, full fine-tuning); its metadata is then the file's, general.file_type all-F32."""
    lo = w.loaded()
    if not lo.weights_are_users:
        raise TrainError("the model loaded is a file's as it was read: only a model trained here (from scratch, or "
                         "every weight of a file's) is downloaded whole")
    raw = await model_bytes(lo.engine)
    size = len(raw)
    w.post({"type": "train-model", "seq": msg.get("seq"), "size": size, "bytes": w.f32(raw + bytes(-size % 4))})
