"""A conversation with one loaded engine: reuse of what the engine keeps across turns, the generation loop, timings.

The reuse rule, here and nowhere else (`Session._reuse`): a turn reuses the longest prefix of its prompt that the
session has already run (`cached`), at least one prompt token left to run. A KV cache can be cut to any such prefix.
A conv state (lfm2) cannot: it holds only the inputs of the latest positions (Engine.can_resume), so a turn that
extends the conversation (or steps back within the ring the engine keeps, as after greedy steps run past the turn's
end) reuses it, and anything else (an edit further back, a new chat) runs the whole prompt from position 0. A
recurrent state (qwen35) cannot step back at all: the greedy blocks ask the engine for a snapshot after their last
step, and a turn resumes from the latest snapshot at or before the cached prefix (Engine.resume_point), running the
few tokens after it again.
`Result.reused` says how many prompt tokens were not run again.

What it does not know: how the prompt was made (lab.text.chat renders turns into ids) or where the text
goes (callers pass `on_token`). It is the same code natively and in the browser's worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lab.engine.engine import Engine, EngineError
from lab.engine.sampler import Sampler
from lab.engine.scratch import AHEAD
from lab.ops.sample import NONE
from lab.settings import Settings

FAST_STEP_S = 0.02      # greedy steps quicker than this run AHEAD at a time (below: one, for streaming)


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest run of ids `a` and `b` share from their start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class GreedyAhead:
    """The greedy decode steps of one turn, submitted ahead of their read-back.

    Greedy steps need nothing from the CPU (each argmax feeds the next step on the GPU), so once a step is known to be
    quick, AHEAD of them are submitted before one read-back: the CPU encodes while the GPU runs, and the read's round
    trip is paid once. And the block after is queued before that read is awaited, so the GPU never waits for the
    round trip or the next block's encoding (the read is ordered before it: Device.read). Steps past an
    end-of-generation id, a stop or the length are wasted work only: their K/V lie beyond the session's `cached` and
    are overwritten later."""

    def __init__(self, engine: Engine, edit=None) -> None:
        self.engine = engine
        self.edit = edit            # an experiment's step editor (Engine.step), or None
        self.ids: list[int] = []    # greedy ids read back, not yet handed out
        self.block = 1              # steps a read-back covers: AHEAD once steps are quick, else 1 (for streaming)
        self.queued = 0             # steps submitted whose ids are not read yet

    async def next(self, pos: int, wanted: int) -> int:
        """The id the greedy step at `pos` makes; `wanted`: how many more ids the turn may take, this one included
        (no step is submitted past it)."""
        if not self.ids:
            tb = time.perf_counter()
            n = self.queued or min(self.block, wanted)
            if not self.queued:
                self._submit(n, pos)
            read = self.engine.kept_ids(n)
            try:
                self.queued = min(self.block, wanted - n) if self.block == AHEAD else 0
                self._submit(self.queued, pos + n)
            finally:            # a read asked is always finished: its buffer stays mapped until then
                self.ids = await read
            self.block = AHEAD if (time.perf_counter() - tb) / n < FAST_STEP_S else 1
        return self.ids.pop(0)

    def _submit(self, n: int, first: int) -> None:
        # the states after a block's last step are kept aside (Engine.step snapshot=): the turn may end inside the
        # block read next, and the steps queued past its end leave the recurrent states beyond the cached tokens
        for i in range(n):
            self.engine.step(None, first + i, keep=i, edit=self.edit, snapshot=i == n - 1)


@dataclass
class Result:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)       # generated ids (an end-of-generation id is not included)
    text: str = ""
    reused: int = 0             # prompt tokens not run again: their K/V (and the conv/recurrent states after them) were kept
    prefilled: int = 0          # prompt tokens run through prefill this turn
    ttft_s: float = 0.0         # time to first token
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0       # one-token steps run (the first generated token comes from prefill)
    stop: str = ""              # "eog", "length", "stopped"

    @property
    def prefill_tok_s(self) -> float:
        return self.prefilled / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s else 0.0

    def to_dict(self) -> dict:
        return {"prompt_ids": self.prompt_ids, "ids": self.ids, "text": self.text, "reused": self.reused,
                "prefilled": self.prefilled, "ttft_s": round(self.ttft_s, 4),
                "prefill_tok_s": round(self.prefill_tok_s, 2), "decode_tok_s": round(self.decode_tok_s, 2),
                "stop": self.stop}


class Session:
    def __init__(self, engine: Engine, tokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.cached: list[int] = []      # ids whose K/V sit in the cache at positions 0..len-1

    def reset(self) -> None:
        self.cached.clear()      # in place: whoever else holds the list sees it empty too (Forget)

    def cached_prefix(self, ids: list[int]) -> int:
        """How many leading `ids` the KV cache already holds at their positions."""
        return common_prefix(self.cached, ids)

    def _reuse(self, prompt: list[int]) -> int:
        """How many leading prompt tokens this turn does not run again (the module's rule): at least one must run, to
        produce the logits of the next token; and the states (lfm2, qwen35) must hold what the rest reads: the
        latest position at or before that prefix where they do (Engine.resume_point)."""
        return self.engine.resume_point(min(self.cached_prefix(prompt), len(prompt) - 1))

    async def generate(self, prompt: list[int], settings: Settings, max_new: int, on_token=None,
                       should_stop=None, edit=None) -> Result:
        """Run the prompt (reusing the cached prefix) and generate up to max_new tokens.
        on_token(id, text_piece) is called for every generated token (an awaitable it returns is awaited before the
        next step); should_stop() is polled between steps. edit: every step of this turn runs with an experiment's
        ops in place (Engine.step; steering), the cache's account kept as for any turn."""
        if not prompt:
            raise ValueError("an empty prompt: nothing to continue from")
        eng = self.engine
        if len(prompt) + max_new > eng.n_ctx:
            max_new = max(0, eng.n_ctx - len(prompt))
        if len(prompt) > eng.n_ctx:
            raise ValueError(f"the prompt has {len(prompt)} tokens, more than the context of {eng.n_ctx}")
        sampler = Sampler(settings)
        greedy = settings.greedy or settings.temperature == 0
        res = Result(prompt_ids=list(prompt))
        decoder = self.tokenizer.stream_decoder() if self.tokenizer else None
        t0 = time.perf_counter()

        # 1. prefill what the cache does not hold yet, in chunks of the engine's batch
        tok = await self._prefill(prompt, res, sampler, greedy, edit)
        res.prefill_s = res.ttft_s = time.perf_counter() - t0

        # 2. decode: feed each token back until an end-of-generation id, the length, or a stop request. Greedy
        # steps run ahead of their read-back (GreedyAhead); a sampled step waits for the CPU's pick.
        t1 = time.perf_counter()
        eog = self.tokenizer.eos_ids if self.tokenizer else frozenset()
        ahead = GreedyAhead(eng, edit) if greedy else None
        while True:
            # 2a. emit the token, or stop before it
            if tok in eog:
                res.stop = "eog"
                break
            res.ids.append(tok)
            piece = decoder.feed(tok) if decoder is not None else ""
            res.text += piece
            if on_token is not None and (more := on_token(tok, piece)) is not None:
                await more           # an awaitable: reads between steps (the worker's KV panel reads the cache)
            if len(res.ids) >= max_new:
                res.stop = "length"
                break
            if should_stop is not None and should_stop():
                res.stop = "stopped"
                break
            # 2b. the next token, from a step of this one at the cache's end
            pos = len(self.cached)
            if ahead is not None:
                tok = await ahead.next(pos, max_new - len(res.ids))
            else:
                tok = await self._sampled_next(tok, pos, sampler, edit)
            if tok == NONE:
                await self._nonfinite([res.ids[-1]], pos)
            self.cached.append(res.ids[-1])
            res.decode_steps += 1
        if decoder is not None:
            res.text += decoder.flush()
        res.decode_s = time.perf_counter() - t1
        return res

    async def _prefill(self, prompt: list[int], res: Result, sampler: Sampler, greedy: bool, edit=None) -> int:
        """Run the prompt's ids past the cached prefix, in steps of the engine's batch; returns the first new token."""
        eng = self.engine
        res.reused = self._reuse(prompt)
        self.cached = self.cached[:res.reused]
        pos = res.reused
        while pos < len(prompt):
            chunk = prompt[pos:pos + eng.max_batch]
            eng.step(chunk, pos, sampled=not greedy, edit=edit, snapshot=pos + len(chunk) == len(prompt))
            pos += len(chunk)
            self.cached += chunk
        res.prefilled = len(prompt) - res.reused
        tok = await self._next(sampler, greedy)
        if tok == NONE:
            await self._nonfinite(chunk, pos - len(chunk))
        return tok

    async def _sampled_next(self, tok: int, pos: int, sampler: Sampler, edit=None) -> int:
        """A sampled decode step: `tok` at `pos` through the plan with the top-k tail, then the CPU's pick."""
        self.engine.step([tok], pos, sampled=True, edit=edit)
        return sampler.pick(await self.engine.top_k())

    async def _nonfinite(self, ids: list[int], pos: int) -> None:
        """No logit was finite: the GPU's argmax and top-k skip NaN and infinities, so no token id comes of them.
        Stop with the first tensor where the values broke, found by replaying the step (ids at pos) traced."""
        self.cached = []             # the cache holds the broken values: the next turn starts afresh
        where = await self.engine.first_nonfinite(ids, pos)
        raise EngineError(f"the model's logits at position {pos + len(ids) - 1} are all NaN or infinite, so no token "
                          f"can be chosen"
                          + (f"; the first non-finite values appear in {where}" if where else "")
                          + ": the file's weights or its metadata (norm epsilon, RoPE base) are broken")

    async def _next(self, sampler: Sampler, greedy: bool) -> int:
        if greedy:
            return await self.engine.argmax()
        return sampler.pick(await self.engine.top_k())
