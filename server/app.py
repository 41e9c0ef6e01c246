"""Starlette app for the lab's assets. Every response carries the security headers; only GET and HEAD
are answered; paths are resolved and must stay inside their folder.

`server_config` is how it is served (`serve`, and the tests in tests/server/test_load.py and
test_misuse.py): uvicorn's h11 protocol, with a deadline on request heads (slow-loris connections are
closed) and the security headers on uvicorn's own 400."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
)
from starlette.routing import Route

from lab import __version__
from lab.settings import (
    DEFAULT_CTX,
    EMBEDDER,
    MAX_CANDIDATES,
    MAX_NEW,
    MIN_CTX,
    PERPLEXITY_CTX,
    PERPLEXITY_MAX_CTX,
    PERPLEXITY_MIN_CTX,
    SCRATCH_PRESETS,
    TOKENIZER,
    TRAINING,
    Settings,
)

from . import wheel

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
WGSL = ROOT / "wgsl"
PYODIDE = WEB / "node_modules" / "pyodide"
REFERENCE = ROOT / "reference"   # the verification card's fixtures (scripts/make_verify_fixtures.py), read-only

CSP = ("default-src 'self'; connect-src 'self'; worker-src 'self'; "
       "script-src 'self' 'wasm-unsafe-eval' 'unsafe-eval'; style-src 'self'; img-src 'self' data:; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
# The browser peer's bench page (scripts/peer, `lab bench --backend wllama`), mounted at /peer/ only when a bench asks
# (create_app's peer_dir): never part of the lab page (shared/DESIGN.md, invariant 10). wllama starts its worker and
# its pthreads from Blob URLs, which the lab's CSP refuses, so its responses alone carry this CSP; the others of
# HEADERS (cross-origin isolation among them, which its multi-thread build needs) are the lab's.
PEER_PREFIX = "/peer/"
PEER_CSP = ("default-src 'self'; connect-src 'self'; worker-src 'self' blob:; "
            "script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; img-src 'self' data:; "
            "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PEER_HEADERS = {**HEADERS, "Content-Security-Policy": PEER_CSP}
MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
        ".css": "text/css", ".json": "application/json", ".wgsl": "text/plain; charset=utf-8",
        ".whl": "application/zip", ".gguf": "application/octet-stream", ".zip": "application/zip",
        ".html": "text/html; charset=utf-8", ".map": "application/json", ".svg": "image/svg+xml",
        ".f32": "application/octet-stream"}

log = logging.getLogger("lab.server")
HEADER_TIMEOUT_S = 10.0     # a request head must arrive in full within this of the connection opening
MAX_PATH = 1024             # longer relative paths, or a name over 255 bytes, are refused before any lookup
_HEADER_NAMES = {h.lower().encode() for h in HEADERS}
_RAW_HEADERS = [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]
_PEER_RAW_HEADERS = [(k.lower().encode(), v.encode()) for k, v in PEER_HEADERS.items()]


def _safe(base: Path, rel: str, hidden: tuple[str, ...] = ()) -> tuple[Path, os.stat_result] | None:
    """The regular file at base/rel (base already resolved) and its stat, or None when rel escapes base
    (`..` in any encoding, absolute paths, backslashes), names a dot-file or a folder in `hidden`, or
    names no regular file. rel is the path as uvicorn decoded it, once: a `%` left in it means a second
    layer of encoding (%252e), refused rather than decoded again. Symlinks are followed, and the file
    they lead to must itself be inside base and not hidden. Never raises: a name too long, a symlink
    loop or a path the OS refuses is a plain miss."""
    if not rel or len(rel) > MAX_PATH or rel.startswith("/"):
        return None
    if any(c in "\\%" or ord(c) < 0x20 or ord(c) == 0x7f for c in rel):
        return None
    parts = rel.split("/")
    if any(not part or part.startswith(".") or len(part.encode("utf-8", "replace")) > 255 for part in parts):
        return None
    try:
        target = (base / rel).resolve(strict=True)
        inside = target.relative_to(base).parts
        if not inside or inside[0] in hidden or any(part.startswith(".") for part in inside):
            return None
        st = target.stat()
    except (OSError, RuntimeError, ValueError):     # missing, too long, a loop, outside base
        return None
    return (target, st) if stat.S_ISREG(st.st_mode) else None


def _file(base: Path, rel: str, hidden: tuple[str, ...] = ()) -> Response:
    found = _safe(base, rel, hidden)
    if found is None:
        return PlainTextResponse("not found", status_code=404)
    target, st = found
    return FileResponse(target, media_type=MIME.get(target.suffix, "application/octet-stream"), stat_result=st)


def create_app(model_path: Path, *, web_dir: Path | None = None, wgsl_dir: Path | None = None,
               pyodide_dir: Path | None = None, reference_dir: Path | None = None,
               peer_dir: Path | None = None) -> Starlette:
    """The app. The served folders default to the repository's web/, wgsl/ and web/node_modules/pyodide
    (tests point them at a scratch tree); web/node_modules itself is never served under /web. `model_path`: the
    file the page offers as its default model (`lab serve` passes lab.host.models' default); the page names it
    only when it exists. `peer_dir`: the browser peer's bench page (scripts/peer, with its node_modules), served at
    /peer/ with PEER_HEADERS; None (`lab serve`, the lab's own benches and tests): no /peer/ route at all."""
    model = Path(model_path)
    web_root = Path(web_dir or WEB).resolve()
    wgsl_root = Path(wgsl_dir or WGSL).resolve()
    pyodide_root = Path(pyodide_dir or web_root / "node_modules" / "pyodide").resolve()
    reference_root = Path(reference_dir or REFERENCE).resolve()
    templates = Environment(loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
                            autoescape=select_autoescape(["html"]))
    wheel_bytes = wheel.build()

    async def index(request: Request) -> Response:
        html = templates.get_template("index.html").render(
            version=__version__, wheel=f"/wheel/{wheel.FILENAME}",
            default_model=model.name if model.exists() else None,
            sampler=Settings(), max_candidates=MAX_CANDIDATES,    # the sampling inputs' defaults and top-k bound
            max_new=MAX_NEW, default_ctx=DEFAULT_CTX, min_ctx=MIN_CTX,    # the context input's default and minimum
            # the perplexity window's default and bounds
            perplexity_ctx=PERPLEXITY_CTX, perplexity_min_ctx=PERPLEXITY_MIN_CTX, perplexity_max_ctx=PERPLEXITY_MAX_CTX,
            training=TRAINING,          # the Training card's defaults and bounds
            presets=SCRATCH_PRESETS,    # ... and the shapes of a model from scratch
            embedder=EMBEDDER,          # the Retrieval card's tuning: its defaults and bounds
            tokenizer=TOKENIZER)        # the Tokenizer card's vocabulary bounds and text cap
        return HTMLResponse(html)

    async def web(request: Request) -> Response:
        return _file(web_root, request.path_params["path"], hidden=("node_modules",))

    async def pyodide(request: Request) -> Response:
        return _file(pyodide_root, request.path_params["path"])

    async def wgsl_index(request: Request) -> Response:
        return JSONResponse(sorted(p.name for p in wgsl_root.glob("*.wgsl") if _safe(wgsl_root, p.name)))

    async def wgsl(request: Request) -> Response:
        return _file(wgsl_root, request.path_params["path"])

    async def reference(request: Request) -> Response:
        return _file(reference_root, request.path_params["path"])

    async def lab_wheel(request: Request) -> Response:
        if request.path_params["name"] != wheel.FILENAME:
            return PlainTextResponse("not found", status_code=404)
        return Response(wheel_bytes, media_type="application/zip")

    async def default_model(request: Request) -> Response:
        # Ranges (206, 416 with `bytes */size`, multipart) and HEAD without opening the file come from
        # Starlette's FileResponse; offsets are Python ints, so files past 4 GiB are fine.
        try:
            st = model.stat()
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            return PlainTextResponse("the default model is not installed: run `make setup`", status_code=404)
        return FileResponse(model, media_type="application/octet-stream", stat_result=st,
                            headers={"X-Model-Name": model.name})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": __version__, "wheel": wheel.FILENAME,
                             "default_model": model.name if model.exists() else None})

    methods = ["GET", "HEAD"]
    routes = [
        Route("/", index, methods=methods),
        Route("/version.json", version, methods=methods),
        Route("/web/{path:path}", web, methods=methods),
        Route("/pyodide/{path:path}", pyodide, methods=methods),
        Route("/wgsl/index.json", wgsl_index, methods=methods),
        Route("/wgsl/{path:path}", wgsl, methods=methods),
        Route("/wheel/{name}", lab_wheel, methods=methods),
        Route("/reference/{path:path}", reference, methods=methods),
        Route("/models/default.gguf", default_model, methods=methods),
    ]
    if peer_dir is not None:
        peer_root = Path(peer_dir).resolve()

        async def peer(request: Request) -> Response:
            return _file(peer_root, request.path_params.get("path") or "index.html")

        routes += [Route(PEER_PREFIX, peer, methods=methods), Route(PEER_PREFIX + "{path:path}", peer, methods=methods)]
    app = Starlette(routes=routes)
    return _Guard(app, peer=peer_dir is not None)


