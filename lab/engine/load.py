"""One load: a header checked once, its config and tokenizer built once.

    cfg, tok = validate(header)    # or ModelError (TokenizerError for the vocabulary) naming key and value

`validate` is what the worker and the CLI call between `lab.format.gguf.read` and the first upload; the worker
then counts the memory budget once (lab.engine.budget.count) and hands it, with the config, to the Engine.

    engine = untrained(device, header, cfg, shape, seed, ...)    # a model from scratch: no file, weights drawn

`untrained` is the one way both `lab train --scratch` (lab/host/loading.py) and the page's Training card
(lab/worker/scratch.py) make the engine of a model that has no weights yet.

What it does not know: the GPU (the budget and the engine check the adapter's limits) or where the bytes come from.
"""

from __future__ import annotations

from typing import NamedTuple

from lab.engine.engine import Engine
from lab.format import untrained as untrained_shape
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


def untrained(device, header, cfg: Config, shape: untrained_shape.Shape, seed: int, **engine_args) -> Engine:
    """The engine of the untrained model `header` describes (lab.format.untrained header_bytes of `shape`), every
    weight drawn from `seed` on the GPU by lab.format.untrained init_rule; engine_args go to the Engine (n_ctx,
    max_batch, weights_kind, counted). Nothing stays allocated when any of it fails."""
    engine = Engine(device, header, cfg, **engine_args)
    try:
        device.run([op.at(1) for op in engine.weights.initialize(
            engine.kernels, seed, lambda name: untrained_shape.init_rule(name, shape))])
    except BaseException:
        engine.close()
        raise
    return engine
