"""The real server (uvicorn in a thread, on a free 127.0.0.1 port) under misuse, through raw sockets so
that nothing normalizes the requests: `..` in every encoding, invalid percent-encoding and UTF-8, NUL,
long paths, oversized headers, malformed request lines, slow-loris heads and bodies, symlinks that lead
out of the served folders, Range edge cases on a sparse file past 4 GiB, HEAD on large files, downloads
dropped midway.

The server serves a scratch tree (create_app's web_dir/wgsl_dir/pyodide_dir) with planted secrets
next to and above the served folders. Every answer must be a 4xx (never a 5xx, never a dropped
connection), carry the CSP, and hold no secret; after each test the server must still answer GET /
quickly. All traffic goes to 127.0.0.1; every loop is bounded in count and in time."""

from __future__ import annotations

import http.client
import itertools
import logging
import os
import select
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from server.app import create_app, server_config

HOST = "127.0.0.1"
HEADER_TIMEOUT = 1.0            # the test server's deadline on request heads (the default is 10 s)
SECRET = b"SECRET"              # in every planted file outside the served folders
BIG = 5 * 2**30 + 123           # the sparse model: past 4 GiB, so 32-bit offsets would wrap
MARK_AT = 4 * 2**30 + 7         # where a marker sits in it
MARK = b"PAST-4GIB"


# --------------------------------------------------------------------------- the scratch tree and server

def _tree(tmp: Path) -> dict:
    root = tmp / "root"
    web, wgsl, nm = root / "web", root / "wgsl", root / "web" / "node_modules"
    for d in (web, wgsl, nm / "pyodide", nm / "ws", tmp / "outside_dir"):
        d.mkdir(parents=True)
    (tmp / "secret.txt").write_bytes(b"OUTSIDE-SECRET-1")
    (tmp / "outside_dir" / "secret.txt").write_bytes(b"OUTSIDE-SECRET-2")
    (root / "secret.txt").write_bytes(b"OUTSIDE-SECRET-3")
    (web / ".env").write_bytes(b"DOTFILE-SECRET")
    (nm / "ws" / "secret.js").write_bytes(b"NODE-MODULES-SECRET")
    (web / "main.js").write_bytes(b"console.log('main');")
    (nm / "pyodide" / "pyodide.mjs").write_bytes(b"export const pyodide = 1;")
    (wgsl / "a.wgsl").write_bytes(b"// a")
    links = {
        web / "alias.js": "main.js",                            # inside -> inside: served
        web / "abs.js": str(tmp / "secret.txt"),                # absolute, out of the tree
        web / "rel.js": "../secret.txt",                        # relative, next to web/
        web / "dirlink": str(tmp / "outside_dir"),              # a folder outside
        web / "nm.js": "node_modules/ws/secret.js",             # into web/ but the folder /web hides
        web / "dot.js": ".env",                                 # to a dot-file
        web / "loop.js": "loop.js",                             # a loop
        web / "broken.js": "nowhere.js",                        # dangling
        web / "etc.js": "/etc/passwd",
        wgsl / "out.wgsl": "../secret.txt",
        nm / "pyodide" / "up.mjs": "../ws/secret.js",           # inside web/, outside the pyodide folder
    }
    for link, to in links.items():
        os.symlink(to, link)
    model = tmp / "big.gguf"
    with open(model, "wb") as f:                                # sparse: no disk space taken
        f.write(b"GGUF")
        f.seek(MARK_AT)
        f.write(MARK)
        f.truncate(BIG)
    return {"web": web, "wgsl": wgsl, "pyodide": nm / "pyodide", "model": model}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    t = _tree(tmp_path_factory.mktemp("served"))
    app = create_app(t["model"], web_dir=t["web"], wgsl_dir=t["wgsl"], pyodide_dir=t["pyodide"])
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(server_config(app, HOST, port, header_timeout=HEADER_TIMEOUT))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.05)
    yield {"port": port, "thread": thread, **t}
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(autouse=True)
def still_answers(server):
    """After every test: the server thread is alive and answers GET / promptly."""
    yield
    assert server["thread"].is_alive()
    _alive(server["port"])


