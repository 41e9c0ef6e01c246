"""The registry of architectures (lab.format.arches): one module per architecture, named as its general.architecture,
in the order the messages list them; and no architecture's name written outside that package in lab.format (the
literals that #42 moved there stay there: a planted one fails)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from lab.format import arches
from lab.format.arches.base import Arch

FORMAT = Path(__file__).resolve().parents[2] / "lab" / "format"
ORDER = ("llama", "smollm3", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "lfm2", "lfm2moe", "qwen35",
         "gemma4")


def test_every_architecture_has_its_module():
    for name, arch in arches.REGISTRY.items():
        module = importlib.import_module(f"lab.format.arches.{name}")
        assert isinstance(arch, Arch) and module.ARCH is arch and arch.name == name


def test_every_module_is_registered():
    modules = {p.stem for p in (FORMAT / "arches").glob("*.py")} - {"__init__", "base"}
    assert modules == set(arches.REGISTRY)


def test_the_order_is_kept():
    assert arches.ARCHITECTURES == ORDER == tuple(arches.REGISTRY)


def test_refused_variants_are_not_architectures():
    assert not set(arches.REFUSED) & set(arches.REGISTRY)


def names_written(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string constant of `source` that is one of `names`."""
    return sorted((n.lineno, n.value) for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names)


@pytest.mark.parametrize("path", sorted(p for p in FORMAT.rglob("*.py") if "arches" not in p.parts),
                         ids=lambda p: p.name)
def test_no_architecture_name_outside_its_module(path):
    """lab.format reads an architecture's quirks from its Arch, never by testing its name."""
    found = names_written(path.read_text(), set(arches.REGISTRY))
    assert not found, f"{path.name}: architecture names written at (line, name) {found}"


def test_a_planted_name_is_found():
    planted = 'qk_norm = arch in ("gemma3", "qwen3")\nif arch == "lfm2":\n    pass\nmsg = f"a {arch} model"\n'
    assert names_written(planted, set(arches.REGISTRY)) == [(1, "gemma3"), (1, "qwen3"), (2, "lfm2")]


def test_every_architecture_is_run_by_a_synthetic_file_or_a_real_model(smollm2_path, qwen_path, gemma_path):
    """The tests' one list of architectures (tests/conftest.py ARCH_SPECS: lab/host/synthetic/arch.py) with the three
    real models covers the registry, and each spec, those the lab refuses today included (NOT_RUN_SPECS), has
    llama.cpp's F32 fixture: an architecture added to the registry without a synthetic file and its fixtures fails
    here."""
    from lab.format import gguf
    from lab.host.synthetic import arch as synthetic_arch
    from tests.conftest import ARCH_SPECS, FIXTURES
    real = {gguf.read_file(p).metadata["general.architecture"] for p in (smollm2_path, qwen_path, gemma_path)}
    synthetic = {synthetic_arch.SPECS[name].arch for name in ARCH_SPECS}
    assert set(arches.ARCHITECTURES) == synthetic | real, set(arches.ARCHITECTURES) ^ (synthetic | real)
    assert {f.stem.rsplit("-", 1)[0] for f in (FIXTURES / "arch").glob("*-f32.json")} == set(synthetic_arch.SPECS)
