"""Starlette app for the lab's assets. Every response carries the security headers; only GET and HEAD
are answered; paths are resolved and must stay inside their folder."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from urllib.parse import unquote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from lab import __version__
from lab.host import models

from . import wheel

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
WGSL = ROOT / "wgsl"
PYODIDE = WEB / "node_modules" / "pyodide"

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
MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
        ".css": "text/css", ".json": "application/json", ".wgsl": "text/plain; charset=utf-8",
        ".whl": "application/zip", ".gguf": "application/octet-stream", ".zip": "application/zip",
        ".html": "text/html; charset=utf-8", ".map": "application/json", ".svg": "image/svg+xml"}

log = logging.getLogger("lab.server")


def _safe(base: Path, rel: str) -> Path | None:
    """The file at base/rel, or None when rel escapes base (plain or percent-encoded `..`, absolute
    paths, backslashes) or names no regular file."""
    rel = unquote(rel)   # a second round catches %252e%252e style double encoding
    if "\\" in rel or "\x00" in rel or rel.startswith("/"):
        return None
    if any(part in ("..", ".") or part.startswith(".") for part in rel.split("/")):
        return None
    target = (base / rel).resolve()
    try:
        target.relative_to(base.resolve())
    except ValueError:
        return None
    return target if target.is_file() else None


def _file(base: Path, rel: str) -> Response:
    target = _safe(base, rel)
    if target is None:
        return PlainTextResponse("not found", status_code=404)
    return FileResponse(target, media_type=MIME.get(target.suffix, "application/octet-stream"))


def create_app(model_path: Path | None = None) -> Starlette:
    model = Path(model_path) if model_path else models.path(models.DEFAULT)
    templates = Environment(loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
                            autoescape=select_autoescape(["html"]))
    wheel_bytes = wheel.build()

    async def index(request: Request) -> Response:
        html = templates.get_template("index.html").render(
            version=__version__, wheel=f"/wheel/{wheel.FILENAME}",
            default_model=model.name if model.exists() else None)
        return HTMLResponse(html)

    async def web(request: Request) -> Response:
        rel = request.path_params["path"]
        if rel.split("/")[0] == "node_modules":
            return PlainTextResponse("not found", status_code=404)
        return _file(WEB, rel)

    async def pyodide(request: Request) -> Response:
        return _file(PYODIDE, request.path_params["path"])

    async def wgsl_index(request: Request) -> Response:
        return JSONResponse(sorted(p.name for p in WGSL.glob("*.wgsl")))

    async def wgsl(request: Request) -> Response:
        return _file(WGSL, request.path_params["path"])

    async def lab_wheel(request: Request) -> Response:
        if request.path_params["name"] != wheel.FILENAME:
            return PlainTextResponse("not found", status_code=404)
        return Response(wheel_bytes, media_type="application/zip")

    async def default_model(request: Request) -> Response:
        if not model.exists():
            return PlainTextResponse(f"the default model is not installed: run `make setup`", status_code=404)
        return FileResponse(model, media_type="application/octet-stream",
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
        Route("/models/default.gguf", default_model, methods=methods),
    ]
    app = Starlette(routes=routes)
    return _Guard(app)


class _Guard:
    """ASGI wrapper: refuses methods other than GET/HEAD before routing (405 everywhere, never a body
    read), adds the security headers to every response, and logs method, path and status only."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {}

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.decode().lower() not in {h.lower() for h in HEADERS}]
                headers += [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        if scope["method"] not in ("GET", "HEAD"):
            resp = PlainTextResponse("method not allowed: this server only serves assets", status_code=405,
                                     headers={"Allow": "GET, HEAD"})
            await resp(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)
        # The query string and any body are never logged.
        log.info("%s %s %s", scope["method"], scope.get("path", ""), status.get("code"))


def serve(host: str = "127.0.0.1", port: int = 8000, model_path: Path | None = None) -> None:
    import uvicorn
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = create_app(model_path)
    print(f"llm-lab {__version__}: open http://{host}:{port}/ in a browser with WebGPU", flush=True)
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning")
