"""Every function and method of the wheel (lab/ less lab/host/, what runs in Pyodide) is shorter than MAX_LINES lines
(issue #42), counted from its `def` line to its last line, decorators left out; a nested function counts on its own
and inside the one around it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A function is read whole, at once, on one screen: past this its parts want names of their own (helpers whose names
# say what they compute), which is what a reader, or a review of a change, holds on to.
MAX_LINES = 60


def wheel_modules() -> list[Path]:
    """The wheel's modules as server/wheel.py packs them: lab/**/*.py without lab/host/ (the CPython-only tools)."""
    lab = ROOT / "lab"
    return [p for p in sorted(lab.rglob("*.py")) if (lab / "host") not in p.parents]


def long_functions(source: str, filename: str, limit: int = MAX_LINES) -> list[str]:
    """"file:line qualified.name (n lines)" for each function of `source` of `limit` lines or more, in file order."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                n = child.end_lineno - child.lineno + 1
                if n >= limit:
                    found.append((child.lineno, f"{filename}:{child.lineno} {name} ({n} lines)"))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return [text for _, text in sorted(found)]


def test_every_function_of_the_wheel_is_short():
    long = [line for p in wheel_modules()
            for line in long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert not long, (f"functions of {MAX_LINES} lines or more ({len(long)}); split each into helpers named for "
                      f"what they compute:\n  " + "\n  ".join(long))


def test_the_wheel_is_what_is_read():
    names = {str(p.relative_to(ROOT)) for p in wheel_modules()}
    assert "lab/worker/router.py" in names and "lab/ops/matmul.py" in names
    assert not [n for n in names if n.startswith("lab/host/")]


def function(name: str, lines: int, indent: str = "", head: str = "def") -> str:
    """A function of exactly `lines` lines, its def line included."""
    return (f"{indent}{head} {name}():\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
            + f"{indent}    return 0\n\n")


def test_a_long_function_is_reported():
    source = ("import functools\n\n\n"
              "class Outer:\n"
              "    @functools.cache\n"              # decorators do not count
              + function("long", MAX_LINES + 1, "    ")
              + function("at_the_limit", MAX_LINES, "    ")
              + function("short", MAX_LINES - 1, "    ")
              + "async def nested():\n"
              + function("inner", MAX_LINES + 1, "    ")
              + "    return inner\n")
    lines = source.splitlines()
    at = {name: 1 + next(i for i, line in enumerate(lines) if f" {name}(" in line)
          for name in ("long", "at_the_limit", "nested", "inner")}
    assert long_functions(source, "synthetic.py") == [
        f"synthetic.py:{at['long']} Outer.long ({MAX_LINES + 1} lines)",
        f"synthetic.py:{at['at_the_limit']} Outer.at_the_limit ({MAX_LINES} lines)",
        f"synthetic.py:{at['nested']} nested ({MAX_LINES + 4} lines)",
        f"synthetic.py:{at['inner']} nested.inner ({MAX_LINES + 1} lines)",
    ]
    assert long_functions(source, "synthetic.py", limit=1000) == []
