"""The real server under load: `serve()` in a subprocess on a free 127.0.0.1 port (as `lab serve` runs
it), and N concurrent keep-alive connections (asyncio streams, raw HTTP/1.1) fetching the page, assets,
the wheel, HEADs and 1 MiB Range slices of the default model. Prints requests/s and latency (p50, p99)
per kind; asserts only sanity (every status right, every body the right length, Range bodies equal to
the file's bytes, the CSP on every answer, p99 under a generous bound, the server alive and answering
afterwards). Speed figures live in docs/server.md, not in assertions.

    .venv/bin/pytest -s tests/server/test_load.py            # 800 requests, 16 connections
    .venv/bin/pytest -s tests/server/test_load.py --slow     # + 6000 requests over 64 connections,
                                                             #   with whole-model and wasm downloads

All traffic goes to 127.0.0.1; the number of requests is fixed and every read has a deadline."""

from __future__ import annotations

import asyncio
import http.client
import mmap
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server import wheel

ROOT = Path(__file__).resolve().parent.parent.parent
HOST = "127.0.0.1"
SLICE = 1 << 20
P99_BOUND_S = 5.0           # sanity only: a request that takes this long means something is stuck
READ_DEADLINE_S = 30.0      # per request


@pytest.fixture(scope="module")
def server(smollm2_path):
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    code = f"from server.app import serve; serve({str(smollm2_path)!r}, {HOST!r}, {port})"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the server exited at start"
            assert time.monotonic() < deadline, "the server did not start in 60 s"
            try:
                c = http.client.HTTPConnection(HOST, port, timeout=2)
                c.request("GET", "/version.json")
                if c.getresponse().status == 200:
                    c.close()
                    break
            except OSError:
                time.sleep(0.1)
        yield {"port": port, "proc": proc, "model": smollm2_path}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


ASSETS = ["/web/main.js", "/web/worker.js", "/web/panels.js", "/web/style.css", "/pyodide/pyodide.mjs",
          "/pyodide/pyodide-lock.json", "/wgsl/index.json", "/wgsl/matmul.wgsl", "/version.json"]


