"""The browser lab end to end: the real SmolLM2 loaded through the file input (32 MB slices straight to the GPU) and its
greedy reply llama.cpp's, byte for byte; then, in the same page, the small synthetic Llama 3 (tests/conftest.py `tiny`:
the session's logic does not depend on the model) for follow-up reuse, stop, new chat and seeded sampling equal to the
native engine; bad files; and nothing stored or sent anywhere."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from lab.engine.session import Session
from lab.format import gguf
from lab.host.native import open_native
from lab.settings import Settings
from lab.text import chat
from lab.text.tokenizer import from_metadata
from tests.browser.conftest import take
from tests.conftest import load_fixture, native_engine


LOAD_TIMEOUT_MS = 300_000
REPLY_TIMEOUT_MS = 600_000
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def lab(card_page, tiny_path):
    """The cards' page (tests/browser/conftest.py `card_page`), its settings as after a first load."""
    return take(card_page, tiny_path)


def _f32_fixture_prompt(messages):
    fx = load_fixture("smollm2.f32.json")
    return next(p for p in fx["prompts"] if p.get("messages") == messages)


def _load(lab, path):
    lab.pick(path)
    lab.wait_loaded(path.name, LOAD_TIMEOUT_MS)


def _send(lab, text, max_tokens):
    page = lab.page
    page.fill('[data-testid="max-tokens"]', str(max_tokens))
    page.fill('[data-testid="prompt"]', text)
    n = page.locator('[data-testid="timings"]').inner_text()
    # Send must be disabled while generating. Watched from inside the page: on a GPU an 8-token reply ends before
    # a check from here could see the button (the H200 run); the observer sees every change of the attribute.
    assert not page.locator('[data-testid="send"]').is_disabled()
    page.evaluate("""() => { window.__sendDisabled = false;
        const send = document.querySelector('[data-testid=send]');
        new MutationObserver((records, obs) => {
          if (records.some(r => r.attributeName === 'disabled' && r.oldValue === null)) {
            window.__sendDisabled = true; obs.disconnect(); }
        }).observe(send, {attributes: true, attributeOldValue: true}); }""")
    page.press('[data-testid="prompt"]', "Enter")
    page.wait_for_function(
        "prev => { const t = document.querySelector('[data-testid=timings]').textContent;"
        " return t.length > 0 && t !== prev && document.querySelector('[data-testid=stop]').disabled; }",
        arg=n, timeout=REPLY_TIMEOUT_MS)
    assert page.evaluate("window.__sendDisabled"), "send stayed enabled while the reply was generated"
    return page.locator('[data-testid="message"]').last.inner_text()


@pytest.fixture(scope="module")
def native(tiny_path):
    header = gguf.read_file(tiny_path)
    return header, from_metadata(header.metadata), native_engine(open_native(), tiny_path, n_ctx=512)


