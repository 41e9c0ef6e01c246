"""Training a LoRA adapter on a loaded engine (issue #43): the data's windows, a step's gradients over its windows,
the optimizer, the losses.

    windows(tokens, T)                 the text's tokens cut into windows of T at stride T (a last partial one dropped)
    split(tokens, T, share)            (windows trained on, the last `share` of them held out)
    batch_of(wins, s, B)               step s's B windows, in order from window s * B, wrapping
    await held_out_loss(tr, held)      the mean loss over held-out windows
    Trainer(engine, ...)               an adapter on the engine (engine.set_lora) and the step's plan
      await .gradients(batch)          the loss at the adapter as it is, its gradients left in `grads`
      await .step(batch)               gradients, then the optimizer: returns the loss the gradients were taken at
      await .loss(batch)               the loss alone (held-out windows), nothing changed
      await .adapter_bytes()           the adapter as a llama.cpp adapter GGUF (lab.format.adapter.write_adapter)
    await adapter_bytes(engine, lora)  the same for any adapter on the engine (one read from a file)

The loss of a step: the mean over its windows and positions t = 0 .. T-2 of -log p(w[t+1] | w[..t]). Each window
runs as one compute pass (lab.engine.backward.Backward: forward, loss, backward), the gradients adding up across the
step's windows. Every buffer is kind CONVERSATION (the text's activations, the adapter, its gradients and optimizer
state): Forget wipes them.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

from lab import gpu, ops
from lab.engine import budget
from lab.engine.backward import Backward, TrainError, TrainScratch, trained_vectors, untrainable, untrainable_full
from lab.engine.blocks import qkv_width
from lab.engine.lora import DEFAULT_TARGETS, Lora, choose
from lab.format import gguf
from lab.format.adapter import write_adapter
from lab.format.ggml import BY_NAME
from lab.format.writer import write_gguf
from lab.ops import backward_head, optimizer
from lab.ops.weights import run_pieces

OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True)
class Optim:
    """How the parameters move: AdamW (torch.optim.AdamW's rule, decoupled decay) after clipping the gradients' global
    norm to `clip` (0: none), or plain SGD (W <- W - lr grad: no momentum, decay or clipping); the learning rate of
    step s is lab.ops.optimizer.schedule's (a linear warm-up over `warmup` steps, then a cosine to lr * min_ratio at
    step `steps`)."""
    kind: str = "adamw"
    lr: float = 1e-3
    steps: int = 100
    warmup: int = 0
    min_ratio: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise TrainError(f"optimizer {self.kind!r}: one of {', '.join(OPTIMIZERS)}")
        if not (self.lr > 0 and self.steps >= 1 and 0 <= self.warmup <= self.steps and self.weight_decay >= 0
                and self.clip >= 0):
            raise TrainError(f"lr {self.lr} (> 0), steps {self.steps} (>= 1), warm-up {self.warmup} (0 to steps), "
                             f"weight decay {self.weight_decay} and clip {self.clip} (>= 0)")

    def lr_at(self, step: int) -> float:
        return optimizer.schedule(step, lr=self.lr, warmup=self.warmup, total=self.steps, min_ratio=self.min_ratio)


def windows(tokens: list[int], T: int) -> list[list[int]]:
    """The text's windows of T tokens at stride T from its start; a last partial window is dropped."""
    if T < 2:
        raise TrainError(f"a context of {T} tokens has no next token to predict: at least 2")
    if len(tokens) < T:
        raise TrainError(f"the text has {len(tokens)} tokens, fewer than one window of {T}")
    return [tokens[i:i + T] for i in range(0, len(tokens) - T + 1, T)]


def batch_of(wins: list[list[int]], s: int, B: int) -> list[list[int]]:
    """Step s's B windows: in order from window s * B, wrapping at the end of the text."""
    return [wins[(s * B + j) % len(wins)] for j in range(B)]


