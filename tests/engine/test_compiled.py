"""The device keeps each pipeline it compiled (lab.gpu Device.compiled): a second engine on the same device, for the
same file at another context, compiles nothing it already has and computes what the first computed; a source that
differs by one character is compiled anew; `forget_compiled` (the browser backend's answer to a compile or validation
error) drops them all. On SwiftShader a small file's load spent 4-5 s of its 5 on its pipelines; a second load of it
then took 0.4 s."""

from __future__ import annotations

import asyncio

from lab.host.native import open_native
from tests.conftest import native_engine


def _counting(device, monkeypatch) -> list[str]:
    """The labels of the pipelines the device compiles from now on."""
    compiled, real = [], device.kernel

    def kernel(source, label, entry="main"):
        compiled.append(label)
        return real(source, label, entry)
    monkeypatch.setattr(device, "kernel", kernel)
    return compiled


def _greedy(engine, ids) -> int:
    engine.step(ids, 0)
    return asyncio.run(engine.argmax())


def test_a_second_engine_compiles_nothing_it_has(tiny_path, monkeypatch):
    device = open_native()                  # its own: the session's device has compiled these kernels already
    compiled = _counting(device, monkeypatch)
    first = native_engine(device, tiny_path, n_ctx=64)
    n_first = len(compiled)
    assert n_first > 5
    ids = [504, 2365, 6354, 16438, 27003]
    want = _greedy(first, ids)
    first.close()
    second = native_engine(device, tiny_path, n_ctx=128)       # another context: the same kernels
    try:
        assert compiled[n_first:] == []
        assert _greedy(second, ids) == want
    finally:
        second.close()
    device.forget_compiled()
    third = native_engine(device, tiny_path, n_ctx=64)
    try:
        assert sorted(compiled[n_first:]) == sorted(compiled[:n_first])    # everything again, nothing else
    finally:
        third.close()


def test_another_source_is_another_pipeline(monkeypatch):
    device = open_native()
    compiled = _counting(device, monkeypatch)
    src = "@compute @workgroup_size(1) fn main() {}"
    a = device.compiled(src, "a")
    assert device.compiled(src, "a") is a and compiled == ["a"]
    b = device.compiled(src + "\n", "a")           # one character more: another program
    assert b is not a and compiled == ["a", "a"]
