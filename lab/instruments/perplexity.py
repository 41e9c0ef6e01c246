"""Perplexity of a text, teacher-forced in windows, by the convention of llama.cpp's `llama-perplexity`
(tools/perplexity/perplexity.cpp, `perplexity()`), so that the two figures can be held to each other:

1. tokens = the text's ids with BOS when the vocabulary adds one (llama.cpp's common_tokenize, add_special);
   at least 2 n_ctx of them, or there is nothing to score.
2. chunk i is tokens[i n_ctx : (i + 1) n_ctx], for i < len(tokens) // n_ctx (a tail shorter than n_ctx is dropped);
   each runs from an empty cache at positions 0 .. n_ctx-1, its first token replaced by BOS when the vocabulary
   adds BOS (every window starts as a document does; the first chunk's already is BOS).
3. only the second half is scored: position q for first = n_ctx // 2 <= q < n_ctx - 1 predicts the window's token
   q + 1, with nll = logsumexp(logits_q) - logits_q[token q + 1]; n_ctx - 1 - first tokens a chunk.
4. ppl = exp(mean nll) over every scored token so far (the running value printed after each chunk); the final
   estimate's +/- is ppl * sqrt((mean nll^2 - mean nll^2) / (count - 1)), as llama.cpp prints it.

The GPU does the scoring: each step runs the engine's own plan (prefill, or decode for a lone token) up to the final
norm; a step holding scored positions then projects its rows through the output head into a buffer of its own and a
kernel (wgsl/perplexity.wgsl) reduces each row to one float, its nll. A chunk reads back n_ctx floats, never a row of
logits. Steps wholly before `first` skip the head: their logits are never looked at.

What it does not know: sessions and pages. It overwrites the engine's KV cache from position 0, so a caller with a
session must drop whatever it believed the cache held (the page's adapter, lab/worker/perplexity.py, does), and it
polls `should_stop` between steps, so a caller can cancel. Its buffers are kind CONVERSATION (they hold the text's
ids and scores), owned by the `Perplexity` object, freed by `close`.
"""

from __future__ import annotations

import math
import struct
import time
from array import array
from dataclasses import dataclass, field

from lab import gpu, ops
from lab.gpu.shaders import subgroup_consts
from lab.ops import elementwise, matmul
from lab.settings import PERPLEXITY_MIN_CTX

WG = 256
_PARAMS = struct.Struct("<4I")      # Params { n_vocab, first, last, _ } in wgsl/perplexity.wgsl


class PerplexityError(ValueError):
    """A text or a window the run cannot score (too short, a window past the engine's context)."""


# -- the convention (pure: no GPU) --------------------------------------------------------------------------
def tokens_of(tokenizer, text: str) -> list[int]:
    """The ids llama-perplexity scores: the text with BOS when the vocabulary adds one, no special-token parsing."""
    return tokenizer.encode(text, add_bos=tokenizer.add_bos)


def first_scored(n_ctx: int) -> int:
    """The first position of a window whose next-token prediction counts (llama.cpp: `first = n_ctx/2`)."""
    return n_ctx // 2


def windows(tokens: list[int], n_ctx: int, bos_id: int | None, add_bos: bool,
            n_chunks: int | None = None) -> list[list[int]]:
    """The chunks llama-perplexity runs: consecutive n_ctx-token slices, each starting with BOS when add_bos."""
    if n_ctx < PERPLEXITY_MIN_CTX:
        raise PerplexityError(f"a window of {n_ctx} tokens: at least {PERPLEXITY_MIN_CTX}")
    if len(tokens) < 2 * n_ctx:
        raise PerplexityError(f"the text has {len(tokens)} tokens; a context of {n_ctx} needs at least {2 * n_ctx} "
                              f"(two windows): paste more text or choose a smaller context")
    n = len(tokens) // n_ctx
    if n_chunks is not None and n_chunks > 0:
        n = min(n, n_chunks)
    out = []
    for i in range(n):
        w = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if add_bos and bos_id is not None:
            w[0] = bos_id
        out.append(w)
    return out


@dataclass
class Estimate:
    """Running sums of the scored nll, in double precision as llama.cpp keeps them."""
    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    def add(self, values) -> None:
        for v in values:
            self.nll += v
            self.nll2 += v * v
            self.count += 1

    @property
    def ppl(self) -> float | None:
        return math.exp(self.nll / self.count) if self.count else None

    @property
    def ppl_err(self) -> float | None:
        """llama.cpp's +/-: ppl times the standard error of the mean nll (None with fewer than two tokens)."""
        if self.count < 2:
            return None
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        return math.sqrt(var / (self.count - 1)) * self.ppl if var > 0 else None


@dataclass
class Result:
    n_ctx: int
    n_tokens: int                   # tokens of the text (BOS included when added)
    chunks: int                     # chunks scored
    chunks_total: int               # chunks the text holds at this context (or the cap asked for)
    ppl: float | None               # over every scored token (None if no chunk finished)
    ppl_err: float | None
    tokens_scored: int
    running: list[float] = field(default_factory=list)   # ppl after each chunk (llama.cpp's "[i]value," line)
    seconds: float = 0.0
    stopped: bool = False           # cancelled before the last chunk

    def to_dict(self) -> dict:
        return {"n_ctx": self.n_ctx, "n_tokens": self.n_tokens, "chunks": self.chunks,
                "chunks_total": self.chunks_total, "ppl": self.ppl, "ppl_err": self.ppl_err,
                "tokens_scored": self.tokens_scored, "running": self.running, "seconds": round(self.seconds, 3),
                "stopped": self.stopped}


