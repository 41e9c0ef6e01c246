"""The worker's side of the Training card (web/training.js): a LoRA adapter (or every weight of the model) trained in
the tab on a text the page sends (a text file the user picked, or the chat's text so far), then put to use.
lab/worker/router.py routes the five messages here; the training itself is lab/instruments/training.py.

    train {text, rank, steps, lr, ctx, batch, optimizer, full, chat, seq} (chat: the text is a .jsonl of chat turns)
        -> "train-plan" {seq, tokens, windows, train, held, params, full, memory, labels, ...} once the text is
           tokenized and the adapter made (full: every weight of the model instead, rank null), "train-progress"
           {seq, step, steps, loss, held, lr, seconds, tokens_per_s, eta_s} (step 0: the held-out loss before
           training, then after each step; `held` every few steps and after the last, else null), "train-done"
           {seq, steps_done, stopped, diverged, held_before, held_after, ppl_before, ppl_after, seconds,
           tokens_per_s, memory}
    train-compare {prompt, max_new, chat, system, seq} (chat: the prompt a user's turn in the chat template)
        -> "train-token" {seq, which: "without" | "with", piece}..., "train-compare" {seq, without, with,
           prompt_tokens}: greedy replies to the same prompt without and with the adapter
    train-adapter {seq} -> "train-adapter" {seq, size, bytes}: the adapter as a llama.cpp adapter GGUF (size bytes;
        `bytes` crosses as the worker's one raw-bytes way out, Worker.f32, padded to whole words)
    train-switch {on, seq} -> "train-switch" {seq, on}: the adapter on or off for the chat, the panels and the cards
    train-adapter-file {file, seq} -> "train-adapter-file" {seq, file, name, size, pairs, ranks, alpha, params, types,
        ignored, memory, labels}: a llama.cpp adapter GGUF the user picked, checked against the loaded model
        (lab.format.adapter.read_adapter on a growing prefix of the File), its A and B read by File.slice, made into a
        Lora and put on the engine as the card's adapter (the switch, the replies and the download then take it as
        they take a trained one); a file refused is one line, and the adapter before stays as it was

A .jsonl of chat turns (`chat`, a file the user picked, such as `lab grounded-data` writes) is read as `lab train`
reads one (lab.instruments.chatdata): each conversation a window of `ctx` tokens in the model's chat template, only
its assistant's tokens trained, the last tenth of the conversations held out. Otherwise the
text is tokenized as `lab tokenize` and `lab train` do (tok.encode, no BOS), cut into windows of `ctx` tokens
(lab.instruments.training.windows); the last tenth of the windows (lab.settings.TRAINING.held_out, at least one) is
held out: the steps train on the others, in order, wrapping; the held-out loss is the mean over the held-out windows
(in batches of the step's windows: where their number is not a multiple of the batch, the first ones count again).
Stop is the page's "stop", which web/worker.js records while Python is busy: polled after each step, so the step in
flight finishes and the adapter keeps it.

Switching the adapter (a run's start, the compare, the switch, Forget) rebuilds the engine's plans, and the KV cache
the chat left was computed without it (or with it): the chat's session is reset each time, so its next turn prefills
its whole prompt. The training steps overwrite the KV cache too.

Full fine-tuning (`full`, the card's "every weight of the loaded model"): the same run with no adapter, every weight
of an F32 file moved in place (Trainer full=True, as `lab train --full`). Refused in one line before anything changes:
a quantized file (an F32 copy is `lab f32-copy MODEL --out FILE`), an f16 KV cache, the settings' bounds, the text.
Once the Trainer is made, the engine's weights become CONVERSATION buffers (lab.ops.weights ModelWeights.rekind,
through lab.gpu Device.rekind): from the first step they are made of the user's text, so a new chat leaves them,
Forget wipes them, reads them back and unloads the model (lab/worker/state.py Loaded.weights_are_users), and the
download is the whole model (lab/worker/scratch.py `model`). The one reply is the trained model's; no adapter, no
switch.

The state over the loaded model is a `Run` (lab/worker/cards.py TRAINING): the Trainer, whose every buffer is kind
CONVERSATION (the adapter, its gradients and optimizer state, the text's activations), and the text's windows; or,
for an adapter read from a file, the Lora alone (its two buffers CONVERSATION too, owned by the Run). A new
chat keeps it (the adapter stays on, its parameters left as they are; the rest of its buffers are wiped and read
back with the conversation's); Forget wipes its buffers with the rest, then closes it (the adapter off the
engine, the buffers freed, the windows emptied); an unload closes it; a lost device empties the windows. No adapter
bytes are kept: each download reads the adapter from the GPU again.

What it does not know: the page (it posts dicts), how a step runs (lab/instruments/training.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from lab import gpu
from lab.engine.backward import TrainError, untrainable, untrainable_full
from lab.engine.lora import Lora, LoraError
from lab.engine.session import Session
from lab.format import gguf
from lab.format.adapter import Adapter, decode_f32, read_adapter
from lab.format.rules import ModelError
from lab.instruments import chatdata
from lab.instruments.training import OPTIMIZERS, Optim, Trainer, adapter_bytes, batch_of, held_out_loss, split
from lab.settings import TRAINING, Settings
from lab.text import chat
from lab.worker.cards import PROBES
from lab.worker.cards import TRAINING as CARD
from lab.worker.state import Loaded, Worker

EVALS = 10                  # held-out evaluations over a run (and one after its last step)
MAX_TEXT = 2_000_000        # characters of training text: tokenizing runs in Python, a few seconds a megabyte
ADAPTER_PREFIX = 1 << 16    # first read of an adapter file's header (a few KB: its keys and tensor table); grown


# -- what the loaded engine allows ------------------------------------------------------------------------------
def max_ctx(engine) -> int:
    """The longest window a step can take: the engine's rows a step, its context, the page's bound."""
    return min(engine.max_batch, engine.n_ctx, TRAINING.max_ctx)


def refusal(engine, full: bool = False) -> str | None:
    """Why this engine cannot train, in words a user reads (None: it can); full: every weight of it, which the
    optimizer moves in f32 (lab.engine.backward untrainable_full: a quantized file is refused, pointing at an F32
    copy)."""
    reason = untrainable(engine.cfg) or (untrainable_full(engine.cfg, engine.weights.matrix_types) if full else None)
    if reason:
        return reason
    if engine.kv_type != "f32":
        return ("training reads the keys and values in f32, and this model was loaded with its KV cache in "
                f"{engine.kv_type}: untick \"KV cache in f16\" (the model loads again) to train")
    return None


def defaults(engine) -> dict:
    """What the card needs to know of the loaded engine (the "loaded" message's stats.training)."""
    return {"refusal": refusal(engine), "full_refusal": refusal(engine, full=True), "max_ctx": max_ctx(engine)}


# -- what the user asked --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ask:
    rank: int
    steps: int
    lr: float
    ctx: int
    batch: int
    optimizer: str

    @classmethod
    def of(cls, msg: dict, top: int, why: str) -> Ask:
        """The message's settings, each checked; the context at most `top` tokens (`why` says what bounds it)."""
        d = TRAINING
        ctx = number(msg, "ctx", int, d.ctx, 2, None, "the context")
        if ctx > top:
            raise TrainError(f"a context of {ctx} tokens: at most {top} {why}")
        optimizer = str(msg.get("optimizer") or d.optimizer)
        if optimizer not in OPTIMIZERS:
            raise TrainError(f"optimizer {optimizer!r}: one of {', '.join(OPTIMIZERS)}")
        return cls(rank=number(msg, "rank", int, d.rank, 1, d.max_rank, "the rank"),
                   steps=number(msg, "steps", int, d.steps, 1, d.max_steps, "the steps"),
                   lr=number(msg, "lr", float, d.lr, 1e-8, 1.0, "the learning rate"), ctx=ctx,
                   batch=number(msg, "batch", int, d.batch, 1, d.max_batch, "the batch"), optimizer=optimizer)

    def optim(self) -> Optim:
        """The optimizer asked for, over these steps (AdamW's gradients clipped to a global norm of 1)."""
        return Optim(self.optimizer, lr=self.lr, steps=self.steps, clip=1.0 if self.optimizer == "adamw" else 0.0)


def number(msg: dict, key: str, kind: type, default, lo, hi, what: str):
    raw = msg.get(key)
    try:
        v = kind(default if raw is None or raw == "" else raw)
    except (TypeError, ValueError):
        raise TrainError(f"{what}: {raw!r} is not a number") from None
    if not math.isfinite(v) or v < lo or (hi is not None and v > hi):
        raise TrainError(f"{what}: {v} is out of bounds ({lo} to {hi})" if hi is not None
                         else f"{what}: {v} is below {lo}")
    return v


# -- the card's state -------------------------------------------------------------------------------------------
class Run:
    """The card's adapter over the loaded model, on the engine while `on`: one trained here (the Trainer, which owns
    it and every buffer of its training, the text's windows it trains on and those held out, and the held-out loss
    before training), or one read from a file (`trainer` None, no windows: the Lora alone, its buffers this Run's,
    `file` the file's name, `name` its general.name). The switch, the with / without replies, the download and Forget
    take either the same way. Or no adapter at all (`whole`): every weight of the model trained, the loaded file's in
    place (full fine-tuning) or a new model's (`made`: its shape, lab/worker/scratch.py); its weights are then the
    user's data (lab/worker/state.py Loaded.weights_are_users)."""

    def __init__(self, trainer: Trainer | None, train: list[list[int]], held: list[list[int]], *, engine=None,
                 file: str | None = None, name: str | None = None, made: dict | None = None,
                 masks: list | None = None, held_masks: list | None = None) -> None:
        self.trainer, self.train, self.held = trainer, train, held
        self.masks, self.held_masks = masks, held_masks      # chat turns': each window's trained tokens (None: text)
        self.made = made      # a model trained from scratch (lab/worker/scratch.py): its shape; the Trainer is full
        self.engine = trainer.engine if trainer is not None else engine
        self.lora: Lora | None = trainer.lora if trainer is not None else None    # a file's: set once it is made
        self.file, self.name = file, name
        self.on = True
        self.before: float | None = None

    @property
    def whole(self) -> bool:
        """Every weight of the model is trained (no adapter): full fine-tuning, or a model made here."""
        return self.trainer is not None and self.trainer.full

    @property
    def owner(self) -> object:
        """What the adapter's buffers are owned by (lab.gpu Device.owning): the Trainer, or this Run."""
        return self.trainer if self.trainer is not None else self

    @property
    def adapter_buffers(self) -> list:
        """What a new chat leaves of it (lab/worker/cards.py TRAINING): the adapter's parameters, the user's work; its
        step scratch (`lora u`, the last step's x A^T) and a finished run's gradients, optimizer moments and
        activations are wiped with the conversation (a new run makes them afresh)."""
        return [] if self.lora is None else [self.lora.params]

    def labels(self) -> list[str]:
        """The labels of its buffers, for the page to find them in Forget's report (every weight trained: the
        model's too)."""
        mine = self.engine.device.owned_by(self.owner) + (self.engine.weights.buffers() if self.whole else [])
        return sorted({b.label for b in mine})

    def memory(self) -> dict[str, int]:
        """Bytes of its buffers by what they hold (Trainer.memory; every weight trained: the model's under "model"; a
        file's: the adapter and its step scratch)."""
        if self.trainer is not None:
            held = self.trainer.memory()
            if self.whole:
                del held["adapter"]
                held = {"model": sum(b.size for b in self.engine.weights.buffers()), **held}
            return held
        return {"adapter": self.lora.params.size, "activations": self.lora.u.size}

    def close(self) -> None:
        """Forget, an unload, a new run or file: the adapter off the engine, its buffers freed (zeroed), the windows
        emptied."""
        if self.trainer is not None:
            self.trainer.close()
        else:
            self.engine.set_lora(None)
            self.engine.device.free(self)
        self.lost()

    def lost(self) -> None:
        """The device went with every buffer: the text's windows are emptied here (they may be shared)."""
        empty(self.train, self.held, self.masks or [], self.held_masks or [])


def empty(*lists: list[list[int]]) -> None:
    for wins in lists:
        for w in wins:
            w.clear()
        wins.clear()


def use_adapter(lo: Loaded, lora) -> None:
    """Every step from now on with this adapter (None: without); the chat's cache is stale either way."""
    if lo.engine.lora is not lora:
        lo.engine.set_lora(lora)
    lo.session.reset()


def _trained(w: Worker, adapter: bool = False) -> tuple[Loaded, Run]:
    """The card's state; adapter: one with an adapter (not a run that trained every weight, which has none)."""
    lo = w.loaded()
    state = lo.held(CARD)
    if state is None:
        raise TrainError("train an adapter first, or open an adapter file")
    if adapter and state.whole:
        raise TrainError(("a model trained from scratch" if state.made else "every weight of the model was trained: it")
                         + " has no adapter: it is the model itself (download the model)")
    return lo, state


# -- the handlers ---------------------------------------------------------------------------------------------
async def run(msg: dict, w: Worker) -> None:
    """Train on the message's text: a new adapter (the one before, if any, goes first), or, with `full`, every weight
    of the loaded model in place (full fine-tuning of an F32 file). Every refusal comes before anything changes."""
    lo = w.loaded()
    engine, full = lo.engine, bool(msg.get("full"))
    reason = refusal(engine, full)
    if reason:
        raise TrainError(reason)
    ask = Ask.of(msg, max_ctx(engine), f"on this engine (a step runs at most {engine.max_batch} tokens here, and the "
                                       f"context holds {engine.n_ctx})")
    if msg.get("chat"):         # a .jsonl of chat turns: each conversation a window, its assistant's tokens trained
        train, held, masks, held_masks = chat_windows(text_of(msg), lo, ask.ctx)
    else:
        (train, held), masks, held_masks = windows(text_of(msg), lo.tokenizer, ask.ctx), None, None
    lo.drop(CARD)                            # the adapter trained before: off the engine, its buffers freed
    lo.session.reset()
    try:
        trainer = Trainer(engine, T=ask.ctx, batch=ask.batch, rank=ask.rank, alpha=2.0 * ask.rank, full=full,
                          optim=ask.optim())
    except BaseException:
        empty(train, held, masks or [], held_masks or [])       # the windows emptied all the same
        raise
    if full:
        # From the first step on the file's weights move with the user's text: they are the user's data, found by
        # Forget as every CONVERSATION buffer is (wiped, read back, the model then unloaded), left by a new chat.
        engine.weights.rekind(gpu.CONVERSATION)
        lo.drop(PROBES)     # the embedding inspector's row norms were the file's rows': made again from the trained
    state = lo.hold(CARD, Run(trainer, train, held, masks=masks, held_masks=held_masks))
    await engine.device.flush_errors()      # a kernel or binding the device refuses, named, before any step
    w.stop_clear()
    try:
        await run_steps(state, ask, w, msg.get("seq"))
    finally:
        lo.session.reset()                   # the steps overwrote the KV cache


def text_of(msg: dict) -> str:
    """The message's text to train on, refused when empty or past MAX_TEXT (both modes, and a new model's)."""
    text = str(msg.get("text") or "")
    if not text.strip():
        raise TrainError("no text to train on: choose a text file, or chat first and train on this conversation")
    if len(text) > MAX_TEXT:
        raise TrainError(f"the text is {len(text):,} characters: at most {MAX_TEXT:,} (tokenizing runs in Python, "
                         f"in this tab); cut it")
    return text


def windows(text: str, tok, ctx: int) -> tuple[list[list[int]], list[list[int]]]:
    """The text tokenized as `lab tokenize` does (no BOS, special tokens as plain text), cut into windows of ctx
    tokens: (trained on, held out); refused when too short for one of each."""
    ids = tok.encode(text)
    train, held = split(ids, ctx, TRAINING.held_out)
    ids.clear()
    return train, held


def chat_windows(text: str, lo: Loaded, ctx: int) -> tuple[list, list, list, list]:
    """A .jsonl of chat turns as `lab train` reads it (lab.instruments.chatdata.windows): each conversation a window
    of ctx tokens in the model's chat template, trained on its assistant's tokens; the last tenth held out. A bad line
    is refused by its number."""
    try:
        return chatdata.windows(text, lo.tokenizer, lo.engine.header.metadata, ctx, TRAINING.held_out, "the file")
    except (chatdata.ChatDataError, chat.ChatTemplateError) as exc:
        raise TrainError(str(exc)) from None


def _plan(state: Run, ask: Ask, seq) -> dict:
    tr = state.trainer
    n_train, n_held = len(state.train), len(state.held)
    return {"type": "train-plan", "seq": seq, "tokens": (n_train + n_held) * ask.ctx, "windows": n_train + n_held,
            "chat": state.masks is not None,
            "trained_tokens": None if state.masks is None else sum(sum(m[1:]) for m in state.masks),
            "train": n_train, "held": n_held, "ctx": ask.ctx, "batch": ask.batch, "steps": ask.steps,
            "rank": None if tr.full else ask.rank, "lr": ask.lr, "optimizer": ask.optimizer, "params": tr.n_params,
            "targets": len(tr.pieces()) if tr.full else len(tr.lora.targets), "full": tr.full, "made": state.made,
            "memory": state.memory(), "labels": state.labels()}


async def run_steps(state: Run, ask: Ask, w: Worker, seq) -> None:
    """The held-out loss before, the steps with their progress, the held-out loss after."""
    tr, steps = state.trainer, ask.steps
    every = max(1, steps // EVALS)
    w.post(_plan(state, ask, seq))
    state.before = held = await held_out_loss(tr, state.held, state.held_masks)
    w.post({"type": "train-progress", "seq": seq, "step": 0, "steps": steps, "loss": None, "held": held,
            "lr": tr.optim.lr_at(1), "seconds": 0.0, "tokens_per_s": None, "eta_s": None})
    t0, stepping, done, stopped, diverged = time.perf_counter(), 0.0, 0, False, False
    while done < steps and not (stopped or diverged):
        t1 = time.perf_counter()
        loss = await tr.step(batch_of(state.train, done, ask.batch),
                             None if state.masks is None else batch_of(state.masks, done, ask.batch))
        stepping += time.perf_counter() - t1
        done += 1
        if done == 1:
            await tr.device.flush_errors()   # what the device refused at the first step's submit, named
        stopped, diverged = bool(w.stop_requested()), not math.isfinite(loss)
        last = done == steps or stopped or diverged
        held = await held_out_loss(tr, state.held, state.held_masks) if done % every == 0 or last else None
        seconds = time.perf_counter() - t0
        w.post({"type": "train-progress", "seq": seq, "step": done, "steps": steps, "loss": loss, "held": held,
                "lr": tr.optim.lr_at(done), "seconds": seconds, "tokens_per_s": done * ask.batch * ask.ctx / stepping,
                "eta_s": seconds / done * (steps - done)})
    seconds = time.perf_counter() - t0
    w.post({"type": "train-done", "seq": seq, "steps_done": done, "steps": steps, "stopped": stopped and done < steps,
            "diverged": diverged, "held_before": state.before, "held_after": held, "ppl_before": _ppl(state.before),
            "ppl_after": _ppl(held), "seconds": seconds, "tokens_per_s": done * ask.batch * ask.ctx / stepping,
            "memory": state.memory()})


def _ppl(loss: float | None) -> float | None:
    """Perplexity, exp of the mean loss; None where it is not a number (or too large to be one)."""
    if loss is None or not math.isfinite(loss) or loss > 700:
        return None
    return math.exp(loss)


async def compare(msg: dict, w: Worker) -> None:
    """Greedy replies to one prompt without and with the adapter, each from an empty cache of a session of their
    own; the adapter is left as the switch says, and the chat's session reset. A run that trained every weight has no
    "without" (the model before it is gone): its one reply is "with" (the model as trained so far)."""
    lo, state = _trained(w)
    seq, tok = msg.get("seq"), lo.tokenizer
    text = str(msg.get("prompt") or "")
    if not text.strip():
        raise TrainError("type a prompt for the two replies")
    if msg.get("chat"):     # as chat turns trained it: the prompt a user's turn (after the system's, if given)
        system = str(msg.get("system") or "")
        turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        try:
            ids = chat.render_chat(tok, lo.engine.header.metadata, turns)
        except chat.ChatTemplateError as exc:
            raise TrainError(str(exc)) from None
    else:
        ids = tok.encode(text, add_bos=tok.add_bos)      # text to continue, as the adapter was trained
    max_new = number(msg, "max_new", int, TRAINING.max_new, 1, lo.engine.n_ctx - len(ids), "the reply's tokens")
    session, replies = Session(lo.engine, tok), {}
    w.stop_clear()
    try:
        for which, lora in (("with", None),) if state.whole else (("without", None), ("with", state.lora)):
            def on_token(tid: int, piece: str, which=which) -> None:
                w.post({"type": "train-token", "seq": seq, "which": which, "piece": piece})
            use_adapter(lo, lora)
            session.reset()
            res = await session.generate(ids, Settings(greedy=True), max_new, on_token=on_token,
                                         should_stop=w.stop_requested)
            replies[which] = {"text": res.text, "tokens": len(res.ids), "stop": res.stop}
    finally:
        session.reset()
        use_adapter(lo, state.lora if state.on else None)
    w.post({"type": "train-compare", "seq": seq, "prompt_tokens": len(ids), "without": replies.get("without"),
            "with": replies.get("with")})


async def adapter(msg: dict, w: Worker) -> None:
    """The adapter as it is now, as a llama.cpp adapter GGUF, read from the GPU; nothing of it is kept here."""
    lo, state = _trained(w, adapter=True)
    raw = await adapter_bytes(lo.engine, state.lora, name=state.name or f"llm-lab LoRA r{state.lora.max_rank}")
    size = len(raw)
    w.post({"type": "train-adapter", "seq": msg.get("seq"), "size": size, "bytes": w.f32(raw + bytes(-size % 4))})


async def switch(msg: dict, w: Worker) -> None:
    """The adapter on or off for everything the page runs next (the chat, the panels, the cards)."""
    lo, state = _trained(w, adapter=True)
    state.on = bool(msg.get("on"))
    use_adapter(lo, state.lora if state.on else None)
    w.post({"type": "train-switch", "seq": msg.get("seq"), "on": state.on})


# -- an adapter file ------------------------------------------------------------------------------------------
async def _bytes(file, start: int, end: int) -> bytes:
    """Bytes [start, end) of a picked File (one File.slice: the file never passes whole through wasm memory)."""
    return (await file.slice(start, end).arrayBuffer()).to_bytes()


async def _header(file, engine) -> Adapter:
    """The adapter in the file's header, checked against the loaded model's tensor table (lab.format.adapter
    read_adapter), the prefix read growing until the header fits."""
    size = int(file.size)
    table = {t.name: tuple(t.shape) for t in engine.header.tensors}
    want = min(ADAPTER_PREFIX, size)
    while True:
        try:
            return read_adapter(await _bytes(file, 0, want), size, engine.cfg, table)
        except gguf.NeedMoreBytes as more:
            if want >= size:
                raise ModelError(f"the file ends inside its header ({size:,} bytes): it is truncated") from None
            want = min(size, max(more.needed, 2 * want))


async def _values(file, tensor: str, offset: int, nbytes: int, type_name: str) -> bytes:
    """One A or B of the file as f32 bytes (decode_f32), refused where a value is not a number (a damaged file: the
    adapter would turn every logit into NaN)."""
    raw = await _bytes(file, offset, offset + nbytes)
    if len(raw) != nbytes:
        raise ModelError(f"adapter tensor {tensor}: the file ended at byte {offset + len(raw):,} inside it (it changed "
                         f"while being read?)")
    values = decode_f32(raw, type_name)
    if not math.isfinite(sum(values)):      # a sum of f32 values overflows no double: NaN or infinity only from one
        raise ModelError(f"adapter tensor {tensor} holds values that are not finite numbers (NaN or infinity): the "
                         f"file is damaged")
    return values.tobytes()


async def open_file(msg: dict, w: Worker) -> None:
    """An adapter file the user picked (llama.cpp's LoRA GGUF): checked against the loaded model, its A and B read in
    slices of the File, made into a Lora on the GPU and put on the engine as the card's adapter, in place of the one
    before (trained or read). A file refused, or a failure before the new adapter is whole, leaves the card's adapter
    and the engine as they were."""
    lo = w.loaded()
    file, engine = msg["file"], lo.engine
    dev, label = engine.device, str(getattr(file, "name", "") or "the adapter file")
    try:
        adapter = await _header(file, engine)
        values = {p.base: (await _values(file, p.base + ".lora_a", p.a_offset, p.a_nbytes, p.a_type),
                           await _values(file, p.base + ".lora_b", p.b_offset, p.b_nbytes, p.b_type))
                  for p in adapter.pairs}
    except (ModelError, LoraError) as e:
        raise TrainError(f"{label} is refused: {e}") from None
    state = Run(None, [], [], engine=engine, file=label, name=adapter.name)
    try:
        with dev.owning(state):             # its buffers are the Run's: freed (zeroed) when it closes, wiped by Forget
            lora = Lora(dev, Lora.shapes_of(adapter), adapter.alpha, engine.max_batch)
        dev.write(lora.params, lora.packed(values))
        await dev.flush_errors()
    except BaseException:
        dev.free(state)
        raise
    finally:
        values.clear()
    state.lora = lora
    lo.drop(CARD)                           # the adapter before: off the engine, its buffers freed
    lo.hold(CARD, state)
    use_adapter(lo, lora)
    ranks = sorted({t.rank for t in lora.targets.values()})
    w.post({"type": "train-adapter-file", "seq": msg.get("seq"), "file": label, "name": adapter.name,
            "size": int(file.size), "pairs": len(adapter.pairs), "ranks": ranks, "alpha": adapter.alpha,
            "params": lora.n_params, "types": sorted({t for p in adapter.pairs for t in (p.a_type, p.b_type)}),
            "ignored": len(adapter.ignored), "memory": state.memory(), "labels": state.labels()})
