"""The Retrieval card's "Tune on these files" in headless Chromium (SwiftShader), as a learner walks it, on the small
synthetic Llama 3 (tests/conftest.py `tiny`): a short text indexed in windows of 16 tokens, then the embedder tuned a
few steps a stage in the worker, both stages.

- Before any index, Tune is off and the card says to index files first;
- the run shows its steps' progress (stage, step, loss) as it goes, then the table `lab train-embedder` prints: token
  overlap, untuned, after crops, after query, four recall columns each; the index is embedded with the tuned adapter;
- the switch embeds the index without it, and with it again;
- the download is a llama.cpp adapter of the loaded model (lab.format.adapter reads it against the model's tensors);
- Forget reads the tuned embedder's buffers back as zero (the worker's report, as the card shows it) and empties the
  tuning's part of the card.
The worker's side of the same, refusals included, is tests/engine/test_tune_card.py (natively). Screenshots:
$LAB_SHOTS (default /tmp/llm-lab-shots), tune-*.png, and docs/screenshots/retrieval-tune.png with LAB_DOC_SHOTS=1
(tests/browser/test_layout.py `shot`)."""

from __future__ import annotations

import pytest

from lab.format import gguf
from lab.format.adapter import read_adapter_file
from lab.format.model import from_gguf
from tests.browser.conftest import take
from tests.browser.test_layout import shot
from tests.conftest import FIXTURES

SLOW = 600_000            # ms: a build, a run or a measurement on SwiftShader with the machine's two cores shared
TEXT = (FIXTURES / "perplexity_text.txt").read_text()[:600]       # about 130 tokens: 8 windows of 16
STEPS, PAIRS, QUERIES = 2, 2, 4
ROWS = ["token overlap", "untuned", "after crops", "after query"]


def _shot(lab, name: str) -> None:
    """The card as it is now, to $LAB_SHOTS only (the one docs/retrieval.md shows is taken with doc=True)."""
    shot(lab, f"tune-{name}", card="retrieval", doc=False)


@pytest.fixture(scope="module")
def lab(card_page, tiny_path):
    lab = take(card_page, tiny_path)
    lab.page.wait_for_selector('[data-testid="rag-files"]:not([disabled])', timeout=SLOW)
    lab.page.evaluate("document.querySelector('#retrieval').scrollIntoView({block: 'start'})")
    return lab


def _settled(lab, done: str, status: str = "tune-status") -> None:
    """Wait for the selector `done`; a failure on the way (the status says error) fails at once, with its words."""
    page = lab.page
    page.wait_for_function("([sel, st]) => document.querySelector(sel)"
                           " || document.querySelector(`[data-testid=${st}]`).dataset.state === 'error'"
                           " || !document.querySelector('[data-testid=tune-refusal]').hidden",
                           arg=[done, status], timeout=SLOW)
    assert page.locator(done).count(), (page.inner_text(f'[data-testid="{status}"]'),
                                        page.inner_text('[data-testid="tune-refusal"]'))


def _rows(page) -> list[dict]:
    return page.evaluate("[...document.querySelectorAll('[data-testid=tune-row]')].map(r => ({name: r.dataset.name,"
                         " values: [...r.querySelectorAll('td.num')].map(td => Number(td.dataset.value))}))")


def test_tune_on_the_indexed_file_then_switch_download_and_forget(lab, tmp_path, tiny_path):
    page = lab.page
    assert page.locator('[data-testid="tune-start"]').is_disabled()
    assert "index some files first" in page.inner_text('[data-testid="tune-status"]')
    notes = tmp_path / "notes.txt"
    notes.write_text(TEXT)
    page.fill('[data-testid="rag-window"]', "16")
    page.fill('[data-testid="rag-stride"]', "16")
    page.set_input_files('[data-testid="rag-files"]', str(notes))
    page.click('[data-testid="rag-index"]')
    _settled(lab, '[data-testid="rag-status"][data-state="ready"]', "rag-status")

    # the run: its steps as they go, then the table
    page.fill('[data-testid="rag-queries"]', str(QUERIES))
    page.select_option('[data-testid="tune-stage"]', "both")
    page.fill('[data-testid="tune-steps"]', str(STEPS))
    page.fill('[data-testid="tune-pairs"]', str(PAIRS))
    page.fill('[data-testid="tune-rank"]', "4")
    page.fill('[data-testid="tune-lr"]', "0.01")
    page.click('[data-testid="tune-start"]')
    _settled(lab, '[data-testid="tune-progress-text"][data-phase="train"]')
    assert "loss" in page.inner_text('[data-testid="tune-progress-text"]')
    assert page.locator('[data-testid="tune-stop"]').is_enabled()
    _shot(lab, "running")
    _settled(lab, '[data-testid="tune-status"][data-state="done"]')
    status = page.inner_text('[data-testid="tune-status"]')
    assert f"done: {2 * STEPS} steps" in status and "embedded with the tuned adapter" in status, status
    rows = _rows(page)
    assert [r["name"].split(" (")[0] for r in rows] == ROWS, rows
    assert all(len(r["values"]) == 4 and 0 <= r["values"][0] <= r["values"][1] <= 1 for r in rows), rows
    heads = page.locator("#tune-head th").all_inner_texts()
    assert heads[1:] == ["recall@1 (24)", "recall@5 (24)", "recall@1 (12)", "recall@5 (12)"]
    assert "pairs a step" in page.inner_text('[data-testid="tune-table"] caption')
    assert page.is_checked('[data-testid="tune-on"]')
    print("\n" + page.inner_text('[data-testid="tune-table"]'))
    page.locator('[data-testid="tune-table"]').scroll_into_view_if_needed()
    shot(lab, "retrieval-tune", card="retrieval")

    # the switch: the index embedded without the adapter, then with it again
    page.uncheck('[data-testid="tune-on"]')
    page.wait_for_function("document.querySelector('[data-testid=tune-status]').textContent.includes('switched off')",
                           timeout=SLOW)
    page.check('[data-testid="tune-on"]')
    page.wait_for_function("document.querySelector('[data-testid=tune-status]').textContent"
                           ".includes('embedded with the tuned adapter')", timeout=SLOW)

    # the download: a llama.cpp adapter of this model
    with page.expect_download(timeout=SLOW) as got:
        page.click('[data-testid="tune-download"]')
    path = tmp_path / got.value.suggested_filename
    got.value.save_as(path)
    assert path.name == f"{tiny_path.stem}.embedder.lora.gguf"
    header = gguf.read_file(tiny_path)
    adapter = read_adapter_file(path, from_gguf(header), {t.name: tuple(t.shape) for t in header.tensors})
    assert adapter.pairs and adapter.alpha == 8.0

    # Forget: the tuned embedder's buffers read back as zero, and the card's tuning emptied
    page.click('[data-testid="forget"]')
    page.wait_for_selector('[data-testid="forget-status"][data-state="wiped"]', timeout=SLOW)
    wiped = page.locator('[data-testid="tune-wiped"]')
    assert wiped.get_attribute("data-state") == "wiped", wiped.inner_text()
    assert int(wiped.get_attribute("data-before")) > 0 and wiped.get_attribute("data-after") == "0"
    assert "tuned embedder" in wiped.inner_text() and "retrieval.embedder A|B" in wiped.inner_text()
    assert page.locator('[data-testid="tune-table"]').is_hidden() and page.locator("#tune-after").is_hidden()
    assert page.locator('[data-testid="tune-start"]').is_disabled()
    _shot(lab, "forgotten")
    assert not lab.foreign_requests() and not lab.errors()