def _alive(port: int) -> None:
    t0 = time.monotonic()
    c = http.client.HTTPConnection(HOST, port, timeout=3)
    try:
        c.request("GET", "/")
        r = c.getresponse()
        body = r.read()
    finally:
        c.close()
    assert r.status == 200 and b"<html" in body.lower() and r.getheader("content-security-policy")
    assert time.monotonic() - t0 < 2.0


# --------------------------------------------------------------------------- raw HTTP

def _exchange(port: int, data: bytes, timeout: float = 5.0, max_bytes: int = 1 << 20) -> bytes:
    """Send data on a fresh connection and read what comes back until the server closes, max_bytes
    arrive, or timeout passes."""
    out = bytearray()
    deadline = time.monotonic() + timeout
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:         # the server may answer and close before taking everything (oversized heads)
            pass
        while len(out) < max_bytes and time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            out += chunk
    return bytes(out)


def _request(target: bytes, method: bytes = b"GET", headers: bytes = b"") -> bytes:
    return method + b" " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"Connection: close\r\n\r\n"


def _parse(resp: bytes) -> tuple[int | None, dict, bytes]:
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1.1 "):
        return None, {}, resp
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        hdrs[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
    return int(lines[0].split()[1]), hdrs, body


def _misuse(port: int, data: bytes, ok=(400, 404, 405)) -> tuple[int, dict, bytes]:
    """One misused request: answered (not dropped), with a status in ok, the CSP, and no secret."""
    code, hdrs, body = _parse(_exchange(port, data))
    shown = data[:120]
    assert code is not None, f"no answer to {shown!r}"
    assert code in ok, (code, shown, body[:200])
    assert "content-security-policy" in hdrs, (code, shown)
    assert SECRET not in body and b"root:x:0:0" not in body, (code, shown, body[:200])
    return code, hdrs, body


def _get(port: int, target: str, headers: dict | None = None, method: str = "GET") -> http.client.HTTPResponse:
    c = http.client.HTTPConnection(HOST, port, timeout=10)
    c.request(method, target, headers=headers or {})
    r = c.getresponse()
    r.data = r.read()
    c.close()
    return r


# --------------------------------------------------------------------------- traversal and path misuse

def test_the_scratch_tree_is_served(server):
    """Positive controls, so that the 404s below are not vacuous."""
    p = server["port"]
    for target, body in [("/web/main.js", b"console.log('main');"), ("/web/alias.js", b"console.log('main');"),
                         ("/pyodide/pyodide.mjs", b"export const pyodide = 1;"), ("/wgsl/a.wgsl", b"// a")]:
        r = _get(p, target)
        assert (r.status, r.data) == (200, body), target
        assert r.getheader("content-security-policy")
    assert _get(p, "/wgsl/index.json").data == b'["a.wgsl"]'     # out.wgsl (a link out) is not listed


DOTS = [b"..", b"%2e%2e", b"%2E%2E", b".%2e", b"%2e.", b"%252e%252e", b"%25252e%25252e", b"%c0%ae%c0%ae",
        b"%e0%80%ae%e0%80%ae", b"%uff0e%uff0e", b"\xc0\xae\xc0\xae", b"..%00", b"..%01", b"....", b"..;"]
SEPS = [b"/", b"%2f", b"%2F", b"%252f", b"\\", b"%5c", b"%5C", b"%255c", b"%c0%af", b"%e0%80%af", b"//", b"/./"]
PREFIXES = [b"/web/", b"/wgsl/", b"/pyodide/", b"/wheel/", b"/models/", b"/"]


def test_dot_dot_in_every_encoding(server):
    """Every prefix x every spelling of `..` x every separator x depths 1-3 toward the planted secrets,
    and depth 8 toward /etc/passwd: never a file, always an answered 4xx."""
    p = server["port"]
    n = 0
    for prefix, dots, sep in itertools.product(PREFIXES, DOTS, SEPS):
        for tail in ((dots + sep) + b"secret.txt", (dots + sep) * 2 + b"secret.txt",
                     (dots + sep) * 3 + b"secret.txt", (dots + sep) * 8 + b"etc" + sep + b"passwd"):
            _misuse(p, _request(prefix + tail))
            n += 1
    assert n == len(PREFIXES) * len(DOTS) * len(SEPS) * 4


@pytest.mark.parametrize("target", [
    b"/web//etc/passwd", b"/web/%2fetc%2fpasswd", b"/web/%2Fetc/passwd", b"/web/\\etc\\passwd",
    b"/web/C:%5cWindows%5cwin.ini", b"/web/file:///etc/passwd", b"/web/~root", b"/web/.env", b"/web/%2eenv",
    b"/web/main.js/..", b"/web/main.js/../../secret.txt", b"/web/./main.js", b"/web/main.js%2f",
    # web/node_modules is hidden under /web, however it is spelled
    b"/web/node_modules/ws/secret.js", b"/web/%6eode_modules/ws/secret.js", b"/web/%256eode_modules/ws/secret.js",
    b"/web/./node_modules/ws/secret.js", b"/web/.%2fnode_modules/ws/secret.js", b"/web//node_modules/ws/secret.js",
    b"/web/x/../node_modules/ws/secret.js", b"/web/node_modules%2fws%2fsecret.js", b"/web/NODE_MODULES/ws/secret.js",
    b"/web/node_modules/pyodide/pyodide.mjs",
    b"/pyodide/../ws/secret.js", b"/pyodide/%2e%2e/ws/secret.js", b"/pyodide/%2e%2e%2fws%2fsecret.js",
    b"/wheel/..%2f..%2fsecret.txt", b"/models/../secret.txt", b"/models/default.gguf/../../secret.txt",
    b"http://evil.example/web/main.js", b"//evil.example/web/main.js", b"*",
])
def test_absolute_hidden_and_odd_paths(server, target):
    _misuse(server["port"], _request(target))


@pytest.mark.parametrize("link", ["/web/abs.js", "/web/rel.js", "/web/dirlink/secret.txt", "/web/nm.js",
                                  "/web/dot.js", "/web/loop.js", "/web/broken.js", "/web/etc.js",
                                  "/wgsl/out.wgsl", "/pyodide/up.mjs", "/web/dirlink/", "/web/dirlink"])
def test_symlinks_out_of_the_served_folders_are_404(server, link):
    code, _, _ = _misuse(server["port"], _request(link.encode()), ok=(404,))
    assert code == 404


@pytest.mark.parametrize("target", [
    b"/web/%ff.js", b"/web/%c0%ae", b"/web/%ed%a0%80.js", b"/web/%zz.js", b"/web/%", b"/web/%2", b"/web/%%",
    b"/web/%00", b"/web/main.js%00.png", b"/web/main.js%0a", b"/web/%0d%0aX-Injected:%201",
    b"/web/\xff.js", b"/web/\xc3\xa9.js", b"/web/\xc0\xae\xc0\xae/secret.txt", b"/\xf0\x9f\x92\xa9",
    b"/web/main.js\x00", b"/web/main\x01.js", b"/web/main.js\x7f",
])
def test_invalid_encoding_utf8_and_control_bytes(server, target):
    code, hdrs, _ = _misuse(server["port"], _request(target))
    assert "x-injected" not in hdrs


@pytest.mark.parametrize("target", [
    b"/web/" + b"a" * 255 + b".js",             # the longest name Linux allows
    b"/web/" + b"a" * 300,                      # over NAME_MAX: the OS refuses it (ENAMETOOLONG)
    b"/web/" + b"%61" * 300,                    # the same, percent-encoded
    b"/web/" + b"a" * 5000,
    b"/web/" + b"a/" * 2000 + b"main.js",       # 4000 characters of folders
    b"/wgsl/" + b"../" * 3000 + b"etc/passwd",
    b"/pyodide/" + b"%2e%2e%2f" * 1500 + b"secret.txt",
    b"/" + b"x" * 15000,                        # just under h11's 16 KiB head limit
    b"/web/" + b"a" * 20000,                    # over it: uvicorn's 400
    b"/web/" + b"a" * 200_000,
])
def test_long_paths(server, target):
    _misuse(server["port"], _request(target))


def test_log_lines_cannot_be_forged(server, caplog):
    with caplog.at_level(logging.INFO, logger="lab.server"):
        _misuse(server["port"], _request(b"/web/x%0aGET%20/forged%20200%0d%1b[31m"))
        deadline = time.monotonic() + 2
        while "/web/x" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "lab.server"]
    assert any(line.startswith("GET /web/x\\nGET /forged") for line in lines), lines
    assert all("\n" not in line and "\r" not in line and "\x1b" not in line for line in lines)


