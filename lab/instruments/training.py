"""Training a LoRA adapter on a loaded engine (issue #43): the data's windows, a step's gradients over its windows,
the optimizer, the losses.

    windows(tokens, T)                 the text's tokens cut into windows of T at stride T (a last partial one dropped)
    batch_of(wins, s, B)               step s's B windows, in order from window s * B, wrapping
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
from lab.engine.backward import Backward, TrainError, TrainScratch, untrainable
from lab.engine.blocks import qkv_width
from lab.engine.lora import DEFAULT_TARGETS, Lora, choose
from lab.format.adapter import write_adapter
from lab.ops import backward_head, optimizer

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


def needs(engine, T: int, rank: int, targets, batch: int = 1) -> list[tuple[str, int]]:
    """(label, bytes) of every buffer a Trainer of these arguments makes, counted by making them on a device that
    only records sizes (lab.engine.budget.counting): the same allocation code, nothing allocated."""
    cfg, dev = engine.cfg, budget.counting(engine.device.info.limits)
    table = {t.name: t for t in engine.header.tensors}
    lora = Lora(dev, choose(table, cfg.n_layer, targets, rank), 1.0, engine.max_batch)
    width = max(qkv_width(cfg, il) for il in range(cfg.n_layer))
    TrainScratch.alloc(dev, cfg, engine.weights, lora, T, width)
    n = lora.n_params
    for label in ("adamw m", "adamw v", "train window losses"):
        dev.buffer(4 * (n if label.startswith("adamw") else batch), gpu.CONVERSATION, label)
    head = backward_head.head_layout(engine.weights.head, T)
    return [(b.label, b.size) for b in dev.buffers] + [(f"head {k}", 4 * v) for k, v in head.floats.items()]


def check_fits(engine, T: int, rank: int, targets, batch: int = 1) -> None:
    """Refuse (TrainError) a run with a buffer past this GPU's limits, before anything is made, saying the largest
    rank and context that fit."""
    limits = engine.device.info.limits
    wrong = budget.problems(limits, needs(engine, T, rank, targets, batch))
    if not wrong:
        return
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


class Trainer:
    """A LoRA adapter of `rank` (alpha, targets: the kinds of projection, lab.engine.lora) trained on `engine` with
    windows of T tokens, `batch` windows a step. The engine must have an f32 KV cache and steps of at least T rows.
    `keep`: the forward's rows kept for the backward (lab.engine.backward KEEP_BYTES decides by default; tests force
    both ways)."""

    def __init__(self, engine, *, T: int, batch: int = 1, rank: int = 8, alpha: float = 16.0,
                 targets=DEFAULT_TARGETS, seed: int = 0, optim: Optim | None = None, keep: bool | None = None) -> None:
        cfg, dev = engine.cfg, engine.device
        reason = untrainable(cfg)
        if reason:
            raise TrainError(reason)
        if engine.kv_type != "f32":
            raise TrainError(f"training reads the keys and values in f32: this engine's KV cache is {engine.kv_type}")
        if not 2 <= T <= min(engine.max_batch, engine.n_ctx):
            raise TrainError(f"a context of {T} tokens: from 2 to {min(engine.max_batch, engine.n_ctx)} on this engine")
        if batch < 1:
            raise TrainError(f"a batch of {batch} windows: at least 1")
        check_fits(engine, T, rank, targets, batch)
        self.engine, self.device, self.T, self.batch = engine, dev, T, batch
        self.rows_total = batch * (T - 1)
        self.optim = optim or Optim()
        self.steps_done = 0
        with dev.owning(self):
            try:
                table = {t.name: t for t in engine.header.tensors}
                self.lora = Lora(dev, choose(table, cfg.n_layer, targets, rank), alpha, engine.max_batch)
                dev.write(self.lora.params, self.lora.initial(seed))
                width = max(qkv_width(cfg, il) for il in range(cfg.n_layer))
                self.ts = TrainScratch.alloc(dev, cfg, engine.weights, self.lora, T, width, keep=keep)
                self.ce = backward_head.head_ce(dev, engine.weights.head, T, cap=cfg.final_softcap)
                self.losses = dev.buffer(4 * batch, gpu.CONVERSATION, f"train window losses [{batch}]")
                engine.set_lora(self.lora)
                plans = lambda: Backward(engine, self.ts, self.ce, self.rows_total)     # noqa: E731
                self.window_ops = plans().step_ops()       # kept for profiles (lab train --profile)
                self.window = dev.prepare(ops.dispatches(self.window_ops, T))
                self.scoring = dev.prepare(ops.dispatches(plans().loss_ops(), T))
                self.update = dev.prepare(ops.dispatches(self._update_ops(), 1))
            except BaseException:
                engine.set_lora(None)
                dev.free(self)
                raise

    def _update_ops(self) -> list[ops.Op]:
        """The optimizer's pass over the adapter's parameters (state: lr and t written each step)."""
        dev, k, o, n = self.device, self.engine.kernels, self.optim, self.lora.n_params
        conv = gpu.CONVERSATION
        self.state = optimizer.make_state(dev, "train optimizer state [lr, t, sumsq, clip]")
        if o.kind == "sgd":
            return optimizer.sgd(dev, k, self.lora.params, self.ts.grads, self.state, n)
        self.m = dev.buffer(4 * n, conv, f"adamw m [{n}]")
        self.v = dev.buffer(4 * n, conv, f"adamw v [{n}]")
        scratch = dev.buffer(4 * optimizer.grad_norm_scratch_floats(n), conv, "train grad norm partials")
        return (optimizer.grad_norm(dev, k, self.ts.grads, n, self.state, scratch, max_norm=o.clip)
                + optimizer.adamw(dev, k, self.lora.params, self.ts.grads, self.m, self.v, self.state, n,
                                  beta1=o.beta1, beta2=o.beta2, eps=o.eps, weight_decay=o.weight_decay))

    async def step(self, batch: list[list[int]]) -> float:
        """One optimizer step on these windows: the loss the gradients were taken at."""
        loss = await self.gradients(batch)
        self.steps_done += 1
        t = self.steps_done
        self.device.run(self.update, [(self.state, 0, optimizer.state_bytes(self.optim.lr_at(t), t))])
        return loss

    async def adapter_bytes(self, name: str = "llm-lab LoRA") -> bytes:
        """The adapter as it is now, as a llama.cpp adapter GGUF (`adapter_bytes` below)."""
        return await adapter_bytes(self.engine, self.lora, name)

    def close(self) -> None:
        """The adapter off the engine and every buffer of training freed (zeroed first: CONVERSATION)."""
        self.engine.set_lora(None)
        self.device.free(self)

    def memory(self) -> dict[str, int]:
        """Bytes of the training's buffers by what they hold (the Training card shows them): the adapter, its
        gradients, the optimizer's state, the activations (the layers' saved inputs and the step's scratch), the
        window's tokens."""
        kinds = {"adapter": [self.lora.params], "gradients": [self.ts.grads],
                 "optimizer": [b for b in (getattr(self, "m", None), getattr(self, "v", None), self.state) if b],
                 "tokens": [self.ts.targets]}
        named = {id(b) for bufs in kinds.values() for b in bufs}
        kinds["activations"] = [b for b in self.device.owned_by(self) if id(b) not in named]
        return {k: sum(b.size for b in bufs) for k, bufs in kinds.items()}

    @property
    def grads(self) -> gpu.Buffer:
        return self.ts.grads

    def _check(self, batch: list[list[int]]) -> None:
        if len(batch) != self.batch or any(len(w) != self.T for w in batch):
            raise TrainError(f"a step takes {self.batch} windows of {self.T} tokens")
        for w in batch:
            self.engine.check_ids(w, TrainError)

    async def gradients(self, batch: list[list[int]]) -> float:
        """The step's loss at the adapter as it is, its gradients left in `grads` (cleared first)."""
        self._check(batch)
        self.device.clear(self.ts.grads)
        return await self._run(self.window, batch)

    async def loss(self, batch: list[list[int]]) -> float:
        """The loss of these windows at the adapter as it is (held-out windows): no gradient, nothing changed."""
        self._check(batch)
        return await self._run(self.scoring, batch)

    def writes(self, w: list[int]) -> list[tuple]:
        """The host's writes of a window's pass: the step, its ids and their targets."""
        s, T = self.engine.scratch, self.T
        targets = w[1:] + [self.engine.cfg.n_vocab]            # the last position predicts nothing in the window
        return [(s.step, 0, ops.step_bytes(0, T, self.engine.n_ctx)), (s.ids, 0, struct.pack(f"<{T}I", *w)),
                (self.ts.targets, 0, struct.pack(f"<{T}I", *targets))]

    async def _run(self, prepared, batch: list[list[int]]) -> float:
        dev = self.device
        for j, w in enumerate(batch):
            # the window's summed -log p (ce.loss: mean, count, 1 / N, sum) kept before the next window overwrites it
            dev.run(prepared, self.writes(w), [(self.ce.loss, 12, self.losses, 4 * j, 4)])
        raw = await dev.read(self.losses, 0, 4 * self.batch)
        return sum(struct.unpack(f"<{self.batch}f", raw)) / self.rows_total