# -- the GPU run ---------------------------------------------------------------------------------------------
class Perplexity:
    """Scoring plans for one engine, built on first use; `close` frees (and, being CONVERSATION, zeroes) every buffer
    it made."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.device = engine.device
        cfg = engine.cfg
        limit = self.device.info.limits["max_storage_buffer_binding_size"]
        # rows of logits one step projects: the engine's batch, fewer if a [rows, n_vocab] buffer would pass a binding
        self.rows = min(engine.max_batch, limit // (4 * cfg.n_vocab))
        if self.rows < 1:
            raise gpu.GpuError(f"one row of {cfg.n_vocab:,} logits exceeds this GPU's storage binding limit")
        self._plans: dict[tuple[bool, bool], list[ops.Op]] | None = None

    def close(self) -> None:
        self.device.free(self)
        self._plans = None

    @property
    def buffers(self) -> list[gpu.Buffer]:
        return self.device.owned_by(self)

    def _build(self) -> None:
        eng, dev, cfg = self.engine, self.device, self.engine.cfg
        conv, V, s = gpu.CONVERSATION, cfg.n_vocab, eng.scratch
        with dev.owning(self):
            self.logits = dev.buffer(4 * self.rows * V, conv, f"ppl.logits [{self.rows}, n_vocab]")
            self.targets = dev.buffer(4 * eng.n_ctx, conv, "ppl.window ids [n_ctx] u32")
            self.nll = dev.buffer(4 * eng.n_ctx, conv, "ppl.nll by position [n_ctx]")
            self.params = dev.uniform(bytes(_PARAMS.size), "ppl.params {n_vocab, first, last}", kind=conv)
            k = eng.kernels.get("perplexity", "nll_rows", WG=WG, **subgroup_consts(dev))
            score = [ops.Op(k, dev.bind(k, [self.logits, self.targets, self.nll, s.step, self.params], "ppl.nll"),
                            lambda t: (max(1, t), 1, 1))]
            head = matmul.matmul(dev, eng.kernels, eng.weights.head, s.xn, self.logits, s.step, max_tokens=self.rows)
            if cfg.final_softcap:     # gemma2: the logits the model predicts with are soft-capped, as the plans do
                head += elementwise.softcap(dev, eng.kernels, self.logits, s.step, V, cfg.final_softcap)
        self._plans = {}
        for batched in (True, False):
            # the engine's own plan up to its final norm (xn holds every row's normed residual), found by the trace
            # name the plans record; what follows there (the head on one row, the sampler's tail) is not run
            plan = eng.plan_for(batched)
            body = plan.ops[:plan.at("result_norm") + 1]
            self._plans[batched, False] = body
            self._plans[batched, True] = body + head + score

    async def run(self, tokens: list[int], n_ctx: int, *, bos_id: int | None, add_bos: bool,
                  n_chunks: int | None = None, on_chunk=None, should_stop=None) -> Result:
        """Score `tokens` (from `tokens_of`) in windows of n_ctx. on_chunk(i, n, running_ppl) before the first chunk
        (i = 0, ppl None) and after each;
        should_stop() is polled after every step: a True stops the run, which returns the chunks finished."""
        eng, dev = self.engine, self.device
        if n_ctx > eng.n_ctx:
            raise PerplexityError(f"a window of {n_ctx} tokens is past the context of {eng.n_ctx} made at load")
        chunks = windows(tokens, n_ctx, bos_id, add_bos, n_chunks)
        eng.check_ids(tokens, PerplexityError)
        if self._plans is None:
            self._build()
            await dev.flush_errors()
        first = first_scored(n_ctx)
        est = Estimate()
        res = Result(n_ctx, len(tokens), 0, len(chunks), None, None, 0)
        t0 = time.perf_counter()
        dev.write(self.params, _PARAMS.pack(eng.cfg.n_vocab, first, n_ctx - 1, 0))
        if on_chunk is not None:
            on_chunk(0, len(chunks), None)
        for i, window in enumerate(chunks):
            writes = [(self.targets, 0, struct.pack(f"<{n_ctx}I", *window))]
            # steps of at most `rows` tokens from position 0: each writes its K/V over whatever the cache held, and
            # attends only to positions 0 .. its own, all written by this chunk (llama.cpp clears its cache instead)
            for a in range(0, n_ctx, self.rows):
                b = min(a + self.rows, n_ctx)
                t = b - a
                plan = self._plans[t > 1, b > first]
                dev.run(ops.dispatches(plan, t), writes + eng.step_writes(window[a:b], a, t))
                writes = []
                if should_stop is not None:
                    # a small read lets the page's stop message in (the worker's JS runs while Python awaits)
                    await dev.read(self.params, 0, 4)
                    if should_stop():
                        res.stopped = True
                        break
            if res.stopped:
                break
            raw = await dev.read(self.nll, 0, 4 * n_ctx)
            est.add(array("f", raw)[first:n_ctx - 1])
            res.chunks += 1
            res.running.append(est.ppl)
            if on_chunk is not None:
                on_chunk(i + 1, len(chunks), est.ppl)
        res.ppl, res.ppl_err, res.tokens_scored = est.ppl, est.ppl_err, est.count
        res.seconds = time.perf_counter() - t0
        return res
