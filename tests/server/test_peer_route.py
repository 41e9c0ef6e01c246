"""The browser peer's bench page (scripts/peer, wllama) is never part of the lab page (shared/DESIGN.md, invariant 10).

- Without peer_dir (`lab serve`, every lab bench and test) there is no /peer/ route, and no lab route serves a file of
  scripts/peer under any name.
- With it (`lab bench --backend wllama` only) /peer/ serves the page with its own CSP and cross-origin isolation,
  while every lab route keeps exactly the lab's headers.
- Nothing the lab page loads (its template, web/, the wheel) names wllama or /peer/, and the package is not
  installed where the lab page's server looks (web/node_modules).
"""

from __future__ import annotations

import io
import zipfile

import pytest
from starlette.testclient import TestClient

from server import wheel
from server.app import CSP, HEADERS, PEER_CSP, ROOT, WEB, create_app

PEER = ROOT / "scripts" / "peer"
WASM = PEER / "node_modules" / "@wllama" / "wllama" / "esm" / "wasm" / "wllama.wasm"

# The lab page's headers, written out: a change to them must be made here too, on purpose.
LAB_CSP = ("default-src 'self'; connect-src 'self'; worker-src 'self'; "
           "script-src 'self' 'wasm-unsafe-eval' 'unsafe-eval'; style-src 'self'; img-src 'self' data:; "
           "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
LAB_HEADERS = {
    "content-security-policy": LAB_CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-embedder-policy": "require-corp",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=()",
}
LAB_PATHS = ["/", "/version.json", "/web/main.js", "/wgsl/index.json", f"/wheel/{wheel.FILENAME}"]


def _peer_files() -> list[str]:
    """scripts/peer's own files and, where npm installed the package, what the page loads of it (esm/), relative to
    scripts/peer."""
    own = [p for p in PEER.iterdir() if p.is_file()]
    esm = list((PEER / "node_modules" / "@wllama" / "wllama" / "esm").rglob("*.*js")) + [WASM]
    return sorted(p.relative_to(PEER).as_posix() for p in own + esm if p.is_file())


@pytest.fixture(scope="module")
def lab(smollm2_path):
    return TestClient(create_app(smollm2_path))


@pytest.fixture(scope="module")
def bench(smollm2_path):
    return TestClient(create_app(smollm2_path, peer_dir=PEER))


def test_the_lab_headers_are_the_written_ones():
    assert CSP == LAB_CSP
    assert {k.lower(): v for k, v in HEADERS.items()} == LAB_HEADERS


@pytest.mark.parametrize("path", LAB_PATHS)
def test_lab_routes_carry_the_lab_headers_with_or_without_the_peer(lab, bench, path):
    for client in (lab, bench):
        r = client.get(path)
        assert r.status_code == 200, path
        assert {k: r.headers.get(k) for k in LAB_HEADERS} == LAB_HEADERS, path


def test_no_peer_route_unless_the_bench_asks(lab):
    for path in ["/peer/", "/peer/index.html", "/peer/peer.js", "/peer/package.json",
                 "/peer/node_modules/@wllama/wllama/esm/index.js"]:
        assert lab.get(path).status_code == 404, path


def test_no_lab_route_serves_a_peer_file(lab, bench):
    files = _peer_files()
    assert {"index.html", "peer.js", "package.json"} <= set(files)
    for client in (lab, bench):
        for rel in files:
            body = (PEER / rel).read_bytes()
            for prefix in ("/web/", "/pyodide/", "/wgsl/", "/reference/", "/wheel/"):
                for name in (rel, f"../scripts/peer/{rel}", f"scripts/peer/{rel}", f"node_modules/{rel}"):
                    # web/ has a package.json of its own: a name may exist there, the peer's bytes may not
                    r = client.get(prefix + name)
                    assert r.status_code == 404 or r.content != body, (prefix + name, r.status_code)


def test_the_peer_page_when_the_bench_asks(bench):
    page = bench.get("/peer/")
    assert page.status_code == 200 and "peer.js" in page.text
    assert page.text == bench.get("/peer/index.html").text
    js = bench.get("/peer/peer.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    for r in (page, js):
        assert r.headers["content-security-policy"] == PEER_CSP
        # cross-origin isolated, so wllama takes its multi-thread build
        assert r.headers["cross-origin-opener-policy"] == "same-origin"
        assert r.headers["cross-origin-embedder-policy"] == "require-corp"
    # Its CSP lets Blob workers run (wllama's), and names no other host.
    assert "worker-src 'self' blob:" in PEER_CSP and "http" not in PEER_CSP and "*" not in PEER_CSP
    assert "blob:" not in CSP
    assert bench.get("/peer/../server/app.py").status_code == 404
    assert bench.get("/peer/%2e%2e/server/app.py").status_code == 404


def test_the_package_when_installed_is_served_to_the_bench_only(lab, bench):
    if not WASM.exists():
        pytest.skip("scripts/peer's package is not installed (npm ci in scripts/peer)")
    rel = WASM.relative_to(PEER).as_posix()
    r = bench.head(f"/peer/{rel}")
    assert r.status_code == 200 and r.headers["content-type"] == "application/wasm"
    assert lab.head(f"/peer/{rel}").status_code == 404


def test_nothing_the_lab_page_loads_names_the_peer(lab):
    assert not (WEB / "node_modules" / "@wllama").exists()
    sources = {"/": lab.get("/").text}
    sources |= {str(p): p.read_text() for p in WEB.glob("*.js")}
    sources |= {str(p): p.read_text() for p in (ROOT / "server" / "templates").glob("*.html")}
    whl = zipfile.ZipFile(io.BytesIO(lab.get(f"/wheel/{wheel.FILENAME}").content))
    names = whl.namelist()
    assert not [n for n in names if "peer" in n.lower() or "wllama" in n.lower()]
    for name, text in sources.items():
        assert "wllama" not in text.lower() and "/peer/" not in text, name