# --------------------------------------------------------------------------- headers and request lines

@pytest.mark.parametrize("data", [
    _request(b"/", headers=b"Cookie: " + b"c=" * 100_000 + b"\r\n"),        # 200 KB, in several reads
    _request(b"/", headers=b"X-Nul: a\x00b\r\n"),
    _request(b"/", headers=b"Bad Name: x\r\n"),
    _request(b"/", headers=b"Content-Length: 5\r\nContent-Length: 6\r\n"),
    _request(b"/", headers=b"Transfer-Encoding: gzip\r\n"),
    b"GARBAGE\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n", b"GET /  HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    b"G\xc9T / HTTP/1.1\r\nHost: x\r\n\r\n", b"\r\n" * 5000,
    _request(b"127.0.0.1:22", method=b"CONNECT"), _request(b"/", method=b"TRACE"), _request(b"*", method=b"OPTIONS"),
], ids=lambda d: repr(d[:40])[2:-1])
def test_malformed_heads_are_refused(server, data):
    _misuse(server["port"], data)


@pytest.mark.parametrize("data", [
    # h11 bounds a head only while it is incomplete (16 KiB): one that arrives whole in a single read
    # is parsed, so these may be answered; what matters is an answer, the CSP, and no 5xx.
    _request(b"/", headers=b"X-Big: " + b"a" * 20000 + b"\r\n"),
    _request(b"/", headers=b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(200))),
    _request(b"/", headers=b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n"),
    _request(b"/", headers=b" folded: line\r\n"),
    _request(b"/").replace(b"HTTP/1.1", b"HTTP/9.9"),
    _request(b"/", headers=b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"),     # no websocket library: plain GET
], ids=lambda d: repr(d[:40])[2:-1])
def test_odd_but_parseable_heads_never_5xx(server, data):
    _misuse(server["port"], data, ok=(200, 400, 404, 405, 426, 431))


def test_many_small_headers_are_fine(server):
    r = _parse(_exchange(server["port"], _request(b"/web/main.js", headers=b"".join(
        b"X-H%d: v\r\n" % i for i in range(100)))))
    assert r[0] == 200 and r[2] == b"console.log('main');"


# --------------------------------------------------------------------------- Range and HEAD on a 5 GiB file

@pytest.fixture
def opens(monkeypatch):
    """Every file Starlette's FileResponse opens while the test runs (the server shares this process)."""
    import anyio
    seen: list[str] = []
    real = anyio.open_file

    async def recording(file, *args, **kwargs):
        seen.append(str(file))
        return await real(file, *args, **kwargs)

    monkeypatch.setattr(anyio, "open_file", recording)
    return seen


def test_head_on_large_files_reads_nothing(server, opens):
    p = server["port"]
    for target in ("/models/default.gguf", "/web/main.js", "/pyodide/pyodide.mjs"):
        t0 = time.monotonic()
        r = _get(p, target, method="HEAD")
        assert r.status == 200 and r.data == b"" and r.getheader("content-security-policy"), target
        assert time.monotonic() - t0 < 1.0
    r = _get(p, "/models/default.gguf", method="HEAD")
    assert int(r.getheader("content-length")) == BIG and r.getheader("accept-ranges") == "bytes"
    r = _get(p, "/models/default.gguf", {"Range": f"bytes={MARK_AT}-"}, method="HEAD")
    assert r.status == 206 and r.getheader("content-range") == f"bytes {MARK_AT}-{BIG - 1}/{BIG}"
    assert opens == []


def test_range_past_4_gib(server):
    p = server["port"]
    cases = [
        ("bytes=0-3", b"GGUF", f"bytes 0-3/{BIG}"),
        (f"bytes={MARK_AT}-{MARK_AT + len(MARK) - 1}", MARK, f"bytes {MARK_AT}-{MARK_AT + len(MARK) - 1}/{BIG}"),
        (f"bytes={MARK_AT - 2}-{MARK_AT + 1}", b"\0\0PA", None),
        ("bytes=-5", b"\0" * 5, f"bytes {BIG - 5}-{BIG - 1}/{BIG}"),
        (f"bytes={BIG - 2}-{10 ** 30}", b"\0\0", f"bytes {BIG - 2}-{BIG - 1}/{BIG}"),    # end clamped
        (f"bytes={2 ** 32}-{2 ** 32}", b"\0", f"bytes {2 ** 32}-{2 ** 32}/{BIG}"),
    ]
    for rng, body, content_range in cases:
        r = _get(p, "/models/default.gguf", {"Range": rng})
        assert (r.status, r.data) == (206, body), rng
        assert int(r.getheader("content-length")) == len(body)
        if content_range:
            assert r.getheader("content-range") == content_range
        assert r.getheader("content-security-policy") and r.getheader("x-model-name") == "big.gguf"


def test_range_multipart(server):
    r = _get(server["port"], "/models/default.gguf", {"Range": f"bytes=0-3,{MARK_AT}-{MARK_AT + len(MARK) - 1}"})
    assert r.status == 206 and r.getheader("content-type").startswith("multipart/byteranges; boundary=")
    assert b"GGUF" in r.data and MARK in r.data and len(r.data) == int(r.getheader("content-length"))


@pytest.mark.parametrize("rng", [f"bytes={BIG}-", f"bytes={BIG}-{BIG + 10}", f"bytes={10 ** 20}-", "bytes=-0"])
def test_range_not_satisfiable_is_416(server, rng):
    r = _get(server["port"], "/models/default.gguf", {"Range": rng})
    assert r.status == 416 and r.getheader("content-range") == f"bytes */{BIG}"
    assert r.getheader("content-security-policy")


@pytest.mark.parametrize("rng", ["bytes=abc", "items=0-3", "bytes=5-3", "bytes=--1", "bytes=" + "0-0," * 101,
                                 "bytes=" + "1" * 5000 + "-", "bytes=\u0661-\u0662"])
def test_odd_ranges_never_5xx(server, rng):
    """Malformed or excessive Range headers: a 400, or the whole file (200; only its head is read here)."""
    data = _request(b"/models/default.gguf", headers=b"Range: " + rng.encode() + b"\r\n")
    code, hdrs, _ = _parse(_exchange(server["port"], data, timeout=3, max_bytes=4096))
    assert code in (200, 206, 400, 416) and "content-security-policy" in hdrs, (rng[:40], code)


def test_range_with_stale_if_range_gets_the_whole_file(server):
    data = _request(b"/models/default.gguf", headers=b'Range: bytes=0-3\r\nIf-Range: "stale"\r\n')
    code, hdrs, _ = _parse(_exchange(server["port"], data, timeout=3, max_bytes=4096))
    assert code == 200 and int(hdrs["content-length"]) == BIG


def test_downloads_dropped_midway(server):
    """Twenty clients start the 5 GiB download, take 256 KiB and hang up (half with a reset)."""
    p = server["port"]
    for i in range(20):
        s = socket.create_connection((HOST, p), timeout=5)
        s.sendall(_request(b"/models/default.gguf"))
        got, deadline = 0, time.monotonic() + 5
        while got < 256 * 1024 and time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += len(chunk)
        assert got >= 256 * 1024
        if i % 2:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        s.close()


# --------------------------------------------------------------------------- slow clients

def _closed_by_server(s: socket.socket) -> bool:
    r, _, _ = select.select([s], [], [], 0)
    if not r:
        return False
    try:
        return s.recv(4096) == b""
    except (ConnectionResetError, BlockingIOError):
        return True


def test_slow_loris_heads_are_cut_off_and_others_still_served(server):
    """30 connections trickle a header byte every 0.1 s, and 10 more send nothing at all. While they
    do, GET / is answered promptly; each is closed by the server soon after the head deadline."""
    p = server["port"]
    socks = [socket.create_connection((HOST, p), timeout=5) for _ in range(40)]
    for s in socks[:30]:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    closed_at: dict[int, float] = {}
    t0 = time.monotonic()
    try:
        for rnd in range(60):                                   # at most 6 s
            for i, s in enumerate(socks):
                if i in closed_at:
                    continue
                if _closed_by_server(s):
                    closed_at[i] = time.monotonic() - t0
                elif i < 30:
                    try:
                        s.sendall(b"a")
                    except OSError:
                        closed_at[i] = time.monotonic() - t0
            if rnd % 5 == 0:
                _alive(p)
            if len(closed_at) == len(socks):
                break
            time.sleep(0.1)
    finally:
        for s in socks:
            s.close()
    assert len(closed_at) == len(socks), f"{len(socks) - len(closed_at)} slow connections still open after 6 s"
    assert max(closed_at.values()) < HEADER_TIMEOUT + 2


def test_slow_body_and_idle_keep_alive_are_closed(server):
    """A GET that announces a body and trickles it gets its answer, then the connection is closed; so is
    a keep-alive connection whose next head trickles in."""
    p = server["port"]
    with socket.create_connection((HOST, p), timeout=5) as s:
        s.sendall(b"GET /web/main.js HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nx")
        got, closed, t0 = b"", False, time.monotonic()
        while time.monotonic() - t0 < HEADER_TIMEOUT + 3:
            r, _, _ = select.select([s], [], [], 0.1)
            if r:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                got += chunk
            try:
                s.sendall(b"x")
            except OSError:
                closed = True
                break
        assert got.startswith(b"HTTP/1.1 200") and b"console.log('main');" in got
        assert closed
    with socket.create_connection((HOST, p), timeout=5) as s:
        s.sendall(b"GET /web/main.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        t0, closed = time.monotonic(), False
        while time.monotonic() - t0 < HEADER_TIMEOUT + 3:
            time.sleep(0.1)
            if _closed_by_server(s):
                closed = True
                break
            try:
                s.sendall(b"G")     # the next head, one byte at a time: stops uvicorn's keep-alive timer
            except OSError:
                closed = True
                break
        assert closed


def test_keep_alive_still_works(server):
    c = http.client.HTTPConnection(HOST, server["port"], timeout=5)
    try:
        for _ in range(3):
            c.request("GET", "/web/main.js")
            r = c.getresponse()
            assert r.status == 200 and r.read() == b"console.log('main');"
            time.sleep(HEADER_TIMEOUT / 4)
    finally:
        c.close()
