"""The verification card natively: a model file's references found by content, replayed through the engine on
wgpu-py and compared (lab.instruments.verify); the same code the worker runs, fixtures read from disk instead of the
server."""

from __future__ import annotations

import json
from pathlib import Path

from lab.engine.engine import Engine
from lab.format import gguf
from lab.gpu.shaders import KernelCache
from lab.instruments import verify
from lab.text.tokenizer import from_metadata

REFERENCE = Path(__file__).resolve().parent.parent.parent / "reference"


def index() -> dict:
    return json.loads((REFERENCE / "index.json").read_text())


async def _read(name: str) -> bytes:
    return (REFERENCE / name).read_bytes()


async def verify_file(device, path, n_ctx: int = 256) -> dict | None:
    """The card's result for the file at `path`, or None when the index has no reference for its content."""
    entry = verify.find(index(), verify.file_content_hash(path))
    if entry is None:
        return None
    header = gguf.read_file(path)
    engine = Engine(device, header, n_ctx=n_ctx)
    try:
        engine.weights.upload_file(path)
        return await verify.run(engine, from_metadata(header.metadata), entry, _read)
    finally:
        engine.close()


async def verify_kernels(device) -> list[dict]:
    cases = json.loads((REFERENCE / "kernels.json").read_text())["cases"]
    return await verify.run_kernels(device, KernelCache(device), cases)
