"""The `lab` command: serve the page, and native tools for the same engine the page runs."""

from __future__ import annotations

import argparse
import sys

from lab.host.cli import bench, embedder, experiments, grounded, parsers, retrieval, run, tokenizer, training

# Each subcommand in `lab --help`'s order: the function that adds its parser (lab/host/cli/parsers.py) and the
# handler that takes the parsed flags and returns the exit status. The modules import what a handler needs inside
# it, so that `lab --help` stays fast.
COMMANDS = {
    "serve": (parsers.serve, run.serve),
    "info": (parsers.info, run.info),
    "selftest": (parsers.selftest, run.selftest),
    "generate": (parsers.generate, run.generate),
    "tokenize": (parsers.tokenize, run.tokenize),
    "tokenizer-train": (parsers.tokenizer_train, tokenizer.tokenizer_train),
    "perplexity": (parsers.perplexity, run.perplexity),
    "train": (parsers.train, training.train),
    "gradcheck": (parsers.gradcheck, training.gradcheck),
    "f32-copy": (parsers.f32_copy, training.f32_copy),
    "index": (parsers.index, retrieval.index),
    "ask": (parsers.ask, retrieval.ask),
    "retrieval-eval": (parsers.retrieval_eval, retrieval.retrieval_eval),
    "train-embedder": (parsers.train_embedder, embedder.train_embedder),
    "grounded-data": (parsers.grounded_data, grounded.grounded_data),
    "grounded-eval": (parsers.grounded_eval, grounded.grounded_eval),
    "ablate": (parsers.ablate, experiments.ablate),
    "patch": (parsers.patch, experiments.patch),
    "steer": (parsers.steer, experiments.steer),
    "attribute": (parsers.attribute, experiments.attribute),
    "bench": (parsers.bench, bench.bench),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, (build, handler) in COMMANDS.items():
        build(sub, name).set_defaults(fn=handler)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except Exception as exc:  # one clear line for the user, not a traceback
        if not _for_the_user(exc):
            raise
        print(f"lab {args.cmd}: {exc}", file=sys.stderr)
        return 2


def _for_the_user(exc: Exception) -> bool:
    """An error whose message says what to change (a file, a flag's value, the model, the GPU's features); any other
    is a bug, and its traceback is kept."""
    from lab.engine.engine import EngineError
    from lab.format.gguf import GGUFError
    from lab.format.model import ModelError
    from lab.gpu import GpuError
    return isinstance(exc, (GGUFError, GpuError, ModelError, EngineError, OSError, ValueError))
