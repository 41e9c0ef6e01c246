"""One load: a header checked once, its config and tokenizer built once.

    cfg, tok = validate(header)    # or ModelError (TokenizerError for the vocabulary) naming key and value

`validate` is what the worker and the CLI call between `lab.format.gguf.read` and the first upload; the worker
then counts the memory budget once (lab.engine.budget.count) and hands it, with the config, to the Engine.

What it does not know: the GPU (the budget and the engine check the adapter's limits) or where the bytes come from.
"""

from __future__ import annotations

from typing import NamedTuple

from lab.format.model import Config, from_gguf
from lab.text.tokenizer import Tokenizer, from_metadata


class Validated(NamedTuple):
    config: Config
    tokenizer: Tokenizer


def validate(header) -> Validated:
    """The config and the tokenizer of a parsed GGUF header, every key checked (lab.format.checks).
    ModelError (TokenizerError for the vocabulary) names the key and value; the header itself was checked by
    lab.format.gguf (GGUFError)."""
    cfg = from_gguf(header)
    return Validated(cfg, from_metadata(header.metadata, n_vocab=cfg.n_vocab))