class _Guard:
    """ASGI wrapper: refuses methods other than GET/HEAD before routing (405 everywhere, never a body
    read), adds the security headers to every response (PEER_HEADERS under /peer/ when the peer page is
    mounted, HEADERS everywhere else), and logs method, path and status only."""

    def __init__(self, app, peer: bool = False) -> None:
        self.app = app
        self.peer = peer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {}
        raw = _PEER_RAW_HEADERS if self.peer and scope.get("path", "").startswith(PEER_PREFIX) else _RAW_HEADERS

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _HEADER_NAMES]
                message = {**message, "headers": headers + raw}
            await send(message)

        if scope["method"] not in ("GET", "HEAD"):
            resp = PlainTextResponse("method not allowed: this server only serves assets", status_code=405,
                                     headers={"Allow": "GET, HEAD"})
            await resp(scope, receive, send_with_headers)
        elif any(ord(c) < 0x20 or ord(c) == 0x7f for c in scope.get("path", "")):
            # %00-%1f, %7f: no served name has them, and Starlette's route patterns end in `$`, which
            # matches before a final newline: /web/main.js%0a would otherwise be answered as /web/main.js.
            await PlainTextResponse("bad request: control character in the path", status_code=400)(
                scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)
        # The query string and any body are never logged; control and non-ASCII characters in the path
        # (%0a, %1b...) are escaped, so a request cannot forge or recolour a log line.
        path = scope.get("path", "").encode("unicode_escape").decode("ascii")
        log.info("%s %s %s", scope["method"], path, status.get("code"))


