"""The `lab` command's shape: every subcommand keeps the shared flags its kind of command takes, with their defaults
(the tables below are written out, not read from the parser, so a flag a builder stops adding is missed here); the
dispatch table and the subparsers name the same commands; every function of the CLI stays short; importing it
loads no engine (the handlers import theirs)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from lab.host import cli
from lab.instruments import retrieval
from lab.settings import DEFAULT_CTX, PERPLEXITY_CTX, Settings

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "lab" / "host" / "cli"
MAX_LINES = 60

# The least command line each subcommand parses: its required positionals and flags.
LEAST = {
    "serve": [],
    "info": ["m.gguf"],
    "selftest": [],
    "generate": ["m.gguf", "--prompt", "p"],
    "tokenize": ["m.gguf", "t.txt"],
    "tokenizer-train": ["a.txt", "--vocab", "300", "--out", "t.json"],
    "perplexity": ["m.gguf", "t.txt"],
    "train": ["m.gguf", "--data", "t.txt"],
    "gradcheck": ["m.gguf"],
    "f32-copy": ["m.gguf", "--out", "f.gguf"],
    "index": ["m.gguf", "a.txt", "--out", "i.idx"],
    "ask": ["m.gguf", "--index", "i.idx", "--question", "q"],
    "retrieval-eval": ["m.gguf", "a.txt"],
    "train-embedder": ["m.gguf", "a.txt", "--out", "e.gguf"],
    "grounded-data": ["a.txt", "--out", "s.jsonl"],
    "grounded-eval": ["m.gguf", "--set", "s.heldout.jsonl"],
    "ablate": ["m.gguf", "--prompt", "p", "--target", "t"],
    "patch": ["m.gguf", "--clean", "a", "--corrupt", "b", "--target", "t"],
    "steer": ["m.gguf", "--prompt", "p", "--plus", "a", "--minus", "b", "--layer", "1"],
    "attribute": ["m.gguf", "--prompt", "p", "--target", "t"],
    "bench": ["m.gguf"],
}
# Which subcommands open the GPU (--disable), print JSON (--json), make a KV cache (--ctx, with its default),
# sample (the sampler's flags and -n), and run in the page too (--backend and the browser's options).
GPU = {"selftest", "generate", "perplexity", "train", "gradcheck", "index", "ask", "retrieval-eval", "train-embedder",
       "grounded-eval", "ablate", "patch", "steer",
       "attribute", "bench"}
JSON = {"generate", "tokenize", "tokenizer-train", "perplexity", "train", "gradcheck", "f32-copy", "index", "ask",
        "retrieval-eval", "train-embedder", "grounded-data", "grounded-eval", "ablate", "patch", "steer",
        "attribute", "bench"}
CTX = {"generate": DEFAULT_CTX, "perplexity": PERPLEXITY_CTX, "train": 128, "gradcheck": 16, "index": DEFAULT_CTX, "ask": DEFAULT_CTX,
       "retrieval-eval": DEFAULT_CTX, "train-embedder": 65, "grounded-eval": 1024, "ablate": DEFAULT_CTX, "patch": DEFAULT_CTX, "steer": DEFAULT_CTX,
       "attribute": DEFAULT_CTX}
SAMPLING = {"generate", "ask", "steer"}
# The subcommands that run a model natively with a LoRA adapter file (--lora)
LORA = {"generate", "perplexity", "index", "ask", "retrieval-eval", "grounded-eval", "ablate", "patch", "steer",
        "attribute"}
IN_THE_PAGE = {"retrieval-eval", "ablate", "patch", "bench", "train"}


def parse(*argv: str):
    return cli.parser().parse_args(list(argv))


def test_the_dispatch_table_is_the_subcommands():
    sub = next(a for a in cli.parser()._actions if a.dest == "cmd")
    assert list(sub.choices) == list(cli.COMMANDS) == list(LEAST)
    for name, (_build, handler) in cli.COMMANDS.items():
        assert parse(name, *LEAST[name]).fn is handler


@pytest.mark.parametrize("name", list(LEAST))
def test_each_subcommand_keeps_its_shared_flags(name):
    least = [name, *LEAST[name]]
    args = parse(*least)
    assert args.cmd == name
    assert (getattr(args, "disable", None) == []) == (name in GPU)
    if name in GPU:
        assert parse(*least, "--disable", "subgroups", "--disable", "f16").disable == ["subgroups", "f16"]
    assert (getattr(args, "json", None) is False) == (name in JSON)
    if name in JSON:
        assert parse(*least, "--json").json is True
    assert getattr(args, "ctx", None) == CTX.get(name)
    assert hasattr(args, "lora") == (name in LORA) and getattr(args, "lora", None) is None
    if name in LORA:
        assert parse(*least, "--lora", "a.gguf").lora == "a.gguf"
    if name in CTX:
        assert parse(*least, "--ctx", "64").ctx == 64
    defaults = Settings()
    sampler = {"greedy": False, "temperature": defaults.temperature, "top_p": defaults.top_p, "top_k": defaults.top_k,
               "min_p": defaults.min_p, "seed": defaults.seed, "n": 128}
    assert ({k: getattr(args, k, None) for k in sampler} == sampler) == (name in SAMPLING)
    if name in SAMPLING:
        assert parse(*least, "--greedy", "--top-k", "5", "-n", "3").top_k == 5
    in_page = {"backend": "native", "chromium": None, "chromium_flags": None, "chromium_flag": []}
    assert ({k: getattr(args, k, None) for k in in_page} == in_page) == (name in IN_THE_PAGE)


def test_the_retrieval_commands_share_the_window_flags():
    for name in ("index", "retrieval-eval"):
        args = parse(name, *LEAST[name])
        assert (args.window, args.stride) == (retrieval.WINDOW, retrieval.STRIDE)


def test_a_bad_shared_flag_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as refused:
        parse("generate", *LEAST["generate"], "--ctx", "many")
    assert refused.value.code == 2
    assert "argument --ctx: invalid int value: 'many'" in capsys.readouterr().err


def functions(path: Path):
    """(name, first line, lines) of every function in `path`, nested ones included."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_every_cli_function_is_short():
    paths = sorted(CLI.glob("*.py"))
    assert CLI / "__init__.py" in paths and len(paths) > 1
    long = [f"{p.relative_to(ROOT)}:{line} {name}: {n} lines" for p in paths for name, line, n in functions(p)
            if n >= MAX_LINES]
    assert not long, "\n".join(long)


def test_the_length_check_counts_nested_functions(tmp_path):
    planted = tmp_path / "planted.py"
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    planted.write_text(f"def outer():\n    def inner():\n{body}\n    return inner\n")
    assert {name: n for name, _, n in functions(planted)} == {"outer": MAX_LINES + 3, "inner": MAX_LINES + 1}


def test_importing_the_cli_loads_no_engine():
    code = ("import sys, lab.host.cli; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('numpy', 'wgpu') or m.startswith(('lab.engine', 'lab.gpu', 'lab.ops'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
