"""Headless Chromium (Debian's, WebGPU on SwiftShader, or $LAB_CHROMIUM) driven by Playwright against the real server.

Every request the page makes is recorded, and so is every console message, so tests can assert that
nothing left the origin and that no error was logged."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import uvicorn
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from lab.host.bench.browser import browser_command
from server.app import create_app

# Debian's Chromium on SwiftShader, unless LAB_CHROMIUM / LAB_CHROMIUM_FLAGS name another browser and flag set
# (scripts/device_browser.sh runs these tests on a GPU's adapter that way).
CHROMIUM, ARGS = browser_command()
BOOT_TIMEOUT_MS = 120_000
LOAD_MS = 600_000         # a model load on SwiftShader, with the machine's two cores shared
# the page counts a card on screen (web/navigator.js renderNavigator marks its navigator entry)
ON_SCREEN_JS = "id => document.querySelector(`#navigator [data-card=${id}]`).classList.contains('on-screen')"


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
    settings: list = field(default_factory=list)    # every setting's value after the first load (`take`)

    def errors(self) -> list[str]:
        return [text for kind, text in self.console if kind == "error"]

    def wait_ready(self) -> None:
        self.page.wait_for_selector('[data-testid="gpu-selftest"]:not([data-state="pending"])', timeout=BOOT_TIMEOUT_MS)

    def pick(self, path) -> None:
        """Choose a model file in the file input, as a user does."""
        self.page.set_input_files('[data-testid="model-file"]', str(path))

    def wait_loaded(self, name: str, timeout_ms: int = LOAD_MS) -> None:
        """Wait until the model card names `name` and the prompt is enabled; a load that fails says what the page
        said."""
        try:
            self.page.wait_for_function(
                "name => !document.querySelector('[data-testid=prompt]').disabled"
                " && document.querySelector('[data-testid=model-info]').textContent.includes(name)", arg=name,
                timeout=timeout_ms)
        except Exception:
            raise AssertionError(f"{name} did not load; the page says: "
                                 f"{self.page.inner_text('[data-testid=load-error]')!r}; console: {self.console[-5:]}"
                                 ) from None

    def send(self, text: str, max_tokens: int | None = None, timeout_ms: int = LOAD_MS) -> str:
        """Type a prompt (and the reply's length, if given), send it, and wait until the reply is done (stop disabled,
        the timings shown); returns the reply's text."""
        page = self.page
        if max_tokens is not None:
            page.fill('[data-testid="max-tokens"]', str(max_tokens))
        page.fill('[data-testid="prompt"]', text)
        before = page.locator('[data-testid="message"]').count()
        page.click('[data-testid="send"]')
        page.wait_for_function(
            "n => document.querySelectorAll('[data-testid=message]').length >= n + 2"
            " && document.querySelector('[data-testid=stop]').disabled"
            " && document.querySelector('[data-testid=timings]').textContent.length > 0", arg=before,
            timeout=timeout_ms)
        return page.locator('[data-testid="message"]').last.inner_text()

    def foreign_requests(self) -> list[str]:
        return [u for u in self.requests if not (u.startswith(self.url + "/") or u == self.url)
                and not u.startswith("data:")]

    def ids(self) -> list[int]:
        """The token ids of the context strip: the prompt and what the model made of it."""
        return self.page.evaluate("[...document.querySelectorAll('[data-testid=token]')].map(t => Number(t.dataset.id))")

    def cells(self, testid: str, keys: list[str]) -> list[dict]:
        """The `data-*` attributes `keys` of every element with this test id, in page order (as strings)."""
        return self.page.evaluate(
            "([testid, keys]) => [...document.querySelectorAll(`[data-testid=${testid}]`)]"
            ".map(e => Object.fromEntries(keys.map(k => [k, e.dataset[k]])))", [testid, keys])

    def open_panel(self, name: str, timeout_ms: int = 60_000) -> None:
        """Brings the panel's card on screen and waits until the page counts it there (its navigator entry marked
        on-screen): a card computes only while its IntersectionObserver says it is visible (web/navigator.js), and the
        page may still move under a scroll (the pinned strip growing after a reply), so the scroll is repeated until
        the mark shows."""
        # (scrollIntoView itself: Playwright's scroll_into_view_if_needed first waits for the element to be still for
        # two frames, which a busy machine's page did not give it within 30 s)
        page = self.page
        for _ in range(max(1, timeout_ms // 5_000)):
            page.locator(f"[data-panel={name}]").evaluate("e => e.scrollIntoView({block: 'nearest'})")
            try:
                page.wait_for_function(ON_SCREEN_JS, arg=name, timeout=5_000)
                return
            except PlaywrightTimeout:
                continue
        raise AssertionError(f"the {name} card never counted as on screen: {self.card_state(name)}")

    def card_state(self, name: str) -> dict:
        """What a test that waited in vain on a card reports: its navigator marks, where it sits, what it says, the
        page's error line and the console's last lines."""
        return self.page.evaluate("""id => {
            const card = document.getElementById(id), nav = document.querySelector(`#navigator [data-card=${id}]`);
            const r = card.getBoundingClientRect(), err = document.querySelector('[data-testid=load-error]');
            return {nav: nav ? nav.className : null, top: Math.round(r.top), bottom: Math.round(r.bottom),
                    viewport: innerHeight, scroll: Math.round(scrollY), says: card.innerText.slice(0, 300),
                    error: err.hidden ? null : err.textContent}; }""", name) | {"console": self.console[-5:]}

    def wait_in_card(self, name: str, selector: str, timeout_ms: int) -> None:
        """Wait for `selector` inside the card `name`; on a timeout, say where the card stood (card_state)."""
        try:
            self.page.wait_for_selector(f"#{name} {selector}", timeout=timeout_ms)
        except PlaywrightTimeout:
            raise AssertionError(f"{selector} never showed in the {name} card: {self.card_state(name)}") from None


ONE_COLUMN = {"width": 1000, "height": 720}


@contextmanager
def open_lab(browser, url: str, **context_options):
    """A fresh browser context on the lab page, recording every request and console message from the start.
    context_options go to Playwright's new_context (a viewport, for the layout tests).

    The default viewport is one column (under style.css's 1100 px breakpoint) with every panel below the fold: a card
    computes only while it is on screen, and on SwiftShader an inspection after each reply costs a minute or more.
    A test that wants a panel brings it on screen with Lab.open_panel."""
    context_options.setdefault("viewport", ONE_COLUMN)
    context = browser.new_context(**context_options)
    page = context.new_page()
    lab = Lab(page, url)
    context.on("request", lambda r: lab.requests.append(r.url))
    page.on("console", lambda m: lab.console.append((m.type, m.text)))
    page.on("pageerror", lambda e: lab.console.append(("error", str(e))))
    try:
        page.goto(url + "/")
        yield lab
    finally:
        context.close()


@pytest.fixture
def lab(browser, server_url):
    with open_lab(browser, server_url) as lab:
        yield lab


# Every setting a person can change on the page (inputs, boxes, lists, text fields) and its value; the file input aside.
_SETTINGS_JS = """() => [...document.querySelectorAll('input[id], select[id], textarea[id]')]
    .filter(e => e.type !== 'file').map(e => [e.id, e.type === 'checkbox' ? e.checked : e.value])"""
_RESTORE_JS = """(settings) => { for (const [id, v] of settings) {
    const e = document.getElementById(id);
    if (!e || (e.type === 'checkbox' ? e.checked : e.value) === v) continue;
    if (e.type === 'checkbox') e.checked = v; else e.value = v;
    e.dispatchEvent(new Event('input', {bubbles: true}));
    e.dispatchEvent(new Event('change', {bubbles: true})); } }"""


@pytest.fixture(scope="session")
def card_page(browser, server_url, tiny_path):
    """One page for the modules whose tests need a booted page rather than a fresh one (the architectures, the chat, the
    experiments, the hybrids, the worker's kernel checks, the KV card, the layout, the panels, perplexity, retrieval,
    the RoPE demo, the verification card): it
    boots once in each pytest-xdist worker and compiles each kernel once (lab.gpu Device.compiled keeps them in the
    page's worker), where a page of each module's own spent 8-10 s on both on SwiftShader. A module takes it with `take`, which leaves nothing of the module
    before: every setting back to the value it booted with, the file loaded afresh (a new engine, no conversation), the
    logs emptied."""
    with open_lab(browser, server_url) as lab:
        lab.wait_ready()
        lab.pick(tiny_path)          # some settings take their default once a model is loaded (the lens's positions)
        lab.wait_loaded(tiny_path.name)
        lab.settings = lab.page.evaluate(_SETTINGS_JS)
        yield lab


def take(lab: Lab, path, viewport: dict | None = None) -> Lab:
    """`card_page` readied for a module: the viewport set (default ONE_COLUMN), every setting as after the first load
    (a changed context or KV type reloads what is loaded: waited for), `path` picked and loaded, the console and
    request logs emptied, the page scrolled to its top."""
    page = lab.page
    page.set_viewport_size(viewport or ONE_COLUMN)
    page.evaluate(_RESTORE_JS, lab.settings)
    page.wait_for_function("document.getElementById('progress').hidden", timeout=LOAD_MS)
    lab.pick(path)
    lab.wait_loaded(path.name)
    page.evaluate("window.scrollTo(0, 0)")
    lab.console.clear()
    lab.requests.clear()
    return lab


@pytest.fixture(scope="module")
def module_lab(browser, server_url):
    """One page for a module's tests, which run in file order, each from where the one before left the page (a pick
    replaces the model): the page boots once and compiles each kernel once (a load's pipelines are most of its time on
    SwiftShader; the worker's device keeps them, lab.gpu Device.compiled). A module opts in by defining its own
    module-scoped `lab` fixture that returns this one; a test whose point is a fresh page keeps the function-scoped
    `lab`."""
    with open_lab(browser, server_url) as lab:
        yield lab
