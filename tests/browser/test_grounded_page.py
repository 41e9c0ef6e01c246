"""The grounded card, "Answer from your files, or decline", in headless Chromium (SwiftShader), as a learner walks it
on the small synthetic Llama 3 (tests/conftest.py `tiny`): before any index it cannot make a set; a text indexed in
the retrieval card makes one (its counts shown), which downloads as .jsonl and goes to the Training card as its file;
the held-out rows are measured (the model alone: no adapter yet), the table showing the three columns; Forget empties
the card. The worker's side is tests/engine/test_grounded_card.py, the rules tests/unit/test_grounded.py.
Screenshots: $LAB_SHOTS (default /tmp/llm-lab-shots), grounded-*.png."""

from __future__ import annotations

import pytest

from lab.instruments import grounded
from tests.browser.conftest import take
from tests.browser.test_layout import shot
from tests.engine.test_chat_training import TEXT

SLOW = 600_000


@pytest.fixture(scope="module")
def lab(card_page, tiny_path):
    lab = take(card_page, tiny_path)
    lab.page.wait_for_selector('[data-testid="rag-files"]:not([disabled])', timeout=SLOW)
    return lab


def _state(page, state: str) -> None:
    page.wait_for_function("s => ['error', s].includes(document.querySelector('[data-testid=gr-status]')"
                           ".dataset.state)", arg=state, timeout=SLOW)
    assert page.get_attribute('[data-testid="gr-status"]', "data-state") == state, \
        page.inner_text('[data-testid="gr-status"]')


def test_a_set_from_the_indexed_file_measured_then_forgotten(lab, tmp_path):
    page = lab.page
    page.click('[data-testid="gr-make"]')                    # nothing indexed: one line, the page usable
    _state(page, "error")
    assert "index some text files in the retrieval card first" in page.inner_text('[data-testid="gr-status"]')
    notes = tmp_path / "notes.md"
    notes.write_text(TEXT)
    page.fill('[data-testid="rag-window"]', "16")
    page.fill('[data-testid="rag-stride"]', "16")
    page.set_input_files('[data-testid="rag-files"]', str(notes))
    page.click('[data-testid="rag-index"]')
    page.wait_for_selector('[data-testid="rag-status"][data-state="ready"]', timeout=SLOW)
    page.click('[data-testid="gr-make"]')
    page.wait_for_selector('[data-testid="gr-set"]:not([hidden])', timeout=SLOW)
    rows, held = (int(page.get_attribute('[data-testid="gr-set"]', k)) for k in ("data-rows", "data-held"))
    assert rows >= 2 and held >= 1 and "from 1 file" in page.inner_text('[data-testid="gr-set"]')
    with page.expect_download(timeout=SLOW) as got:
        page.click('[data-testid="gr-download-held"]')
    path = tmp_path / got.value.suggested_filename
    got.value.save_as(path)
    assert path.name == "grounded.heldout.jsonl" and len(grounded.held_rows(path.read_text())) == held
    # handed to the Training card: its file now, a .jsonl of chat turns
    page.click('[data-testid="gr-train"]')
    page.wait_for_function("document.querySelector('[data-testid=train-file-note]').textContent.endsWith('characters')"
                           " && document.querySelector('[data-testid=train-source-file]').checked", timeout=SLOW)
    page.locator("#grounded").scroll_into_view_if_needed()
    page.fill('[data-testid="gr-new"]', "2")
    page.click('[data-testid="gr-measure"]')
    _state(page, "done")
    which = page.evaluate("[...document.querySelectorAll('[data-testid=gr-scores] tbody tr')]"
                          ".map(r => r.dataset.which)")
    assert which == ["without"]                              # no adapter on the model yet
    cells = page.evaluate("[...document.querySelectorAll('[data-testid=gr-scores] tbody td[data-col]')]"
                          ".map(td => td.textContent)")
    assert len(cells) == 3 and all(" of " in c for c in cells), cells
    shot(lab, "grounded-measured", card="grounded", doc=False)
    page.click('[data-testid="forget"]')
    page.wait_for_selector('[data-testid="forget-status"][data-state="wiped"]', timeout=SLOW)
    assert page.locator('[data-testid="gr-set"]').is_hidden() and page.locator('[data-testid="gr-scores"]').is_hidden()
    assert page.locator('[data-testid="gr-measure"]').is_disabled()
    assert not lab.foreign_requests() and not lab.errors()