def split(ids: list[int], T: int, share: float) -> tuple[list[list[int]], list[list[int]]]:
    """(the windows trained on, the windows held out): the text's windows of T tokens, the last `share` of them (at
    least one) held out; share 0: every window trained on, none held out."""
    if not share:
        return windows(ids, T), []
    if len(ids) < 2 * T:
        raise TrainError(f"the text is {len(ids)} tokens: a context of {T} needs at least {2 * T}, one window to "
                         f"train on and one held out; choose a longer text or a smaller context")
    wins = windows(ids, T)
    held = max(1, round(len(wins) * share))
    return wins[:-held], wins[-held:]


async def held_out_loss(tr: Trainer, held: list[list[int]], masks: list[list[bool]] | None = None) -> float:
    """The mean loss over the held-out windows (masks: their trained tokens, `Trainer.targets`), in batches of the
    step's windows; nothing changes."""
    n = -(-len(held) // tr.batch)
    return sum([await tr.loss(batch_of(held, i, tr.batch), None if masks is None else batch_of(masks, i, tr.batch))
                for i in range(n)]) / n


def needs(engine, T: int, rank: int, targets, batch: int = 1, full: bool = False) -> list[tuple[str, int]]:
    """(label, bytes) of every buffer a Trainer of these arguments makes, counted by making them on a device that
    only records sizes (lab.engine.budget.counting): the same allocation code, nothing allocated. full: full
    fine-tuning's (every weight's gradient, and AdamW's two moments of each; the weights themselves are the model's)."""
    cfg, dev = engine.cfg, budget.counting(engine.device.info.limits)
    table = {t.name: t for t in engine.header.tensors}
    lora = None if full else Lora(dev, choose(table, cfg.n_layer, targets, rank), 1.0, engine.max_batch)
    width = max(qkv_width(cfg, il) for il in range(cfg.n_layer))
    ts = TrainScratch.alloc(dev, cfg, engine.weights, lora, T, width)
    grads = [ts.grads] if lora is not None else [
        *(p.buffer for parts in ts.wgrads.values() for p in parts), *ts.vgrads.values()]
    for g in grads:
        for moment in ("adamw m", "adamw v"):
            dev.buffer(g.size, gpu.CONVERSATION, f"{moment} of {g.label}")
    dev.buffer(4 * batch, gpu.CONVERSATION, "train window losses")
    head = backward_head.head_layout(engine.weights.head, T)
    return [(b.label, b.size) for b in dev.buffers] + [(f"head {k}", 4 * v) for k, v in head.floats.items()]


def check_fits(engine, T: int, rank: int, targets, batch: int = 1, full: bool = False) -> None:
    """Refuse (TrainError) a run with a buffer past this GPU's limits, before anything is made, saying the largest
    rank and context that fit."""
    limits = engine.device.info.limits
    wrong = budget.problems(limits, needs(engine, T, rank, targets, batch, full))
    if not wrong:
        return
    if full:
        raise TrainError(f"full fine-tuning at context {T} does not fit this GPU: {wrong[0]}")
    fits = lambda r, t: not budget.problems(limits, needs(engine, t, r, targets, batch))     # noqa: E731
    r = rank
    while r > 1 and not fits(r, T):
        r //= 2
    t = T
    while t > 2 and not fits(rank, t):
        t //= 2
    hint = [f"rank {r} at context {T}" if fits(r, T) else "", f"context {t} at rank {rank}" if fits(rank, t) else ""]
    raise TrainError(f"training at rank {rank} and context {T} does not fit this GPU: {wrong[0]}"
                     + (f"; {' or '.join(h for h in hint if h)} would" if any(hint) else ""))


async def adapter_bytes(engine, lora: Lora, name: str = "llm-lab LoRA") -> bytes:
    """The adapter `lora` on the engine's device as it is now, read from the GPU, as a llama.cpp adapter GGUF (F32 A and
    B under their base tensors' names): a trained one, or one read from a file (the Training card's download)."""
    v = array("f")
    v.frombytes(await engine.device.read(lora.params, 0, 4 * lora.n_params))
    pairs = [(t.name, t.n_in, t.n_out, t.rank, v[t.a:t.b].tobytes(), v[t.b:t.b + t.rank * t.n_out].tobytes())
             for t in lora.targets.values()]
    return write_adapter(engine.cfg.arch, lora.alpha, pairs, name=name)


async def model_bytes(engine) -> bytes:
    """The engine's model as it is now (a full fine-tune's weights, read from the GPU), as a GGUF of the same
    architecture: the file's metadata (general.file_type set to all-F32) and every tensor in the file's order, F32 in
    its file shape. A tensor of a stacked run (lab.ops.weights ModelWeights: q|k|v, gate|up) is its rows of the run, a
    bias of the fused Q/K/V biases its floats of them; rope_freqs, a constant the plans hold, its values. Only F32
    files (full fine-tuning's) are written: a quantized weight has no F32 master copy to read."""
    w, header, dev = engine.weights, engine.header, engine.device
    pieces = tensor_pieces(w, header)
    inside = w.in_vectors()
    tensors = []
    for t in header.tensors:
        if t.type.name != "F32":
            raise TrainError(f"{t.name} is {t.type.name}: only an F32 model (a full fine-tune's) is written whole")
        if t.name in w.vectors:
            raw = await dev.read(w.vectors[t.name], 0, t.nbytes)
        elif t.name in inside:      # qwen2's attn_q/k/v.bias: its bytes of the fused bias
            vector, offset, _ = inside[t.name]
            raw = await dev.read(w.vectors[vector], offset, t.nbytes)
        elif t.name in pieces:
            raw = b"".join([await _matrix_rows(dev, m, p.row, p.rows) for m, p in pieces[t.name]])
            if len(raw) != t.nbytes:
                raise TrainError(f"{t.name}: the engine holds {len(raw)} of its {t.nbytes} bytes")
        elif t.name == "rope_freqs.weight" and engine.rope_freqs is not None:
            raw = array("f", engine.rope_freqs).tobytes()
        else:
            raise TrainError(f"{t.name}: the engine holds no copy of it to write")
        tensors.append((t.name, t.shape, BY_NAME["F32"].id, raw))
    kvs = []
    for key, value in header.metadata.items():
        if key == "general.file_type":
            value = 0                                   # LLAMA_FTYPE_ALL_F32
        vtype = header.metadata_types[key]
        kvs.append((key, gguf.ARRAY, (vtype[1], value)) if isinstance(vtype, tuple) else (key, vtype, value))
    return write_gguf(kvs, tensors, alignment=header.alignment)


def tensor_pieces(weights, header) -> dict[str, list[tuple]]:
    """{file tensor: [(weight, Piece), ...]} of every file tensor the weights' matrices hold rows of, its pieces in the
    tensor's row order (lab.ops.weights.run_pieces): its own weight, its rows of a stacked run, or the views the
    engine reads it as (phi3's fused attn_qkv and ffn_up: one piece; qwen35's attn_q: two a head, apart in the run).
    A view read twice (gemma4's V rows that are K's) gives its rows once."""
    starts = {t.offset: t.name for t in header.tensors if t.nbytes}
    out: dict[str, dict[int, tuple]] = {}
    for m in weights.matrices.values():
        for p in run_pieces(m.name, weights.tensors, starts):
            out.setdefault(p.tensor, {}).setdefault(p.at, (m, p))
    return {name: [by_at[at] for at in sorted(by_at)] for name, by_at in out.items()}


async def _matrix_rows(dev, m, first: int, rows: int) -> bytes:
    """Rows first .. first + rows - 1 of an F32 weight, across its parts."""
    out = bytearray()
    for p in m.parts:
        lo, hi = max(first, p.first_row), min(first + rows, p.first_row + p.n_rows)
        if lo < hi:
            out += await dev.read(p.buffer, 4 * (lo - p.first_row) * m.cols, 4 * (hi - lo) * m.cols)
    return bytes(out)


class Trainer:
    """A LoRA adapter of `rank` (alpha, targets: the kinds of projection, lab.engine.lora) trained on `engine` with
    windows of T tokens, `batch` windows a step; or, with full=True, every weight of the model itself (full
    fine-tuning: the engine's F32 weights are the master copy the optimizer moves in place; its norms too,
    lab.engine.backward trained_vectors). The engine must have an f32 KV cache and steps of at least T rows.
    `keep`: the forward's rows kept for the backward (lab.engine.backward KEEP_BYTES decides by default; tests force
    both ways). `pooled`: no next-token loss; each window's gradient at the final norm's output is the caller's
    (lab.instruments.contrastive: a loss over pooled embeddings), run by `run_pooled`."""

    def __init__(self, engine, *, T: int, batch: int = 1, rank: int = 8, alpha: float = 16.0,
                 targets=DEFAULT_TARGETS, seed: int = 0, optim: Optim | None = None, keep: bool | None = None,
                 full: bool = False, pooled: bool = False) -> None:
        cfg, dev = engine.cfg, engine.device
        reason = untrainable(cfg) or (untrainable_full(cfg, engine.weights.matrix_types) if full else None)
        if reason:
            raise TrainError(reason)
        if engine.kv_type != "f32":
            raise TrainError(f"training reads the keys and values in f32: this engine's KV cache is {engine.kv_type}")
        if not 2 <= T <= min(engine.max_batch, engine.n_ctx):
            raise TrainError(f"a context of {T} tokens: from 2 to {min(engine.max_batch, engine.n_ctx)} on this engine")
        if batch < 1:
            raise TrainError(f"a batch of {batch} windows: at least 1")
        check_fits(engine, T, rank, targets, batch, full)
        self.engine, self.device, self.T, self.batch, self.full = engine, dev, T, batch, full
        self.rows_total = batch * (T - 1)
        self.optim = optim or Optim()
        self.steps_done = 0
        self.lora = None
        with dev.owning(self):
            try:
                if not full:
                    table = {t.name: t for t in engine.header.tensors}
                    self.lora = Lora(dev, choose(table, cfg.n_layer, targets, rank), alpha, engine.max_batch)
                    dev.write(self.lora.params, self.lora.initial(seed))
                width = max(qkv_width(cfg, il) for il in range(cfg.n_layer))
                self.ts = TrainScratch.alloc(dev, cfg, engine.weights, self.lora, T, width, keep=keep)
                self.ce = None if pooled else backward_head.head_ce(dev, engine.weights.head, T,
                                                                    cap=cfg.final_softcap)
                # the loss's divisor, rewritten each step: the positions with a target in its windows (`masks`)
                self.loss_params = None if pooled else backward_head.loss_params(dev, self.ce,
                                                                                 rows_total=self.rows_total)
                self.losses = dev.buffer(4 * batch, gpu.CONVERSATION, f"train window losses [{batch}]")
                engine.set_lora(self.lora)
                plans = lambda: Backward(engine, self.ts, self.ce, self.rows_total, pooled,     # noqa: E731
                                         self.loss_params)
                self.window_ops = plans().step_ops()       # kept for profiles (lab train --profile)
                self.window = dev.prepare(ops.dispatches(self.window_ops, T))
                self._windows = {T: self.window}            # pooled: one prepared list per window length
                self.scoring = None if pooled else dev.prepare(ops.dispatches(plans().loss_ops(), T))
                self.update = dev.prepare(ops.dispatches(self._update_ops(), 1))
            except BaseException:
                engine.set_lora(None)
                dev.free(self)
                raise

    def pieces(self) -> list[tuple[gpu.Buffer, gpu.Buffer, int]]:
        """(parameters, their gradients, floats) of everything the step trains: the adapter's one buffer, or each
        weight part and trained vector of the model (full fine-tuning), in the model's order."""
        if not self.full:
            return [(self.lora.params, self.ts.grads, self.lora.n_params)]
        w, ts = self.engine.weights, self.ts
        out = [(p.buffer, g.buffer, p.n_rows * m.cols)
               for name, m in w.matrices.items() for p, g in zip(m.parts, ts.wgrads[name])]
        return out + [(w.vectors[n], ts.vgrads[n], ts.vgrads[n].size // 4) for n in trained_vectors(self.engine.cfg)]

    @property
    def n_params(self) -> int:
        return sum(n for _, _, n in self.pieces())

    def _update_ops(self) -> list[ops.Op]:
        """The optimizer's pass over the trained parameters (state: lr and t written each step): one op list a piece,
        the gradients' global norm over all of them first (AdamW)."""
        dev, k, o = self.device, self.engine.kernels, self.optim
        conv = gpu.CONVERSATION
        self.state = optimizer.make_state(dev, "train optimizer state [lr, t, sumsq, clip]")
        pieces = self.pieces()
        if o.kind == "sgd":
            return [op for p, g, n in pieces for op in optimizer.sgd(dev, k, p, g, self.state, n)]
        self.moments = [(dev.buffer(4 * n, conv, f"adamw m [{n}] of {g.label}"),
                         dev.buffer(4 * n, conv, f"adamw v [{n}] of {g.label}")) for _, g, n in pieces]
        floats = sum(optimizer.grad_norm_scratch_floats(n) for _, _, n in pieces)
        scratch = dev.buffer(4 * floats, conv, "train grad norm partials")
        out = optimizer.grad_norm_many(dev, k, [(g, n) for _, g, n in pieces], self.state, scratch, max_norm=o.clip)
        for (p, g, n), (m, v) in zip(pieces, self.moments):
            out += optimizer.adamw(dev, k, p, g, m, v, self.state, n, beta1=o.beta1, beta2=o.beta2, eps=o.eps,
                                   weight_decay=o.weight_decay)
        return out

    async def step(self, batch: list[list[int]], masks: list[list[bool]] | None = None) -> float:
        """One optimizer step on these windows: the loss the gradients were taken at. masks: which tokens of each
        window are predicted and trained (None: every token after the first; `writes`)."""
        loss = await self.gradients(batch, masks)
        self.advance()
        return loss

    def advance(self) -> None:
        """The optimizer's step on the gradients as they are now, at the next step's learning rate."""
        self.steps_done += 1
        t = self.steps_done
        self.device.run(self.update, [(self.state, 0, optimizer.state_bytes(self.optim.lr_at(t), t))])

    def clear_grads(self) -> None:
        for _, g, _ in self.pieces():
            self.device.clear(g)

    def run_pooled(self, ids: list[int], dxn: bytes) -> None:
        """One window of len(ids) <= T tokens forward and back (pooled=True), the loss's gradient at its final norm's
        output `dxn` (f32 [len(ids), n_embd]); its gradients added to the trained parameters'."""
        t, s = len(ids), self.engine.scratch
        if not 1 <= t <= self.T:
            raise TrainError(f"a window of {t} tokens: 1 to {self.T} here")
        self.engine.check_ids(ids, TrainError)
        prepared = self._windows.get(t)
        if prepared is None:
            prepared = self._windows[t] = self.device.prepare(ops.dispatches(self.window_ops, t))
        self.device.run(prepared, [(s.step, 0, ops.step_bytes(0, t, self.engine.n_ctx)),
                                   (s.ids, 0, struct.pack(f"<{t}I", *ids)), (self.ts.dxn, 0, dxn)])

    async def adapter_bytes(self, name: str = "llm-lab LoRA") -> bytes:
        """The adapter as it is now, as a llama.cpp adapter GGUF (`adapter_bytes` below)."""
        if self.full:
            raise TrainError("a full fine-tune has no adapter: write the model (model_bytes)")
        return await adapter_bytes(self.engine, self.lora, name)

    async def model_bytes(self) -> bytes:
        """The model as full fine-tuning left it (`model_bytes` below)."""
        return await model_bytes(self.engine)

    def close(self) -> None:
        """The adapter off the engine and every buffer of training freed (zeroed first: CONVERSATION)."""
        self.engine.set_lora(None)
        self.device.free(self)

    def memory(self) -> dict[str, int]:
        """Bytes of the training's buffers by what they hold (the Training card shows them): the adapter, its
        gradients, the optimizer's state, the activations (the layers' saved inputs and the step's scratch), the
        window's tokens."""
        pieces = self.pieces()
        kinds = {"adapter": [] if self.full else [self.lora.params], "gradients": [g for _, g, _ in pieces],
                 "optimizer": [b for mv in getattr(self, "moments", []) for b in mv] + [self.state],
                 "tokens": [self.ts.targets]}
        named = {id(b) for bufs in kinds.values() for b in bufs}
        kinds["activations"] = [b for b in self.device.owned_by(self) if id(b) not in named]
        return {k: sum(b.size for b in bufs) for k, bufs in kinds.items()}

    @property
    def grads(self) -> gpu.Buffer:
        """The adapter's gradients (LoRA; full fine-tuning's are `pieces`')."""
        return self.ts.grads

    def _check(self, batch: list[list[int]], masks: list[list[bool]] | None) -> None:
        if len(batch) != self.batch or any(len(w) != self.T for w in batch):
            raise TrainError(f"a step takes {self.batch} windows of {self.T} tokens")
        if masks is not None and (len(masks) != len(batch) or any(len(m) != self.T for m in masks)):
            raise TrainError(f"a step's masks: one of {self.T} flags for each of its {self.batch} windows")
        for w in batch:
            self.engine.check_ids(w, TrainError)

    async def gradients(self, batch: list[list[int]], masks: list[list[bool]] | None = None) -> float:
        """The step's loss at the adapter as it is, its gradients left in `grads` (cleared first)."""
        self._check(batch, masks)
        self.clear_grads()
        return await self._run(self.window, batch, masks)

    async def loss(self, batch: list[list[int]], masks: list[list[bool]] | None = None) -> float:
        """The loss of these windows at the adapter as it is (held-out windows): no gradient, nothing changed."""
        self._check(batch, masks)
        return await self._run(self.scoring, batch, masks)

    def targets(self, w: list[int], mask: list[bool] | None = None) -> list[int]:
        """Position t's target: token t + 1 where it is trained (mask[t + 1]; without a mask, every one), else
        NO_TARGET (the last position's: it predicts nothing in the window)."""
        none = backward_head.NO_TARGET
        if mask is None:
            return w[1:] + [none]
        return [w[t + 1] if mask[t + 1] else none for t in range(len(w) - 1)] + [none]

    def writes(self, w: list[int], mask: list[bool] | None = None) -> list[tuple]:
        """The host's writes of a window's pass: the step, its ids and their targets."""
        s, T = self.engine.scratch, self.T
        return [(s.step, 0, ops.step_bytes(0, T, self.engine.n_ctx)), (s.ids, 0, struct.pack(f"<{T}I", *w)),
                (self.ts.targets, 0, struct.pack(f"<{T}I", *self.targets(w, mask)))]

    async def _run(self, prepared, batch: list[list[int]], masks: list[list[bool]] | None = None) -> float:
        dev, none = self.device, backward_head.NO_TARGET
        targets = [self.targets(w, None if masks is None else masks[j]) for j, w in enumerate(batch)]
        n = sum(t != none for ts in targets for t in ts)     # the step's divisor: every window's targets
        if n == 0:
            raise TrainError("no token of the step's windows is trained: each needs at least one (a mask's answer)")
        for j, w in enumerate(batch):
            writes = self.writes(w, None if masks is None else masks[j])
            if j == 0:
                writes.append(backward_head.rows_total_write(self.loss_params, n))
            # the window's summed -log p (ce.loss: mean, count, 1 / N, sum) kept before the next window overwrites it
            dev.run(prepared, writes, [(self.ce.loss, 12, self.losses, 4 * j, 4)])
        raw = await dev.read(self.losses, 0, 4 * self.batch)
        return sum(struct.unpack(f"<{self.batch}f", raw)) / n
