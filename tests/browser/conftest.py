"""Headless Chromium (Debian's, WebGPU on SwiftShader) driven by Playwright against the real server.

Every request the page makes is recorded, and so is every console message, so tests can assert that
nothing left the origin and that no error was logged."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import pytest
import uvicorn

from server.app import create_app

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--enable-unsafe-webgpu", "--no-sandbox", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync", "--use-vulkan=swiftshader", "--use-webgpu-adapter=swiftshader"]
BOOT_TIMEOUT_MS = 120_000


@pytest.fixture(scope="session")
def server_url(smollm2_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(smollm2_path), host="127.0.0.1", port=port, log_level="warning",
                            access_log=False)
    srv = uvicorn.Server(config)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 30
    while not srv.started:
        if time.time() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(10)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@dataclass
class Lab:
    page: object
    url: str
    requests: list[str] = field(default_factory=list)
    console: list[tuple[str, str]] = field(default_factory=list)

    def errors(self) -> list[str]:
        return [text for kind, text in self.console if kind == "error"]

    def wait_ready(self) -> None:
        self.page.wait_for_selector('[data-testid="gpu-selftest"]:not([data-state="pending"])', timeout=BOOT_TIMEOUT_MS)

    def foreign_requests(self) -> list[str]:
        return [u for u in self.requests if not (u.startswith(self.url + "/") or u == self.url)
                and not u.startswith("data:")]


@pytest.fixture
def lab(browser, server_url):
    context = browser.new_context()
    page = context.new_page()
    lab = Lab(page, server_url)
    context.on("request", lambda r: lab.requests.append(r.url))
    page.on("console", lambda m: lab.console.append((m.type, m.text)))
    page.on("pageerror", lambda e: lab.console.append(("error", str(e))))
    page.goto(server_url + "/")
    yield lab
    context.close()
