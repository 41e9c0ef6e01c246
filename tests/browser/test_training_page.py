"""The Training card in headless Chromium (SwiftShader) on the small synthetic Llama 3 file (tests/conftest.py `tiny`:
the card's wiring is the same for every trainable model; the gradients themselves are held to float64 natively,
tests/engine/test_training.py, and the card's worker side to its messages, tests/engine/test_training_card.py).

As a learner uses it: the card opens with no refusal for a trainable model and the context bounded by the engine's
step; a context past it and a text shorter than two windows are refused with one line, the page staying usable; a
text file is picked and trained on at T = 16, the progress and the loss curve grow step by step, and Stop ends the run
after the step in flight, the adapter keeping it; the held-out perplexity before and after, the memory by kind; the
replies without and with the adapter both appear; the download is a llama.cpp adapter file that lab.format.adapter
reads against the model; the switch turns the adapter off and on; Forget's read-back covers the training's buffers
(non-zero before, zero after) and the card empties. The card's screenshots go to $LAB_SHOTS (default
/tmp/llm-lab-shots), training-*.png."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from lab.format import gguf
from lab.format.adapter import read_adapter
from lab.format.model import from_gguf
from tests.browser.conftest import take
from tests.conftest import FIXTURES

RUN_MS = 600_000
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
T = 16
STEPS = 900          # more than a GPU runs between step 3 and Stop (SwiftShader: a few seconds a step)
TEXT = (FIXTURES / "perplexity_text.txt").read_text()[:1200]     # ~250 tokens: 15 windows of 16, 2 held out


@pytest.fixture(scope="module")
def lab(card_page, tiny_path):
    return take(card_page, tiny_path)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    (d / "notes.txt").write_text(TEXT)
    (d / "short.txt").write_text("Too short to train on.")
    return d


def _shot(lab, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.locator("#training").screenshot(path=str(SHOTS / f"training-{name}.png"))


def _refused(lab, says: str) -> None:
    page = lab.page
    page.click('[data-testid="train-start"]')
    page.wait_for_function("says => document.querySelector('[data-testid=train-refusal]').textContent.includes(says)",
                           arg=says, timeout=RUN_MS)
    assert page.locator('[data-testid="train-start"]').is_enabled()
    assert page.get_attribute('[data-testid="train-refusal"]', "data-kind") == "error"


def test_refusals_a_run_stopped_and_its_adapter(lab, texts, tiny_path, tmp_path):
    page = lab.page
    t0 = time.perf_counter()
    page.locator("#training").scroll_into_view_if_needed()
    assert page.locator('[data-testid="train-refusal"]').is_hidden()          # a trainable model: nothing to refuse
    # the engine's longest step: 64 tokens on SwiftShader, more on a GPU (lab.worker.training.max_ctx)
    top = int(page.get_attribute('[data-testid="train-ctx"]', "max"))
    assert 2 * T <= top <= 4096, top
    # refusals: one line each, the card still usable
    page.set_input_files('[data-testid="train-file"]', str(texts / "short.txt"))
    page.fill('[data-testid="train-ctx"]', str(T))
    _refused(lab, f"needs at least {2 * T}")
    page.set_input_files('[data-testid="train-file"]', str(texts / "notes.txt"))
    page.wait_for_function("document.querySelector('[data-testid=train-file-note]').textContent"
                           f".startsWith('{len(TEXT):,} characters')")
    page.fill('[data-testid="train-ctx"]', str(top + 1))
    _refused(lab, f"at most {top} on this engine")
    _shot(lab, "refused")
    # a run: progress and the curve step by step, then Stop after the step in flight
    page.fill('[data-testid="train-ctx"]', str(T))
    page.fill('[data-testid="train-steps"]', str(STEPS))
    page.fill('[data-testid="train-rank"]', "4")
    page.fill('[data-testid="train-lr"]', "0.01")
    page.click('[data-testid="train-start"]')
    assert page.locator('[data-testid="train-refusal"]').is_hidden()
    page.wait_for_function("Number(document.querySelector('[data-testid=train-status]').dataset.step) >= 3",
                           timeout=RUN_MS)
    assert page.locator('[data-testid="train-bar"]').is_visible()
    assert "tokens/s" in page.inner_text('[data-testid="train-progress-text"]')
    assert int(page.get_attribute('[data-testid="train-svg"]', "data-points")) >= 3
    _shot(lab, "running")
    page.click('[data-testid="train-stop"]')
    page.wait_for_selector('[data-testid="train-status"][data-state="stopped"]', timeout=RUN_MS)
    steps = int(page.get_attribute('[data-testid="train-status"]', "data-step"))
    assert 3 <= steps < STEPS, steps
    assert f"stopped after step {steps} of {STEPS}" in page.inner_text('[data-testid="train-status"]')
    assert int(page.get_attribute('[data-testid="train-svg"]', "data-points")) == steps
    assert int(page.get_attribute('[data-testid="train-svg"]', "data-held")) >= 2      # before, and after the last
    assert float(page.get_attribute('[data-testid="train-ppl"]', "data-value")) > 1
    assert "adapter" in page.inner_text('[data-testid="train-memory"]')
    print(f"\n{steps} steps; {page.inner_text('[data-testid=train-facts]')}")
    _shot(lab, "stopped")
    # the replies without and with the adapter
    opening = " ".join(TEXT.split()[:6])             # the text's first words, until one is typed
    assert page.input_value('[data-testid="train-prompt"]') == opening
    page.fill('[data-testid="train-prompt"]', "The history of")
    page.fill('[data-testid="train-new"]', "6")
    page.click('[data-testid="train-compare"]')
    page.wait_for_selector('[data-testid="train-with"][data-state="done"]', timeout=RUN_MS)
    without, with_ = page.inner_text('[data-testid="train-without"]'), page.inner_text('[data-testid="train-with"]')
    assert without.strip() and with_.strip()
    print(f"without {without!r}, with {with_!r}")
    _shot(lab, "compared")
    # the download: a llama.cpp adapter file of this model
    with page.expect_download(timeout=RUN_MS) as got:
        page.click('[data-testid="train-download"]')
    path = tmp_path / got.value.suggested_filename
    got.value.save_as(path)
    raw = path.read_bytes()
    assert raw[:4] == b"GGUF" and path.name == f"{tiny_path.stem}.lora.gguf"
    assert read_adapter(raw, len(raw), from_gguf(gguf.read_file(tiny_path))).pairs
    # the switch: off, then on again
    for on in (False, True):
        page.set_checked('[data-testid="train-on"]', on)
        page.wait_for_function("on => { const b = document.querySelector('[data-testid=train-on]');"
                               " return b.checked === on && !b.disabled; }", arg=on, timeout=RUN_MS)
    print(f"the test took {time.perf_counter() - t0:.1f} s")
    assert not lab.foreign_requests() and not lab.errors()


def forget_wipes_the_card(page):
    """Press Forget with the card's adapter on: the card's buffers were non-zero and read back as zeros, every buffer
    of the page reads back zero, the card's results are gone. Returns the card's wipe line."""
    assert page.locator('[data-testid="train-after"]').is_visible()        # the adapter of the test before
    page.click('[data-testid="forget"]')
    page.wait_for_selector('[data-testid="forget-status"][data-state="wiped"]', timeout=RUN_MS)
    wiped = page.locator('[data-testid="train-wiped"]')
    assert wiped.get_attribute("data-state") == "wiped", wiped.inner_text()
    assert int(wiped.get_attribute("data-before")) > 0 and wiped.get_attribute("data-after") == "0"
    assert page.inner_text('[data-testid="forget-after"]') == "0"
    assert page.locator('[data-testid="train-after"]').is_hidden()
    return wiped


def test_forget_wipes_the_training(lab):
    page = lab.page
    forget_wipes_the_card(page)
    assert page.locator('[data-testid="train-curve"]').is_hidden()
    assert page.locator('[data-testid="train-facts"]').is_hidden()
    assert page.input_value('[data-testid="train-prompt"]') == ""
    assert page.inner_text('[data-testid="train-file-note"]') == ""
    _shot(lab, "forgotten")
    assert not lab.foreign_requests() and not lab.errors()


@pytest.mark.slow      # natively by default: tests/engine/test_training_card.py
def test_a_jsonl_of_chat_turns_trains_its_answers(lab, texts):
    """A .jsonl picked (as `lab grounded-data` writes): the facts count conversations and the answers' tokens, the
    with / without prompt is its last question, asked as a user's turn."""
    page = lab.page
    turns = [{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w} {w}."}]}
             for w in ("red", "green", "blue", "black", "white", "grey", "pink", "gold", "teal", "navy", "plum")]
    (texts / "turns.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    page.set_input_files('[data-testid="train-file"]', str(texts / "turns.jsonl"))
    page.fill('[data-testid="train-ctx"]', "48")
    page.fill('[data-testid="train-steps"]', "2")
    page.fill('[data-testid="train-batch"]', "2")
    page.click('[data-testid="train-start"]')
    page.wait_for_selector('[data-testid="train-status"][data-state="done"]', timeout=RUN_MS)
    facts = page.inner_text('[data-testid="train-facts"]')
    assert "11 conversations, each a window of 48 tokens: 10 trained on, 1 held out" in facts, facts
    assert "answer tokens trained" in facts
    assert page.input_value('[data-testid="train-prompt"]') == "Say plum."
    page.fill('[data-testid="train-new"]', "3")
    page.click('[data-testid="train-compare"]')
    page.wait_for_selector('[data-testid="train-with"][data-state="done"]', timeout=RUN_MS)
    _shot(lab, "chat-turns")
    forget_wipes_the_card(page)
    assert not lab.foreign_requests() and not lab.errors()


def test_a_model_that_cannot_train_says_why_when_the_card_opens(lab):
    """An f16 KV cache (training reads the keys and values in f32): the box loads the file again, and the card says why
    it cannot train before anything is asked, Train disabled; unticked, the line goes. The page stays usable."""
    page = lab.page
    page.click('[data-testid="train-source-chat"]')
    page.click('[data-testid="train-start"]')                 # no conversation yet: refused in the page
    assert "the conversation is empty" in page.inner_text('[data-testid="train-refusal"]')
    page.check('[data-testid="kv-f16"]')                      # loads the file again
    page.wait_for_function("!document.querySelector('[data-testid=prompt]').disabled && document.querySelector("
                           "'[data-testid=model-info]').textContent.includes('per token (f16)')", timeout=RUN_MS)
    line = page.locator('[data-testid="train-refusal"]')
    assert "KV cache in f16" in line.inner_text() and line.get_attribute("data-kind") == "refusal"
    assert page.locator('[data-testid="train-start"]').is_disabled()
    _shot(lab, "f16-refused")
    page.uncheck('[data-testid="kv-f16"]')
    page.wait_for_function("!document.querySelector('[data-testid=prompt]').disabled && document.querySelector("
                           "'[data-testid=model-info]').textContent.includes('per token (f32)')", timeout=RUN_MS)
    assert line.is_hidden() and page.locator('[data-testid="train-start"]').is_enabled()
    assert not lab.foreign_requests() and not lab.errors()
