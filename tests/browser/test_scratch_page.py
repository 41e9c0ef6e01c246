"""The Training card's "a new model from scratch" in headless Chromium (SwiftShader), as a learner walks it, over the
small synthetic Llama 3 loaded before (tests/conftest.py `tiny`):

- with no vocabulary yet, Train says where to get one; a tokenizer file that is not one is refused in one line, and
  the model loaded before stays loaded;
- a vocabulary trained in the Tokenizer card, a text file, the nano preset: the model before is replaced by the new
  one (the model card says so), the loss curve grows step by step with the held-out loss beside it, and the facts
  name every weight trained;
- the chat talks to the new model (its vocabulary: plain text continued), the card's one reply is the model's, and
  the download is a GGUF llama.cpp reads: the trained vocabulary in its header, every tensor F32;
- New chat keeps the model; Forget reads its weights back as zeros with the rest of the conversation's buffers and
  unloads it, and the page says so.
The worker's side of the same is tests/engine/test_scratch_card.py (natively), the steps `lab train --scratch`'s
(tests/engine/test_scratch.py, held to llama.cpp). Screenshots: $LAB_SHOTS (default /tmp/llm-lab-shots),
training-new-*.png."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lab.engine.load import validate
from lab.format import gguf
from tests.browser.conftest import take
from tests.conftest import FIXTURES

RUN_MS = 600_000
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
TEXT = (FIXTURES / "perplexity_text.txt").read_text()[:1500]
VOCAB = 300
T, STEPS = 16, 6


@pytest.fixture(scope="module")
def lab(card_page, tiny_path):
    return take(card_page, tiny_path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("scratch")
    (d / "notes.txt").write_text(TEXT)
    (d / "bad.json").write_text(json.dumps({"format": "some-other-tokenizer"}))
    return d


def _shot(lab, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.locator("#training").screenshot(path=str(SHOTS / f"training-new-{name}.png"))


def _refused(page, says: str) -> None:
    page.click('[data-testid="train-start"]')
    page.wait_for_function("says => document.querySelector('[data-testid=train-refusal]').textContent.includes(says)",
                           arg=says, timeout=RUN_MS)
    assert page.locator('[data-testid="train-start"]').is_enabled()


def test_a_new_model_trained_used_and_forgotten(lab, files, tiny_path, tmp_path):
    page = lab.page
    page.locator("#training").scroll_into_view_if_needed()
    page.check('[data-testid="train-mode-new"]')
    assert page.locator('[data-testid="train-rank"]').is_hidden()            # a LoRA's own inputs go
    assert page.locator('[data-testid="train-preset"]').is_visible()
    assert page.input_value('[data-testid="train-lr"]') == "0.003"           # a new model's learning rate
    page.set_input_files('[data-testid="train-file"]', str(files / "notes.txt"))
    page.fill('[data-testid="train-ctx"]', str(T))
    page.fill('[data-testid="train-steps"]', str(STEPS))
    page.fill('[data-testid="train-batch"]', "2")
    # no vocabulary yet, then a file that is not one: one line each, the model before still loaded
    _refused(page, "train a vocabulary in the Tokenizer card first")
    page.set_input_files('[data-testid="train-vocab-file"]', str(files / "bad.json"))
    _refused(page, "bad.json is refused: not a tokenizer file of this lab")
    assert tiny_path.name in page.inner_text('[data-testid="model-info"]')
    _shot(lab, "refused")

    # a vocabulary from the Tokenizer card
    page.check('[data-testid="train-vocab-card"]')
    page.locator("#tokenizer").scroll_into_view_if_needed()
    page.set_input_files('[data-testid="tok-files"]', str(files / "notes.txt"))
    page.check('[data-testid="tok-source-files"]')
    page.fill('[data-testid="tok-vocab"]', str(VOCAB))
    page.click('[data-testid="tok-train"]')
    page.wait_for_selector('[data-testid="tok-status"][data-state="done"]', timeout=RUN_MS)

    # the run: the model before replaced, the curve, the facts
    page.locator("#training").scroll_into_view_if_needed()
    assert f"({VOCAB} tokens)" in page.inner_text("#train-vocab-note")
    assert "parameters with this vocabulary" in page.inner_text('[data-testid="train-preset-note"]')
    page.click('[data-testid="train-start"]')
    page.wait_for_function("Number(document.querySelector('[data-testid=train-status]').dataset.step) >= 2",
                           timeout=RUN_MS)
    assert "trained here" in page.inner_text('[data-testid="model-info"]')
    assert tiny_path.name not in page.inner_text('[data-testid="model-info"]')
    _shot(lab, "running")
    page.wait_for_selector('[data-testid="train-status"][data-state="done"]', timeout=RUN_MS)
    status = page.inner_text('[data-testid="train-status"]')
    assert f"done: {STEPS} steps" in status and "the new model is loaded" in status
    assert int(page.get_attribute('[data-testid="train-svg"]', "data-points")) == STEPS
    assert int(page.get_attribute('[data-testid="train-svg"]', "data-held")) >= 2
    facts = page.inner_text('[data-testid="train-facts"]')
    assert "every one trained: 4 layers of 64, 4 heads" in facts and f"a vocabulary of {VOCAB}" in facts, facts
    assert "model" in page.inner_text('[data-testid="train-memory"]')
    print(f"\n{facts}")

    # the chat and the card's reply come from the new model; the download is the model
    reply = lab.send("The history of", max_tokens=6, timeout_ms=RUN_MS)
    assert reply.strip()
    page.locator("#training").scroll_into_view_if_needed()
    assert page.locator('[data-testid="train-without"]').is_hidden()
    page.fill('[data-testid="train-prompt"]', "The history of")
    page.fill('[data-testid="train-new"]', "6")
    page.click('[data-testid="train-compare"]')
    page.wait_for_selector('[data-testid="train-with"][data-state="done"]', timeout=RUN_MS)
    assert page.inner_text('[data-testid="train-with"]').strip()
    _shot(lab, "done")
    with page.expect_download(timeout=RUN_MS) as got:
        page.click('[data-testid="train-download-model"]')
    path = tmp_path / got.value.suggested_filename
    got.value.save_as(path)
    assert path.name == "llm-lab-nano.gguf"
    header = gguf.read_file(path)
    cfg, tok = validate(header)
    assert cfg.arch == "llama" and cfg.n_vocab == VOCAB and cfg.n_layer == 4
    assert {t.type.name for t in header.tensors} == {"F32"}
    assert path.stat().st_size == max(t.offset + t.nbytes for t in header.tensors)

    # New chat keeps it; Forget wipes its weights with the conversation and unloads it
    page.click('[data-testid="new-chat"]')
    page.wait_for_function("!document.querySelector('[data-testid=prompt]').disabled"
                           " && document.querySelector('[data-testid=model-info]').textContent.includes('trained here')",
                           timeout=RUN_MS)
    assert lab.send("The law", max_tokens=4, timeout_ms=RUN_MS).strip()
    page.click('[data-testid="forget"]')
    page.wait_for_selector('[data-testid="forget-status"][data-state="wiped"]', timeout=RUN_MS)
    wiped = page.locator('[data-testid="train-wiped"]')
    assert wiped.get_attribute("data-state") == "wiped", wiped.inner_text()
    assert int(wiped.get_attribute("data-before")) > 0 and wiped.get_attribute("data-after") == "0"
    assert "the new model's weights" in wiped.inner_text() and "unloaded it" in wiped.inner_text()
    page.wait_for_function("document.querySelector('[data-testid=prompt]').disabled")
    assert "trained here" not in page.inner_text('[data-testid="model-info"]')
    _shot(lab, "forgotten")
    page.check('[data-testid="train-mode-lora"]')         # the shared page as the next module expects it
    assert not lab.foreign_requests() and not lab.errors()