def test_chat_matches_llama_cpp_then_reuse_stop_new_chat_and_seeded_sampling(lab, smollm2_path, tiny_path, native):
    lab.wait_ready()
    page = lab.page
    _load(lab, smollm2_path)
    growth = int(page.locator('[data-testid="model-info"]').get_attribute("data-wasm-heap-growth"))
    assert growth < 64 * 2**20, f"wasm heap grew {growth:,} bytes while loading 98 MB"

    # 1. greedy reply, byte-identical to llama.cpp on the same weights (F32 copy: exact arithmetic)
    want = _f32_fixture_prompt([{"role": "user", "content": QUESTION}])
    reply = _send(lab, QUESTION, 48)
    assert reply.encode() == bytes.fromhex(want["text_bytes_hex"])
    tokens = page.locator('[data-testid="token"]')
    ids = [int(tokens.nth(i).get_attribute("data-id")) for i in range(tokens.count())]
    assert ids == want["prompt_ids"] + want["ids"][:len(ids) - len(want["prompt_ids"])]
    assert [int(tokens.nth(i).get_attribute("data-index")) for i in range(3)] == [0, 1, 2]
    assert "tok/s" in page.locator('[data-testid="timings"]').inner_text()

    # 2. a follow-up turn runs only its new tokens (from here on the small file: a second pick replaces the model, and
    # the session's logic is the same for every model)
    _load(lab, tiny_path)
    _send(lab, QUESTION, 8)
    _send(lab, "And of Germany?", 8)
    reuse = page.locator('[data-testid="reuse"]').inner_text()
    prefilled, reused = (int(s.split()[-1]) for s in reuse.split(","))
    header, tok, engine = native
    first = chat.render_chat(tok, header.metadata, [{"role": "user", "content": QUESTION}])
    assert reused >= len(first) and 0 < prefilled < 30, reuse

    # 3. stop ends a long generation early
    # 1,500 tokens: the H200 page decodes 200 in 0.26 s, before a Stop clicked at the first text lands (2026-12-02:
    # "200 tokens (length)"); a Stop that works ends the reply after a few tokens on any adapter
    page.fill('[data-testid="max-tokens"]', "1500")
    page.fill('[data-testid="prompt"]', "Write a long story about a dragon.")
    # Stop is clicked from inside the page as soon as the reply shows text: on a GPU the whole reply takes about
    # 0.5 s, and a wait-then-click from here found it already finished (the H200 run, docs/performance.md).
    page.evaluate("""() => new MutationObserver((_, obs) => {
        const m = document.querySelectorAll('[data-testid=message]');
        const stop = document.querySelector('[data-testid=stop]');
        if (m.length === 6 && m[5].textContent.length > 3 && !stop.disabled) { obs.disconnect(); stop.click(); }
      }).observe(document.body, {childList: true, subtree: true, characterData: true})""")
    page.click('[data-testid="send"]')
    page.wait_for_function("!document.querySelector('[data-testid=send]').disabled", timeout=REPLY_TIMEOUT_MS)
    assert "(stopped)" in page.locator('[data-testid="timings"]').inner_text()

    # 4. new chat empties the conversation
    page.click('[data-testid="new-chat"]')
    assert page.locator('[data-testid="message"]').count() == 0
    assert page.locator('[data-testid="token"]').count() == 0

    # 5. seeded sampling from the page's inputs equals the native engine's with the same settings
    settings = Settings(greedy=False, temperature=1.0, top_k=40, top_p=0.95, min_p=0.05, seed=7)
    prompt = chat.render_chat(tok, header.metadata, [{"role": "user", "content": "Tell me a joke."}])
    # Playwright's sync API keeps an event loop running in this thread: run the native engine in another.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sampled = pool.submit(asyncio.run, Session(engine, tok).generate(prompt, settings, 12)).result()
    page.uncheck('[data-testid="greedy"]')
    page.fill('[data-testid="temperature"]', "1.0")
    page.fill('[data-testid="top-k"]', "40")
    page.fill('[data-testid="top-p"]', "0.95")
    page.fill('[data-testid="seed"]', "7")
    assert _send(lab, "Tell me a joke.", 12) == sampled.text

    # Nothing stored, nothing sent elsewhere, no errors.
    assert page.evaluate("localStorage.length + sessionStorage.length") == 0
    assert page.evaluate("document.cookie") == ""
    assert page.evaluate("indexedDB.databases().then(d => d.length)") == 0
    assert QUESTION not in page.url
    assert lab.foreign_requests() == []
    assert lab.errors() == []


def test_bad_files_then_a_good_one(lab, tiny_path, tmp_path):
    lab.wait_ready()
    page = lab.page
    err = page.locator('[data-testid="load-error"]')
    notes = tmp_path / "notes.gguf"
    notes.write_text("hello, not a model\n" * 100)
    page.set_input_files('[data-testid="model-file"]', str(notes))
    err.wait_for(state="visible", timeout=60_000)
    assert "not a GGUF file" in err.inner_text()

    cut = tmp_path / "cut.gguf"                      # header intact, tensor data cut short
    cut.write_bytes(tiny_path.read_bytes()[:30_000_000])
    page.set_input_files('[data-testid="model-file"]', str(cut))
    page.wait_for_function("document.querySelector('[data-testid=load-error]').textContent.includes('truncated')",
                           timeout=LOAD_TIMEOUT_MS)
    assert page.locator('[data-testid="prompt"]').is_disabled()

    _load(lab, tiny_path)                            # no reload needed
    assert err.is_hidden()
    assert lab.foreign_requests() == []
