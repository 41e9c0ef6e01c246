"""New chat and closing the tab, in a real browser (headless Chromium, SwiftShader WebGPU) on the small synthetic Llama 3
file (tests/conftest.py `tiny`, 4 layers): New chat after a reply, with every card open and on screen (a tall window:
each computes its probes), wipes every conversation buffer but the user's files, reads each one back and says so in one
line (buffers, bytes, non-zero words after); the KV card redraws blank from that read-back; the raw K and V rows read
without the panel's code are zero; the next turn prefills from an empty cache and says so. Then a `pagehide`
dispatched to the page, as a close or reload fires it: the worker clears, reads back and destroys every conversation
buffer and reports zero non-zero words after (docs/privacy.md says what a real close can promise).

The page is `card_page`, reloaded with the file; the unload test runs last (it leaves no model loaded)."""

from __future__ import annotations

import base64

import pytest

from tests.browser.conftest import open_lab, take

SLOW = 600_000                   # ms: a reply and the panels' probes on SwiftShader
N_LAYER = 4                      # synthetic_arch "llama3"
TALL = {"width": 1400, "height": 9000}     # every card on screen at once: each computes what it shows


@pytest.fixture(scope="module")
def lab_nc(card_page, tiny_path):
    lab = take(card_page, tiny_path, viewport=TALL)
    lab.page.check('[data-testid="greedy"]')
    return lab


def _wiped(lab, moment: str) -> dict:
    page = lab.page
    page.wait_for_function("m => { const l = document.querySelector('[data-testid=wiped-status]');"
                           " return l.dataset.moment === m && l.dataset.state !== ''; }", arg=moment, timeout=SLOW)
    line = page.locator('[data-testid="wiped-status"]')
    return {k: line.get_attribute(f"data-{k}") for k in ("state", "buffers", "bytes", "before", "after")} | {
        "text": line.inner_text()}


def test_new_chat_wipes_every_conversation_buffer_and_proves_it(lab_nc):
    lab, page = lab_nc, lab_nc.page
    assert page.locator("section.card.folded").count() == 0, "a card is folded"
    lab.send("Name three colours.", max_tokens=3)
    for testid in ("neighbour", "attention-cell", "logit-lens-cell", "residual-bar", "kv-cell"):
        page.wait_for_selector(f"[data-testid={testid}]", timeout=SLOW)      # every probe ran on the GPU
    page.fill('[data-testid="system-prompt"]', "You are terse.")
    page.fill('[data-testid="prompt"]', "draft")
    page.click('[data-testid="new-chat"]')
    w = _wiped(lab, "new-chat")
    print(f"\nNew chat in Chromium: {w['text']}")
    assert w["state"] == "wiped" and int(w["before"]) > 0 and w["after"] == "0", w
    assert int(w["buffers"]) > 2 * N_LAYER and int(w["bytes"]) > 0
    assert "0 non-zero words after" in w["text"]
    # the KV card redrawn from the wipe's read-back: every cell zero
    page.wait_for_selector('[data-testid="kv-forget"]', timeout=SLOW)
    assert page.get_attribute('[data-testid="kv-forget"]', "data-state") == "wiped"
    assert page.get_attribute('[data-testid="kv-forget"]', "data-after") == "0"
    assert all(float(c["k"]) == 0 == float(c["v"]) for c in lab.cells("kv-cell", ["k", "v"]))
    # the raw K and V rows, read without the panel's code: zero
    r = page.evaluate("ps => window.labKvRows(ps)", list(range(8)))
    assert base64.b64decode(r["rows"]).strip(b"\x00") == b""
    # the page's own copies: messages, tokens, the probe cards, the text fields
    for testid in ("message", "token", "neighbour", "attention-cell", "logit-lens-cell", "residual-bar"):
        assert page.locator(f"[data-testid={testid}]").count() == 0, testid
    assert page.input_value('[data-testid="prompt"]') == "" == page.input_value('[data-testid="system-prompt"]')
    # the next turn prefills from an empty cache, and says so
    lab.send("Hi", max_tokens=1)
    assert "reused 0" in page.inner_text('[data-testid="reuse"]')
    assert lab.errors() == [] and lab.foreign_requests() == []


def test_pagehide_clears_and_destroys_every_conversation_buffer(lab_nc):
    """What a close or reload fires, dispatched here so the page lives on to read the worker's report."""
    lab, page = lab_nc, lab_nc.page
    lab.send("Name three colours.", max_tokens=2)
    page.evaluate("() => window.dispatchEvent(new PageTransitionEvent('pagehide', {persisted: false}))")
    w = _wiped(lab, "unload")
    print(f"\npagehide in Chromium: {w['text']}")
    assert w["state"] == "wiped" and int(w["before"]) > 0 and w["after"] == "0", w
    assert int(w["buffers"]) > 2 * N_LAYER
    assert page.locator("[data-testid=message]").count() == 0 and page.is_disabled('[data-testid="prompt"]')
    assert lab.errors() == [] and lab.foreign_requests() == []


RELOADS = 5
SEEN_MS = 3000          # how long after the new page boots the old worker's lines are looked for


@pytest.mark.slow
def test_real_reloads_say_what_the_unload_did(browser, server_url, tiny_path):
    """A real `page.reload()` after a reply, RELOADS times: the old worker's lines (window.labUnloadLog: counts only)
    are counted, since a real close cannot be waited for (docs/privacy.md "Closing the tab" records the counts on
    each adapter). Whatever of the wipe is seen must say zero non-zero words after, and the page boots again each time
    with no error and no request off its origin."""
    seen = {"started": 0, "cleared": 0, "destroyed": 0}
    with open_lab(browser, server_url) as lab:
        page = lab.page
        for _ in range(RELOADS):
            lab.wait_ready()
            lab.pick(tiny_path)
            lab.wait_loaded(tiny_path.name)
            lab.send("Name three colours.", max_tokens=2)
            lab.console.clear()
            page.evaluate("() => { window.labUnloadLog = true; }")
            page.reload()
            lab.wait_ready()
            page.wait_for_timeout(SEEN_MS)
            lines = [text for _, text in lab.console if text.startswith("lab unload:")]
            for line in lines:
                if "cleared and read back" in line:
                    seen["cleared"] += 1
                    assert line.endswith(" 0 non-zero words after"), line
                elif "destroyed" in line:
                    seen["destroyed"] += 1
                else:
                    seen["started"] += 1
            assert lab.errors() == [] and lab.foreign_requests() == []
    print(f"\n{RELOADS} reloads in Chromium, the old worker's lines seen: {seen}")
