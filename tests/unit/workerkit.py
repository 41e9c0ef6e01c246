"""Stand-ins for `js` and `pyodide.ffi`, so that lab/worker/router.py (and the modules of lab/worker that reach JS)
import and run in CPython: what the worker posts lands in a list. Used by tests/unit/test_worker_*.py."""

from __future__ import annotations

import contextlib
import importlib
import sys
import types

# The modules that import `js` or `pyodide.ffi`: imported afresh over the stand-ins, and dropped afterwards.
JS_MODULES = ("lab.worker.router", "lab.worker.hooks", "lab.worker.verify", "lab.gpu.browser")


@contextlib.contextmanager
def router_over_standins(monkeypatch):
    """lab.worker.router imported over the stand-ins; its `posted` lists the messages it posted, in order."""
    posted = []
    js = types.ModuleType("js")
    js.postMessage = posted.append
    js.Object = types.SimpleNamespace(fromEntries=dict)
    js.labStopRequested = lambda: False
    js.labStopClear = lambda: None
    ffi = types.ModuleType("pyodide.ffi")
    ffi.to_js = lambda x, **_: x
    ffi.create_once_callable = lambda f: f
    pyodide = types.ModuleType("pyodide")
    pyodide.ffi = ffi
    for name, mod in (("js", js), ("pyodide", pyodide), ("pyodide.ffi", ffi)):
        monkeypatch.setitem(sys.modules, name, mod)
    for name in JS_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    router = importlib.import_module("lab.worker.router")
    router.posted = posted
    try:
        yield router
    finally:
        for name in JS_MODULES:
            sys.modules.pop(name, None)


class Message:
    """A message as web/worker.js hands it to `router.handle`: a JS object that `to_py()` turns into a dict."""

    def __init__(self, **fields) -> None:
        self.fields = fields

    def to_py(self) -> dict:
        return dict(self.fields)
