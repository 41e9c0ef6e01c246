"""Training a LoRA adapter on a loaded engine (issue #43): the data's windows, a step's gradients over its windows,
the optimizer, the losses.

    windows(tokens, T)                 the text's tokens cut into windows of T at stride T (a last partial one dropped)
    batch_of(wins, s, B)               step s's B windows, in order from window s * B, wrapping
    Trainer(engine, ...)               an adapter on the engine (engine.set_lora) and the step's plan
      await .gradients(batch)          the loss at the adapter as it is, its gradients left in `grads`
      await .step(batch)               gradients, then the optimizer: returns the loss the gradients were taken at

The loss of a step: the mean over its windows and positions t = 0 .. T-2 of -log p(w[t+1] | w[..t]). Each window
runs as one compute pass (lab.engine.backward.Backward: forward, loss, backward), the gradients adding up across the
step's windows. Every buffer is kind CONVERSATION (the text's activations, the adapter, its gradients and optimizer
state): Forget wipes them.
"""

from __future__ import annotations

import struct

from lab import gpu, ops
from lab.engine.backward import Backward, TrainError, TrainScratch, untrainable
from lab.engine.blocks import qkv_width
from lab.engine.lora import DEFAULT_TARGETS, Lora, choose
from lab.ops import backward_head


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


class Trainer:
    """A LoRA adapter of `rank` (alpha, targets: the kinds of projection, lab.engine.lora) trained on `engine` with
    windows of T tokens, `batch` windows a step. The engine must have an f32 KV cache and steps of at least T rows."""

    def __init__(self, engine, *, T: int, batch: int = 1, rank: int = 8, alpha: float = 16.0,
                 targets=DEFAULT_TARGETS, seed: int = 0) -> None:
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
        self.engine, self.device, self.T, self.batch = engine, dev, T, batch
        self.rows_total = batch * (T - 1)
        with dev.owning(self):
            try:
                self.lora = Lora(dev, choose({t.name: t for t in engine.header.tensors}, cfg.n_layer, targets, rank), alpha,
                                 engine.max_batch)
                dev.write(self.lora.params, self.lora.initial(seed))
                width = max(qkv_width(cfg, il) for il in range(cfg.n_layer))
                self.ts = TrainScratch.alloc(dev, cfg, engine.weights, self.lora, T, width)
                self.ce = backward_head.head_ce(dev, engine.weights.head, T, cap=cfg.final_softcap)
                self.losses = dev.buffer(4 * batch, gpu.CONVERSATION, f"train window losses [{batch}]")
                engine.set_lora(self.lora)
                self.window = dev.prepare(ops.dispatches(Backward(engine, self.ts, self.ce, self.rows_total).ops(), T))
            except BaseException:
                engine.set_lora(None)
                dev.free(self)
                raise

    def close(self) -> None:
        """The adapter off the engine and every buffer of training freed (zeroed first: CONVERSATION)."""
        self.engine.set_lora(None)
        self.device.free(self)

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
        dev, s, T = self.device, self.engine.scratch, self.T
        dev.clear(self.ts.grads)
        for j, w in enumerate(batch):
            targets = w[1:] + [self.engine.cfg.n_vocab]        # the last position predicts nothing in the window
            writes = [(s.step, 0, ops.step_bytes(0, T, self.engine.n_ctx)),
                      (s.ids, 0, struct.pack(f"<{T}I", *w)), (self.ts.targets, 0, struct.pack(f"<{T}I", *targets))]
            # the window's summed -log p (ce.loss: mean, count, 1 / N, sum) kept before the next window overwrites it
            dev.run(self.window, writes, [(self.ce.loss, 12, self.losses, 4 * j, 4)])
        raw = await dev.read(self.losses, 0, 4 * self.batch)
        return sum(struct.unpack(f"<{self.batch}f", raw)) / self.rows_total
