"""The import graph follows the layer order of docs/architecture.md: no module imports a group above its own, the
graph has no cycle (imports inside functions included), and no module of the wheel imports the lab inside a
function (the habit that hid the last cycles). The asset server imports nothing of the engine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first: a module may import its own group and the groups before it (docs/architecture.md, "Layers").
LAYERS = ["lab", "lab.settings", "lab.format", "lab.text", "lab.gpu", "lab.ops", "lab.engine", "lab.instruments",
          "lab.worker", "server", "lab.host"]
# The order inside lab.format, lowest first, as its package docstring states it: a module of lab.format may import
# the ones at its place or before it. lab.format.arches.base holds what the architectures' modules share, the package
# (lab.format.arches) the registry of them.
FORMAT = ["lab.format.ggml", "lab.format.iq_grids", "lab.format.gguf", "lab.format.writer", "lab.format.rules",
          "lab.format.config", "lab.format.arches.base", "lab.format.arches", "lab.format.checks", "lab.format.model",
          "lab.format.adapter", "lab.format.untrained"]
# The order inside lab.engine, as its package docstring states it (the blocks' base and kinds inside blocks, the
# package the registry of them, lab.engine.blocks' docstring).
ENGINE = ["lab.engine.scratch", "lab.engine.lora", "lab.engine.blocks.base", "lab.engine.blocks.attention",
          "lab.engine.blocks.shortconv", "lab.engine.blocks.deltanet", "lab.engine.blocks.feedforward",
          "lab.engine.blocks.moe",
          "lab.engine.blocks.perlayer", "lab.engine.blocks.ends", "lab.engine.blocks", "lab.engine.plans",
          "lab.engine.backward", "lab.engine.budget", "lab.engine.engine", "lab.engine.load", "lab.engine.sampler",
          "lab.engine.session"]
ORDERED = {"lab.format": FORMAT, "lab.engine": ENGINE}     # the groups whose inside order the tests hold
# What the asset server may import of the lab: the version and the page's defaults (`lab serve` passes the model path).
SERVER_MAY_IMPORT = {"lab", "lab.settings"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for d in ("lab", "server") for p in sorted((ROOT / d).rglob("*.py"))}


def layer(mod: str) -> int:
    """The index of the longest LAYERS entry that is `mod` or a package above it."""
    best = max((g for g in LAYERS if mod == g or mod.startswith(g + ".")), key=len)
    return LAYERS.index(best)


def place(mod: str, order: list[str] = FORMAT) -> int:
    """The index of the longest entry of `order` that is `mod` or a package above it (-1: none)."""
    found = [g for g in order if mod == g or mod.startswith(g + ".")]
    return order.index(max(found, key=len)) if found else -1


def imports(mod: str, path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of a project module in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base_mod = ".".join(base + ([node.module] if node.module else []))
            else:
                base_mod = node.module or ""
            names = [f"{base_mod}.{a.name}" if f"{base_mod}.{a.name}" in known else base_mod for a in node.names]
        for n in names:
            if n in known:
                out.append((n, node.lineno, id(node) in nested))
    return out


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    src = sources()
    known = set(src)
    return {m: imports(m, p, known) for m, p in src.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_goes_up_the_layers():
    wrong = [f"{m} (layer {LAYERS[layer(m)]}) imports {t} (layer {LAYERS[layer(t)]}) at line {line}"
             for m, es in graph().items() for t, line, _ in es if layer(t) > layer(m)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("group", ORDERED)
def test_a_group_keeps_its_order(group):
    """Inside lab.format and lab.engine, every module has its place in the group's order and imports none placed
    after it."""
    order = ORDERED[group]
    mods = [m for m in sources() if m.startswith(group + ".")]
    assert not [m for m in mods if place(m, order) < 0], f"modules of {group} without a place in its order"
    wrong = [f"{m} ({order[place(m, order)]}) imports {t} ({order[place(t, order)]}) at line {line}"
             for m, es in graph().items() if m in mods for t, line, _ in es
             if t.startswith(group + ".") and place(t, order) > place(m, order)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("group", ORDERED)
def test_the_docstring_states_the_order(group):
    """The group's package docstring names its modules in the order the test holds (a package's inner modules
    inside it)."""
    doc = ast.get_docstring(ast.parse((ROOT / group.replace(".", "/") / "__init__.py").read_text()))
    names = list(dict.fromkeys(m.split(".")[2] for m in ORDERED[group]))
    where = [doc.find(f"{n} (") for n in names]
    assert -1 not in where and where == sorted(where), dict(zip(names, where))


def test_no_import_cycle():
    edges = {m: {t for t, _, _ in es if t != m} for m, es in graph().items()}
    assert not cycles(edges)


def test_the_wheel_imports_the_lab_at_the_top():
    """Inside a function, an import of the lab is how a cycle hides: the wheel's modules (lab/ less lab/host/) import
    the lab only at module level. (The CLI and host tools may defer theirs for start-up time.)"""
    wrong = [f"{m} imports {t} inside a function (line {line})"
             for m, es in graph().items() if layer(m) < LAYERS.index("lab.host") for t, line, inner in es if inner]
    assert not wrong, "\n".join(wrong)


def test_the_server_imports_nothing_of_the_engine():
    wrong = [f"{m} imports {t}" for m, es in graph().items() if m.startswith("server")
             for t, _, _ in es if not t.startswith("server") and t not in SERVER_MAY_IMPORT]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("edges, found", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"a"}}, [["a"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_cycle_finder_finds_cycles(edges, found):
    assert cycles(edges) == found


def test_an_upward_import_is_caught(tmp_path):
    """The layer check on a planted module: lab.format importing lab.engine, at the top and inside a function."""
    planted = tmp_path / "planted.py"
    planted.write_text("from lab.engine import budget\n\ndef f():\n    from lab.worker import router\n")
    found = imports("lab.format.planted", planted, set(sources()))
    assert [(t, inner) for t, _, inner in found] == [("lab.engine.budget", False), ("lab.worker.router", True)]
    assert all(layer(t) > layer("lab.format.planted") for t, _, _ in found)


def test_a_format_import_out_of_order_is_caught(tmp_path):
    """The order inside lab.format on a planted module: an architecture's module importing lab.format.model."""
    planted = tmp_path / "planted.py"
    planted.write_text("from lab.format.model import Config\n")
    found = imports("lab.format.arches.planted", planted, set(sources()))
    assert [t for t, _, _ in found] == ["lab.format.model"]
    assert place("lab.format.model") > place("lab.format.arches.planted")


def test_an_engine_import_out_of_order_is_caught(tmp_path):
    """The order inside lab.engine on a planted module: a block importing the plans (which run the blocks)."""
    planted = tmp_path / "planted.py"
    planted.write_text("from lab.engine.plans import Plan\n")
    found = imports("lab.engine.blocks.planted", planted, set(sources()))
    assert [t for t, _, _ in found] == ["lab.engine.plans"]
    assert place("lab.engine.plans", ENGINE) > place("lab.engine.blocks.planted", ENGINE)
