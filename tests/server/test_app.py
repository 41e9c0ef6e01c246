"""The asset server: routes, MIME types, security headers, methods, traversal, and what it logs."""

from __future__ import annotations

import io
import logging
import re
import zipfile

import pytest
from starlette.testclient import TestClient

from lab.settings import Settings
from server import wheel
from server.app import CSP, create_app


@pytest.fixture(scope="module")
def client(smollm2_path):
    return TestClient(create_app(smollm2_path))


REQUIRED = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-embedder-policy": "require-corp",
}


def _assert_headers(r):
    for k, v in REQUIRED.items():
        assert r.headers.get(k) == v, (r.url, k, r.headers.get(k))


def test_csp_names_no_other_host():
    assert "http" not in CSP and "*" not in CSP
    for directive in ("default-src 'self'", "connect-src 'self'", "worker-src 'self'",
                      "script-src 'self' 'wasm-unsafe-eval' 'unsafe-eval'"):
        assert directive in CSP


@pytest.mark.parametrize("path,mime", [
    ("/", "text/html"),
    ("/web/main.js", "text/javascript"),
    ("/web/worker.js", "text/javascript"),
    ("/web/style.css", "text/css"),
    ("/web/bench.js", "text/javascript"),
    ("/pyodide/pyodide.mjs", "text/javascript"),
    ("/pyodide/pyodide.asm.wasm", "application/wasm"),
    ("/pyodide/pyodide-lock.json", "application/json"),
    ("/pyodide/python_stdlib.zip", "application/zip"),
    ("/wgsl/index.json", "application/json"),
    ("/wgsl/elementwise.wgsl", "text/plain"),
    ("/version.json", "application/json"),
    (f"/wheel/{wheel.FILENAME}", "application/zip"),
])
def test_routes_and_mime(client, path, mime):
    r = client.get(path)
    assert r.status_code == 200, path
    assert r.headers["content-type"].startswith(mime)
    _assert_headers(r)


def test_page_is_a_module_and_names_the_test_ids(client):
    html = client.get("/").text
    assert '<script type="module" src="/web/main.js">' in html
    for tid in ("model-file", "model-info", "gpu-info", "gpu-selftest", "load-error"):
        assert f'data-testid="{tid}"' in html
    assert "http://" not in html and "https://" not in html


def test_sampling_inputs_default_to_the_sampler_settings(client):
    html = client.get("/").text
    s = Settings()
    for tid, value in (("temperature", s.temperature), ("top-p", s.top_p), ("top-k", s.top_k), ("seed", s.seed)):
        assert re.search(rf'data-testid="{tid}"[^>]* value="{value}"', html), tid
    assert bool(re.search(r'data-testid="greedy"[^>]*checked', html)) == s.greedy


def test_default_model_served_with_range(client, smollm2_path):
    r = client.get("/models/default.gguf", headers={"Range": "bytes=0-3"})
    assert r.status_code == 206 and r.content == b"GGUF"
    h = client.head("/models/default.gguf")
    assert h.status_code == 200 and int(h.headers["content-length"]) == smollm2_path.stat().st_size
    assert h.content == b""
    _assert_headers(h)


def test_missing_default_model_is_a_clear_404(tmp_path):
    c = TestClient(create_app(tmp_path / "absent.gguf"))
    r = c.get("/models/default.gguf")
    assert r.status_code == 404 and "make setup" in r.text
    _assert_headers(r)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("path", ["/", "/web/main.js", "/models/default.gguf", "/nowhere"])
def test_other_methods_are_405(client, method, path):
    r = client.request(method, path, content=b"secret conversation")
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, HEAD"
    _assert_headers(r)


@pytest.mark.parametrize("path", [
    "/web/../server/app.py", "/web/%2e%2e/server/app.py", "/web/%2E%2E/%2E%2E/etc/passwd",
    "/web/..%2fserver%2fapp.py", "/web/%252e%252e/server/app.py", "/wgsl/../lab/gpu/__init__.py",
    "/pyodide/../../package.json", "/web/node_modules/pyodide/pyodide.mjs", "/web/.hidden",
    "/wgsl/..%5c..%5cpyproject.toml", "/web//etc/passwd", "/wheel/../pyproject.toml",
    "/wheel/llm_lab-0.0.0-py3-none-any.whl", "/web/", "/web/nothing.js",
])
def test_traversal_and_unknown_paths_are_404(client, path):
    r = client.get(path)
    assert r.status_code == 404, path
    assert b"import" not in r.content
    _assert_headers(r)


def test_wheel_holds_lab_and_no_native_only_code(client):
    z = zipfile.ZipFile(io.BytesIO(client.get(f"/wheel/{wheel.FILENAME}").content))
    names = set(z.namelist())
    assert "lab/__init__.py" in names and "lab/gpu/browser.py" in names and "lab/worker/router.py" in names
    assert not any(n.startswith("lab/host/") for n in names)    # reference, native backend, CLI, benchmarks
    assert "lab/ops/matmul.py" in names and "lab/text/tokenizer/bpe.py" in names
    assert f"llm_lab-{wheel.VERSION}.dist-info/RECORD" in names
    assert wheel.build() == wheel.build()   # reproducible bytes


def test_log_has_no_query_string_or_body(client, caplog):
    with caplog.at_level(logging.INFO, logger="lab.server"):
        client.get("/web/main.js?q=my+secret+question")
        client.post("/", content=b"another secret")
    text = caplog.text
    assert "/web/main.js" in text
    assert "secret" not in text and "q=" not in text