def _plan(n: int, model_size: int, seed: int, heavy: bool) -> list[tuple[str, str, str, dict]]:
    """n requests as (kind, method, target, headers): the page, assets, the wheel, HEAD of the model,
    1 MiB Range slices of it at random offsets (the first one at 0, and one that runs past the end);
    with heavy, also whole downloads of pyodide.asm.wasm (9.6 MB) and the model (98 MB)."""
    rng = random.Random(seed)
    kinds = [("page", 15), ("asset", 40), ("wheel", 10), ("model-head", 5), ("model-range", 30)]
    if heavy:
        kinds += [("wasm", 1)]
    population = [k for k, w in kinds for _ in range(w)]
    plan = []
    for i in range(n):
        kind = population[rng.randrange(len(population))]
        if kind == "page":
            plan.append((kind, "GET", "/", {}))
        elif kind == "asset":
            plan.append((kind, "GET", rng.choice(ASSETS), {}))
        elif kind == "wheel":
            plan.append((kind, "GET", f"/wheel/{wheel.FILENAME}", {}))
        elif kind == "model-head":
            plan.append((kind, "HEAD", "/models/default.gguf", {}))
        elif kind == "wasm":
            plan.append((kind, "GET", "/pyodide/pyodide.asm.wasm", {}))
        else:
            start = 0 if i == 0 else (model_size - SLICE // 2 if i == 1 else rng.randrange(model_size - SLICE))
            plan.append((kind, "GET", "/models/default.gguf", {"Range": f"bytes={start}-{start + SLICE - 1}"}))
    if heavy:
        plan[len(plan) // 3:len(plan) // 3] = [("model-whole", "GET", "/models/default.gguf", {})] * 4
    return plan


async def _one(reader, writer, method: str, target: str, headers: dict) -> tuple[int, dict, int, bytes]:
    head = f"{method} {target} HTTP/1.1\r\nHost: {HOST}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write((head + "\r\n").encode())
    await writer.drain()
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
    assert "transfer-encoding" not in hdrs
    length = 0 if method == "HEAD" else int(hdrs["content-length"])
    keep = b""
    got = 0
    while got < length:                      # big bodies are read in pieces and dropped
        chunk = await reader.read(min(1 << 20, length - got))
        if not chunk:
            raise ConnectionError("closed mid-body")
        got += len(chunk)
        if length <= 2 * SLICE:
            keep += chunk
    return status, hdrs, got, keep


async def _run(port: int, plan: list, concurrency: int) -> tuple[list[tuple], float]:
    queue = list(reversed(plan))
    results = []

    async def worker():
        reader, writer = await asyncio.open_connection(HOST, port, limit=1 << 16)
        try:
            while queue:
                kind, method, target, headers = queue.pop()
                t0 = time.perf_counter()
                status, hdrs, n, body = await asyncio.wait_for(_one(reader, writer, method, target, headers),
                                                               READ_DEADLINE_S)
                results.append((kind, method, target, headers, time.perf_counter() - t0, status, hdrs, n, body))
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - t0


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _load(server, n: int, concurrency: int, heavy: bool) -> dict:
    model = server["model"]
    size = model.stat().st_size
    plan = _plan(n, size, seed=n, heavy=heavy)
    results, wall = asyncio.run(_run(server["port"], plan, concurrency))
    assert len(results) == len(plan)

    with open(model, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for kind, method, target, headers, _, status, hdrs, n_bytes, body in results:
            assert hdrs.get("content-security-policy"), (kind, target)
            if kind == "model-range":
                start = int(headers["Range"][6:].split("-")[0])
                end = min(start + SLICE, size)
                assert status == 206, (target, headers, status)
                assert hdrs["content-range"] == f"bytes {start}-{end - 1}/{size}"
                assert body == data[start:end], headers
            else:
                assert status == 200, (kind, target, status)
                if method == "HEAD":
                    assert int(hdrs["content-length"]) == size and n_bytes == 0
                else:
                    assert n_bytes == int(hdrs["content-length"])
            if kind == "model-whole":
                assert n_bytes == size

    lat = [r[4] for r in results]
    nbytes = sum(r[7] for r in results)
    figures = {"requests": len(results), "connections": concurrency, "wall_s": wall, "req_s": len(results) / wall,
               "MB_s": nbytes / wall / 1e6, "p50_ms": 1e3 * _pct(lat, 50), "p99_ms": 1e3 * _pct(lat, 99), "kinds": {}}
    print(f"\n{len(results)} requests over {concurrency} connections in {wall:.2f} s: "
          f"{figures['req_s']:.0f} req/s, {figures['MB_s']:.0f} MB/s, "
          f"p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms")
    print(f"{'kind':<12} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for kind in dict.fromkeys(r[0] for r in sorted(results, key=lambda r: r[0])):
        ks = [r[4] for r in results if r[0] == kind]
        figures["kinds"][kind] = (len(ks), 1e3 * _pct(ks, 50), 1e3 * _pct(ks, 99))
        print(f"{kind:<12} {len(ks):>5} {1e3 * _pct(ks, 50):>8.1f} {1e3 * _pct(ks, 99):>8.1f} {1e3 * max(ks):>8.1f}")

    assert _pct(lat, 99) < P99_BOUND_S
    assert server["proc"].poll() is None
    c = http.client.HTTPConnection(HOST, server["port"], timeout=5)
    t0 = time.monotonic()
    c.request("GET", "/")
    r = c.getresponse()
    assert r.status == 200 and b"<html" in r.read().lower() and time.monotonic() - t0 < 2
    c.close()
    return figures


def test_load(server):
    _load(server, n=800, concurrency=16, heavy=False)


@pytest.mark.slow
def test_load_heavy(server):
    _load(server, n=6000, concurrency=64, heavy=True)
