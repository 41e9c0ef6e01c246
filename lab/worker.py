"""The worker's Python side (Pyodide only): answers the page's messages, relayed by web/worker.js.

Messages in:  {type: "init"} | {type: "inspect", file: File}
Messages out: {type: "gpu", info} | {type: "selftest", result} | {type: "model-info", summary}
              | {type: "error", where, message}
Python only ever sees the header prefix of a model file: the bytes go from File.slice to the GPU.
"""

from __future__ import annotations

import asyncio
import time

import js
from pyodide.ffi import to_js

from . import gguf, selftest
from .gpu.browser import open_browser

_lock = asyncio.Lock()   # one message at a time: a second file picked mid-read waits its turn
_state: dict = {"device": None}
PREFIX = 1 << 20         # first read of a header; grown when the metadata is larger


def post(msg: dict) -> None:
    js.postMessage(to_js(msg, dict_converter=js.Object.fromEntries))


async def handle(msg) -> None:
    kind = msg.type
    async with _lock:
        try:
            if kind == "init":
                await _init()
            elif kind == "inspect":
                await _inspect(msg.file)
            else:
                post({"type": "error", "where": kind, "message": f"unknown message type {kind!r}"})
        except Exception as exc:  # every failure reaches the page as a message, and the worker lives on
            post({"type": "error", "where": kind, "message": str(exc) or type(exc).__name__})


async def _init() -> None:
    device = await open_browser()
    _state["device"] = device
    post({"type": "gpu", "info": device.info.summary()})
    result = await selftest.run(device)
    await device.flush_errors()
    post({"type": "selftest", "result": result})


async def read_header(file) -> tuple[gguf.Header, int]:
    """Parse the header from a growing prefix of the File; returns it and the bytes read."""
    size = int(file.size)
    want = min(PREFIX, size)
    while True:
        buf = await file.slice(0, want).arrayBuffer()
        try:
            return gguf.read(buf.to_bytes(), file_size=size), want
        except gguf.NeedMoreBytes as more:
            if want >= size:
                raise gguf.GGUFError(f"the file ends inside its header ({size:,} bytes): it is truncated")
            want = min(size, max(more.needed, want * 2))


async def _inspect(file) -> None:
    t0 = time.perf_counter()
    header, nread = await read_header(file)
    summary = gguf.summary(header)
    summary.update(file_name=str(file.name), prefix_bytes=nread, parse_ms=round((time.perf_counter() - t0) * 1e3, 1))
    post({"type": "model-info", "summary": summary})