def _protocol(header_timeout: float) -> type:
    """uvicorn's h11 protocol, changed in two ways:

    - a request head must arrive in full within `header_timeout` seconds of the connection opening or
      of the previous response ending, or the connection is closed: a slow-loris client, trickling a
      header byte at a time (which also stops uvicorn's keep-alive timer), cannot hold it forever;
    - uvicorn's own 400 (malformed request line or header, bytes outside ASCII or controls in the
      target, an incomplete head over h11's 16 KiB) carries the security headers like every other answer."""
    import h11
    from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

    class Protocol(H11Protocol):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer = None

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(header_timeout, self._head_timeout)

        def _head_timeout(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()      # no complete request head in time: no response is owed

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def send_400_response(self, msg: str) -> None:
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")] + _RAW_HEADERS
            for event in (h11.Response(status_code=400, headers=headers, reason=STATUS_PHRASES[400]),
                          h11.Data(data=msg.encode("ascii")), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return Protocol


def server_config(app, host: str = "127.0.0.1", port: int = 8000, header_timeout: float = HEADER_TIMEOUT_S,
                  **kwargs):
    """The uvicorn.Config the lab is served with (h11, the protocol above, no access log)."""
    import uvicorn
    kwargs = {"log_level": "warning", "access_log": False, **kwargs}
    return uvicorn.Config(app, host=host, port=port, http=_protocol(header_timeout), **kwargs)


def serve(model_path: Path, host: str = "127.0.0.1", port: int = 8000) -> None:
    import uvicorn
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = create_app(model_path)
    print(f"llm-lab {__version__}: open http://{host}:{port}/ in a browser with WebGPU", flush=True)
    uvicorn.Server(server_config(app, host, port)).run()
