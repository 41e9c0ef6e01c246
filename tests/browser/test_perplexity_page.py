"""The perplexity card in headless Chromium (SwiftShader) on the small synthetic Llama 3 file (tests/conftest.py `tiny`:
the card's windows, progress and cancel do not depend on the model; the real SmolLM2's figure is held to llama.cpp
natively, tests/engine/test_perplexity.py): the fixture text's opening sentences pasted, run at a 64-token window (two
chunks), progress shown, and the figure equal to the native engine's on the same text and window; a run cancelled
mid-way leaves the page usable, and the chat after it prefills its whole prompt (the run overwrote the KV cache, so the
session must not reuse it).
Screenshots go to $LAB_SHOTS (default /tmp/llm-lab-shots)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from pathlib import Path

import pytest

from lab.format import gguf
from lab.host.native import open_native
from lab.instruments.perplexity import Perplexity, tokens_of
from lab.text.tokenizer import from_metadata
from tests.browser.conftest import take
from tests.conftest import FIXTURES, native_engine


LOAD_MS = 300_000
RUN_MS = 900_000
CTX = 64
RTOL_NATIVE = 0.005      # the same WGSL on another f32 rasterizer: measured far below this (see the report in docs)
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))


@pytest.fixture(scope="module")
def lab(card_page, tiny_path):
    return take(card_page, tiny_path)



def _text(tok) -> str:
    """The fixture text's opening, whole sentences, up to the first that brings it to two windows (and not three)."""
    sentences = (FIXTURES / "perplexity_text.txt").read_text().split(". ")
    for n in range(1, len(sentences) + 1):
        text = ". ".join(sentences[:n]) + "."
        if len(tokens_of(tok, text)) >= 2 * CTX:
            assert len(tokens_of(tok, text)) < 3 * CTX
            return text
    raise AssertionError("the fixture text is too short")


@pytest.fixture(scope="module")
def native(tiny_path):
    tok = from_metadata(gguf.read_file(tiny_path).metadata)
    text = _text(tok)
    engine = native_engine(open_native(), tiny_path, n_ctx=CTX)
    pp = Perplexity(engine)
    try:
        # in a thread: Playwright's sync API keeps an event loop running in this one
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            res = pool.submit(asyncio.run, pp.run(tokens_of(tok, text), CTX, bos_id=tok.bos_id,
                                                  add_bos=tok.add_bos)).result()
    finally:
        pp.close()
        engine.close()
    return text, res


def _load(lab, path):
    lab.pick(path)                      # afresh: nothing of the test before
    lab.wait_loaded(path.name, LOAD_MS)


def _shot(lab, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.locator("#perplexity").scroll_into_view_if_needed()
    lab.page.screenshot(path=str(SHOTS / f"perplexity-{name}.png"), full_page=True)


def _start(lab, text, chunks: int = 2):
    page = lab.page
    page.fill('[data-testid="ppl-text"]', text)
    page.select_option('[data-testid="ppl-ctx"]', str(CTX))
    page.click('[data-testid="ppl-run"]')
    assert page.locator('[data-testid="ppl-run"]').is_disabled()
    page.wait_for_selector(f'[data-testid="ppl-status"][data-state="running"][data-chunks="{chunks}"]', timeout=RUN_MS)


def test_perplexity_matches_native(lab, native, tiny_path):
    text, res = native
    page = lab.page
    _load(lab, tiny_path)
    _start(lab, text)
    assert page.locator('[data-testid="ppl-progress"]').is_visible()
    assert "of 2" in page.locator('[data-testid="ppl-status"]').inner_text()
    # progress after the first chunk: its running value, the same the native run had after one chunk
    page.wait_for_selector('[data-testid="ppl-status"][data-chunk="1"]', timeout=RUN_MS)
    first = float(page.get_attribute('[data-testid="ppl-status"]', "data-ppl"))
    assert first == pytest.approx(res.running[0], rel=RTOL_NATIVE)
    page.wait_for_selector('[data-testid="ppl-status"][data-state="done"]', timeout=RUN_MS)
    got = float(page.get_attribute('[data-testid="ppl-value"]', "data-value"))
    print(f"browser ppl {got!r}, native {res.ppl!r}, rel diff {abs(got / res.ppl - 1):.2e}")
    assert got == pytest.approx(res.ppl, rel=RTOL_NATIVE)
    assert page.get_attribute('[data-testid="ppl-chunks"]', "data-value") == "2"
    assert page.get_attribute('[data-testid="ppl-scored"]', "data-value") == str(2 * (CTX - 1 - CTX // 2))
    _shot(lab, "result")
    # Forget clears the pasted text and the result
    page.click('[data-testid="forget"]')
    assert page.input_value('[data-testid="ppl-text"]') == ""
    assert page.locator('[data-testid="ppl-result"]').is_hidden()
    assert not lab.foreign_requests() and not lab.errors()


def test_cancel_then_chat(lab, native, tiny_path):
    text, _ = native
    page = lab.page
    _load(lab, tiny_path)
    page.fill('[data-testid="max-tokens"]', "2")
    page.fill('[data-testid="prompt"]', "Hi")
    page.press('[data-testid="prompt"]', "Enter")
    page.wait_for_function("document.querySelector('[data-testid=reuse]').textContent.includes('prefilled')",
                           timeout=RUN_MS)
    _start(lab, " ".join([text] * 8), chunks=16)   # 16 chunks: still running when the click lands, on a GPU too
    page.click('[data-testid="ppl-cancel"]')
    page.wait_for_selector('[data-testid="ppl-status"][data-state="cancelled"]', timeout=RUN_MS)
    assert page.locator('[data-testid="ppl-run"]').is_enabled()
    assert page.locator('[data-testid="ppl-cancel"]').is_disabled()
    _shot(lab, "cancelled")
    # the follow-up turn: its prompt opens with the first turn's, but the cache now holds the pasted text's K/V, so
    # nothing may be reused
    page.fill('[data-testid="prompt"]', "And then?")
    page.press('[data-testid="prompt"]', "Enter")
    page.wait_for_function("document.querySelectorAll('[data-testid=message]').length === 4 && "
                           "!document.querySelector('[data-testid=send]').disabled", timeout=RUN_MS)
    assert "reused 0" in page.locator('[data-testid="reuse"]').inner_text()
    assert page.locator('[data-testid="message"]').last.inner_text().strip()
    page.click('[data-testid="new-chat"]')
    assert page.input_value('[data-testid="ppl-text"]') == ""
    assert not lab.foreign_requests() and not lab.errors()
