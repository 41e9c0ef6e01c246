"""/reference/...: the verification card's fixtures, served read-only from reference/ like every other asset."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from server.app import CSP, REFERENCE, create_app


@pytest.fixture(scope="module")
def client(smollm2_path):
    return TestClient(create_app(smollm2_path))


def test_index_and_fixtures_are_served(client):
    r = client.get("/reference/index.json")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.headers["content-security-policy"] == CSP
    index = r.json()
    assert index == json.loads((REFERENCE / "index.json").read_text())
    entry = next(iter(index["models"].values()))
    for ref in entry["references"].values():
        f = client.get(f"/reference/{ref['logits']}")
        assert f.status_code == 200 and f.headers["content-type"] == "application/octet-stream"
        assert len(f.content) == 4 * entry["n_vocab"]
    k = client.get("/reference/kernels.json")
    assert k.status_code == 200 and k.json()["cases"]


@pytest.mark.parametrize("path", ["/reference/../server/app.py", "/reference/%2e%2e/server/app.py",
                                  "/reference/", "/reference/missing.json", "/reference/.hidden"])
def test_nothing_outside_or_missing(client, path):
    assert client.get(path).status_code == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_read_only(client, method):
    assert client.request(method, "/reference/index.json").status_code == 405


def test_served_from_another_folder(tmp_path, smollm2_path):
    (tmp_path / "index.json").write_text('{"models": {}}')
    c = TestClient(create_app(smollm2_path, reference_dir=tmp_path))
    assert c.get("/reference/index.json").json() == {"models": {}}
    assert c.get("/reference/kernels.json").status_code == 404
