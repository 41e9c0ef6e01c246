"""The Training card's "every weight of the loaded model" (full fine-tuning) in headless Chromium (SwiftShader), as a
learner walks it, over the small synthetic Llama 3 (tests/conftest.py `tiny`):

- on a quantized file (Q8_0) the mode says, before Train is pressed, that it needs an F32 model and how to make one
  (`lab f32-copy MODEL --out FILE`), Train stays off, and the LoRA mode still trains on that file;
- on the F32 file, a few steps at T = 16: the loss curve grows with the held-out loss beside it, the facts name every
  weight trained and the model's memory, the model stays loaded and the status says the chat and every card use it;
- the card's one reply is the trained model's (no "without", no switch, no adapter download), and the download is
  the whole model, the file's tensors in F32, named after the file (NAME.trained.gguf);
- New chat keeps the trained weights; Forget reads them back as zeros with the rest of the conversation's buffers and
  unloads the model, and the card says so.
The worker's side of the same is tests/engine/test_full_card.py (natively). Screenshots: $LAB_SHOTS (default
/tmp/llm-lab-shots), training-full-*.png."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lab.format import gguf
from tests.browser.conftest import take
from tests.conftest import FIXTURES, tiny

RUN_MS = 600_000
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
TEXT = (FIXTURES / "perplexity_text.txt").read_text()[:1200]
T, STEPS = 16, 3


@pytest.fixture(scope="module")
def lab(card_page, tiny_path):
    return take(card_page, tiny_path)


def _shot(lab, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    card = lab.page.locator("#training")
    card.scroll_into_view_if_needed()
    card.screenshot(path=str(SHOTS / f"training-full-{name}.png"))


def _refusal(page) -> str:
    return page.inner_text('[data-testid="train-refusal"]')


# with --slow (64 s of SwiftShader): by default tests/engine/test_full_card.py runs the same worker handlers natively
@pytest.mark.slow
def test_every_weight_trained_used_and_forgotten(lab, tiny_path, tmp_path):
    page = lab.page
    notes = tmp_path / "notes.txt"
    notes.write_text(TEXT)

    # a quantized file: the mode refuses it before anything runs, and says how to make an F32 copy
    quant = tiny("q8_0")
    lab.pick(quant)
    lab.wait_loaded(quant.name)
    page.locator("#training").scroll_into_view_if_needed()
    page.check('[data-testid="train-mode-full"]')
    assert page.locator('[data-testid="train-rank"]').is_hidden()             # no adapter: no rank
    assert page.locator('[data-testid="train-adapter-file"]').is_hidden()
    assert page.input_value('[data-testid="train-lr"]') == "0.0001"          # full fine-tuning's learning rate
    assert "Q8_0" in _refusal(page) and "lab f32-copy MODEL --out FILE" in _refusal(page), _refusal(page)
    page.set_input_files('[data-testid="train-file"]', str(notes))
    assert page.locator('[data-testid="train-start"]').is_disabled()
    _shot(lab, "refused")
    page.check('[data-testid="train-mode-lora"]')                             # a LoRA trains on it
    assert page.locator('[data-testid="train-refusal"]').is_hidden()
    assert page.locator('[data-testid="train-start"]').is_enabled()

    # the F32 file: a few steps, the curve, the facts; the model stays loaded
    lab.pick(tiny_path)
    lab.wait_loaded(tiny_path.name)
    page.locator("#training").scroll_into_view_if_needed()
    page.check('[data-testid="train-mode-full"]')
    assert page.locator('[data-testid="train-refusal"]').is_hidden(), _refusal(page)
    page.set_input_files('[data-testid="train-file"]', str(notes))
    page.fill('[data-testid="train-ctx"]', str(T))
    page.fill('[data-testid="train-steps"]', str(STEPS))
    page.fill('[data-testid="train-batch"]', "1")
    page.click('[data-testid="train-start"]')
    page.wait_for_function("Number(document.querySelector('[data-testid=train-status]').dataset.step) >= 1",
                           timeout=RUN_MS)
    _shot(lab, "running")
    page.wait_for_selector('[data-testid="train-status"][data-state="done"]', timeout=RUN_MS)
    status = page.inner_text('[data-testid="train-status"]')
    assert f"done: {STEPS} steps" in status and "the loaded model is the trained one now" in status, status
    assert tiny_path.name in page.inner_text('[data-testid="model-info"]')
    assert int(page.get_attribute('[data-testid="train-svg"]', "data-points")) == STEPS
    assert int(page.get_attribute('[data-testid="train-svg"]', "data-held")) >= 2
    facts = page.inner_text('[data-testid="train-facts"]')
    assert "every weight of the loaded model trained" in facts, facts
    assert "model" in page.inner_text('[data-testid="train-memory"]')
    print(f"\n{facts}")

    # its one reply; no adapter to switch or download; the download is the whole model
    page.fill('[data-testid="train-prompt"]', "The history of")
    page.fill('[data-testid="train-new"]', "6")
    page.click('[data-testid="train-compare"]')
    page.wait_for_selector('[data-testid="train-with"][data-state="done"]', timeout=RUN_MS)
    assert page.inner_text('[data-testid="train-with"]').strip()
    for testid in ("train-without", "train-on", "train-download"):
        assert page.locator(f'[data-testid="{testid}"]').is_hidden(), testid
    _shot(lab, "done")
    with page.expect_download(timeout=RUN_MS) as got:
        page.click('[data-testid="train-download-model"]')
    path = tmp_path / got.value.suggested_filename
    got.value.save_as(path)
    assert path.name == tiny_path.stem + ".trained.gguf"
    header, file = gguf.read_file(path), gguf.read_file(tiny_path)
    assert [t.name for t in header.tensors] == [t.name for t in file.tensors]
    assert {t.type.name for t in header.tensors} == {"F32"}
    assert path.stat().st_size == max(t.offset + t.nbytes for t in header.tensors)

    # New chat keeps it; Forget wipes its weights with the conversation and unloads it
    page.click('[data-testid="new-chat"]')
    page.wait_for_function("!document.querySelector('[data-testid=prompt]').disabled", timeout=RUN_MS)
    assert lab.send("The law", max_tokens=4, timeout_ms=RUN_MS).strip()
    page.click('[data-testid="forget"]')
    page.wait_for_selector('[data-testid="forget-status"][data-state="wiped"]', timeout=RUN_MS)
    wiped = page.locator('[data-testid="train-wiped"]')
    assert wiped.get_attribute("data-state") == "wiped", wiped.inner_text()
    assert int(wiped.get_attribute("data-before")) > 0 and wiped.get_attribute("data-after") == "0"
    assert "the trained model's weights" in wiped.inner_text() and "unloaded it" in wiped.inner_text()
    page.wait_for_function("document.querySelector('[data-testid=prompt]').disabled")
    _shot(lab, "forgotten")
    page.check('[data-testid="train-mode-lora"]')         # the shared page as the next module expects it
    assert not lab.foreign_requests() and not lab.errors()
