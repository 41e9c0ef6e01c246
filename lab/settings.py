"""What a user chooses, and the defaults and bounds of each: the context, a turn's length, the sampler, the
perplexity window, the Training card's run, the Retrieval card's tuning of its embedder, the Tokenizer card's vocabulary
and text. One home for each of these numbers: the engine, the worker, the CLI and the page (through the server's
template) read them here.

What it does not know: the model or the GPU (a model's own context bounds the context: `context_for`). Standard
library only: the asset server imports it for the page's defaults without importing the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

DEFAULT_CTX = 2048      # tokens of KV cache made at load: 2 x 30 x 3 x 64 x 4 B x 2048 = 94 MB for SmolLM2
MIN_CTX = 2             # the smallest context the engine makes (one prompt token and one generated)
MAX_NEW = 256           # tokens a turn may generate when the caller does not say (the page's default)
PERPLEXITY_CTX = 128    # perplexity window in tokens (llama-perplexity's -c) when the caller does not say
PERPLEXITY_MIN_CTX = 4  # the smallest window: its second half, the scored part, holds at least two tokens
PERPLEXITY_MAX_CTX = 4096   # the page's and CLI's upper bound on a window (the engine's context bounds it too)
MAX_CANDIDATES = 64     # tokens the GPU's top-k reads back for sampling: the sampler sees no others


def context_for(n_ctx_train: int, requested: int | None = None) -> int:
    """The context a load makes: the one asked for (by default DEFAULT_CTX), at most the model's own
    (`n_ctx_train`), at least MIN_CTX."""
    return max(MIN_CTX, min(DEFAULT_CTX if requested is None else requested, n_ctx_train))


@dataclass(frozen=True)
class Settings:
    """The sampler's settings (lab.engine.sampler); the page's inputs and the CLI's flags default to these."""
    greedy: bool = True
    temperature: float = 0.8
    top_k: int = 40         # 0: off (bounded by MAX_CANDIDATES)
    top_p: float = 0.95     # 1: off
    min_p: float = 0.05     # 0: off
    seed: int = 0

    def check(self) -> Settings:
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be >= 0, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], not {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min-p must be in [0, 1), not {self.min_p}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0, not {self.top_k}")
        return self

    @classmethod
    def from_dict(cls, d: dict) -> Settings:
        """Settings from a message or form: missing fields take the defaults above (their only home), each value is
        converted to its field's type, and the whole is checked."""
        kw = {}
        for f in fields(cls):
            if d.get(f.name) is not None:
                try:
                    kw[f.name] = {"bool": bool, "int": int, "float": float}[f.type](d[f.name])
                except (TypeError, ValueError):
                    raise ValueError(f"{f.name} must be a {f.type}, not {d[f.name]!r}") from None
        return cls(**kw).check()

    @property
    def candidates(self) -> int:
        return min(self.top_k or MAX_CANDIDATES, MAX_CANDIDATES)


@dataclass(frozen=True)
class Training:
    """The Training card's defaults and bounds (a LoRA adapter trained in the tab: lab/worker/training.py checks them,
    the page's inputs start at them through the template). The context is bounded by the engine's step too (its
    max_batch rows: 64 on SwiftShader), which only the loaded model knows."""
    rank: int = 8
    steps: int = 30
    lr: float = 1e-3
    ctx: int = 32           # tokens a window (T)
    batch: int = 1          # windows a step
    optimizer: str = "adamw"
    held_out: float = 0.1   # the share of the text's windows (its last ones, at least one) held out of training
    max_new: int = 32       # tokens of the with / without replies
    preset: str = "nano"    # a model from scratch: its shape (SCRATCH_PRESETS) ...
    scratch_lr: float = 3e-3    # ... and its learning rate (every weight moves from a random start, not a LoRA's)
    full_lr: float = 1e-4       # every weight of a loaded model (full fine-tuning): AdamW moves each weight by about
                                # lr a step, all of them at once, where a LoRA moves a small pair beside them
    max_rank: int = 64
    max_steps: int = 10_000
    max_batch: int = 16
    max_ctx: int = 4096


TRAINING = Training()


@dataclass(frozen=True)
class EmbedderTuning:
    """The Retrieval card's "Tune on these files": its embedder trained contrastively on the indexed files
    (lab/instruments/contrastive.py; lab/worker/embedder.py checks these, the page's inputs start at them through the
    template). Its windows are the index's, bounded by the engine's step (its max_batch rows), which only the loaded
    model knows; its recall is measured on the card's own number of queries. `lab train-embedder` keeps its flags'
    defaults, sized for a GPU (docs/retrieval.md)."""
    stages: tuple[str, ...] = ("crops", "query")    # the pairs of each stage, in the order "both" runs them: two
                                                    # crops of one window, then a short query inside its window
    stage: str = "both"         # the card's choice: one of `stages`, or both in that order on one adapter
    steps: int = 30             # steps a stage
    pairs: int = 8              # pairs a step (each pair's negatives are the others: at least 2)
    rank: int = 8               # the LoRA's rank (alpha twice it), or every weight of an F32 model
    lr: float = 1e-3
    full_lr: float = 1e-4       # every weight (as TRAINING.full_lr: each weight moves by about lr a step)
    max_steps: int = 10_000
    max_pairs: int = 64         # a step's host part (the loss over the pairs' embeddings) is O(pairs^2 n_embd) in
                                # plain Python, in the tab's worker
    max_rank: int = 64


EMBEDDER = EmbedderTuning()


@dataclass(frozen=True)
class TokenizerTraining:
    """The vocabulary a byte-level BPE tokenizer is trained to (lab/text/tokenizer/train.py `check_vocab`: the CLI's
    `lab tokenizer-train --vocab` and the Tokenizer card) and the most text the card trains on
    (lab/worker/tokenizer.py). docs/tokenizer-training.md has the measurements behind each bound."""
    vocab: int = 1024           # the card's starting value
    min_vocab: int = 257        # the 256 byte tokens and the one special token <|endoftext|> (train.py derives the
                                # same from its specials; tests/unit/test_tokenizer_card.py holds the two equal)
    # The largest vocabulary asked for. Merges past what a text holds are never made (training stops when no pair is
    # left): the 1.9 MB of this repository's docs and code hold 16,015 in all, so on prose or code of the card's size
    # this bound is not what ends a run; it refuses a typing slip (an extra zero) before any work.
    max_vocab: int = 65_536
    # The card's text, in UTF-8 bytes. Training and the two bytes-per-token counts run in the tab's one Python
    # thread, and only the merges can be stopped: the word counting and each count are one pass each. At this cap a
    # run took 6.3 to 6.8 s from the click to the result in Pyodide (2.5 to 2.8 s training), each pass that cannot be
    # stopped about 2 s (docs/tokenizer-training.md); a text ten times as long would hold the tab's worker for a
    # minute with Stop unheard for most of it. The CLI reads any size.
    max_bytes: int = 4_000_000


TOKENIZER = TokenizerTraining()


# A model trained from scratch (issue #44 part 2, `lab train --scratch`, the Training card's presets): the shapes
# offered by name, as (layers, width, heads, feed-forward width); the vocabulary is the trained tokenizer's. With a
# vocabulary of 1,024 they hold 0.28M, 3.7M and 14.6M parameters (the reference lab's "nano" held 0.36M, its largest
# run 15.7M); lab.format.untrained counts any.
SCRATCH_PRESETS = {"nano": (4, 64, 4, 192), "4m": (8, 192, 6, 512), "16m": (8, 384, 6, 1024)}
