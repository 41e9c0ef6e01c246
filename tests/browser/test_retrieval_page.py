"""The retrieval card ("Ask your files") in headless Chromium (SwiftShader) on the small synthetic Llama 3 file
(tests/conftest.py `tiny`; how well a real model's windows find a passage is measured natively on SmolLM2,
tests/engine/test_retrieval_cli.py, and the page's pooling is the same WGSL): small files indexed with windows of 16
tokens, hostile and bad files among them, a question answered with and without the passages, then Forget.

- Bad files are refused by name (empty, binary, not UTF-8) and the others indexed; progress reaches the total.
- A file whose name and text hold `<script>`, `<img onerror=...>` and a `javascript:` link shows them as characters in
  the file list, the passages and the prompt: no element is made from them and no script of theirs runs.
- The hits are ranked with their cosines, the packed prompt holds the passages, and the two answers stream (8 greedy
  tokens each, the chat's sampling inputs).
- Recall on a few crops reports recall@1 <= recall@5 and the queries it ran.
- Forget wipes the index with proof (its `retrieval.*` buffers non-zero before, zero after, as the worker read them
  back), empties the card, and a question afterwards says to index files first.

One page serves the module: the tests run in file order. A screenshot of the card
after the answers goes to $LAB_SHOTS, and to docs/screenshots/retrieval.png with LAB_DOC_SHOTS=1 (tests/browser/
test_layout.py `shot`)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import take
from tests.browser.test_layout import shot

SLOW = 600_000            # ms: a load, a build or an answer on SwiftShader with the machine's two cores shared
MAX_NEW = 8
RECALL_QUERIES = 4        # crops of the one file long enough for them (CROP = 24 tokens), a second or two each

HOSTILE_NAME = '<img src=x onerror="window.pwned=1">.md'
HOSTILE = ('Notes: <script>window.pwned=1</script> then <img src=x onerror="window.pwned=1"> '
           'and [click](javascript:alert(1)) end.')
FILES = [
    {"name": "lighthouse.txt", "mimeType": "text/plain",
     "buffer": b"Edda Skarsgard keeps the lighthouse on Varnholm island."},
    {"name": "bakery.md", "mimeType": "text/markdown",
     "buffer": b"The bakery on Mill Street sells rye bread on Tuesdays."},
    {"name": HOSTILE_NAME, "mimeType": "text/markdown", "buffer": HOSTILE.encode()},
    {"name": "empty.txt", "mimeType": "text/plain", "buffer": b""},
    {"name": "photo.bin", "mimeType": "application/octet-stream", "buffer": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"},
    {"name": "latin1.txt", "mimeType": "text/plain", "buffer": "café au lait".encode("latin-1")},
]
REFUSED = {"empty.txt": "empty", "photo.bin": "binary", "latin1.txt": "not UTF-8"}
QUESTION = "Who keeps the lighthouse on Varnholm island?"


@pytest.fixture(scope="module")
def lab_rag(card_page, tiny_path):
    lab = take(card_page, tiny_path)
    lab.page.wait_for_selector('[data-testid="rag-files"]:not([disabled])', timeout=SLOW)
    lab.page.check('[data-testid="greedy"]')
    lab.page.fill('[data-testid="max-tokens"]', str(MAX_NEW))
    lab.page.evaluate("document.querySelector('#retrieval').scrollIntoView({block: 'start'})")
    return lab


def _settled(lab, done: str) -> None:
    """Wait for the selector `done`; a failure on the way (the card's status says error) fails at once, with the
    page's words."""
    page = lab.page
    page.wait_for_function("sel => document.querySelector(sel)"
                           " || document.querySelector('[data-testid=rag-status]').dataset.state === 'error'",
                           arg=done, timeout=SLOW)
    assert page.locator(done).count(), page.inner_text('[data-testid="rag-status"]')


def _card_text(page) -> str:
    return page.evaluate("document.querySelector('#retrieval').textContent")


def _elements_made(page) -> list[str]:
    """Tags of elements inside the card that a file could only have made by being parsed as HTML."""
    return page.evaluate("[...document.querySelectorAll('#retrieval img, #retrieval script, #retrieval a')]"
                         ".map(e => e.tagName)")


def test_index_hostile_and_bad_files_then_ask_with_and_without(lab_rag):
    lab, page = lab_rag, lab_rag.page
    page.fill('[data-testid="rag-window"]', "16")
    page.fill('[data-testid="rag-stride"]', "16")
    page.set_input_files('[data-testid="rag-files"]', FILES)
    assert "6 files picked" in page.inner_text('[data-testid="rag-picked"]')
    page.click('[data-testid="rag-index"]')
    # the plan comes before any GPU work: the bad files refused by name, each for its reason, the rest kept
    _settled(lab, '[data-testid="rag-refused"]')
    refused = {r["name"]: page.inner_text(f'[data-testid="rag-refused"][data-name="{r["name"]}"]')
               for r in lab.cells("rag-refused", ["name"])}
    assert set(refused) == set(REFUSED)
    for name, why in REFUSED.items():
        assert name in refused[name] and why in refused[name], refused[name]
    files = lab.cells("rag-file", ["name", "tokens"])
    assert [f["name"] for f in files] == ["lighthouse.txt", "bakery.md", HOSTILE_NAME]
    assert all(int(f["tokens"]) > 0 for f in files)
    _settled(lab, '[data-testid="rag-status"][data-state="ready"]')
    (p,) = lab.cells("rag-progress-text", ["done", "total"])
    assert int(p["done"]) == int(p["total"]) > 0
    windows = int(p["total"])
    print(f"indexed: {page.inner_text('[data-testid=rag-status]')}")

    # ask with every window as a passage, compared with the bare question
    page.fill('[data-testid="rag-k"]', str(windows))
    page.check('[data-testid="rag-compare"]')
    page.fill('[data-testid="rag-question"]', QUESTION)
    page.click('[data-testid="rag-ask"]')
    _settled(lab, '[data-testid="rag-hit"]')
    hits = lab.cells("rag-hit", ["rank", "score", "file"])
    assert [int(h["rank"]) for h in hits] == list(range(1, windows + 1))
    scores = [float(h["score"]) for h in hits]
    assert scores == sorted(scores, reverse=True) and all(-1.0 <= s <= 1.0 for s in scores)
    assert {h["file"] for h in hits} == {"lighthouse.txt", "bakery.md", HOSTILE_NAME}
    shown = page.locator('[data-testid="rag-hit"] .rag-score').all_inner_texts()
    assert shown == [f"{s:.3f}" for s in scores]            # each score to 3 decimals
    prompt = page.evaluate("document.querySelector('[data-testid=rag-prompt]').textContent")
    assert "Edda Skarsgard" in prompt and QUESTION in prompt and "<script>" in prompt
    # the two answers stream side by side, each up to MAX_NEW greedy tokens
    _settled(lab, '[data-testid="rag-answers"][data-state="done"]')
    assert page.locator('[data-testid="rag-answers"]').evaluate("e => e.classList.contains('compared')")
    rag, plain = (page.inner_text(f'[data-testid="rag-{w}-text"]').strip() for w in ("rag", "plain"))
    assert rag and plain, (rag, plain)
    print(f"with the files: {rag!r}; without: {plain!r}")

    # recall on a few crops (each a question's worth of GPU work): the figures and the count come back
    page.fill('[data-testid="rag-queries"]', str(RECALL_QUERIES))
    page.click('[data-testid="rag-recall"]')
    _settled(lab, '[data-testid="rag-recall-result"]:not([hidden])')
    got = {k: float(page.get_attribute(f'[data-testid="rag-recall-{k}"]', "data-value"))
           for k in ("1", "5", "queries", "time")}
    assert got["queries"] == RECALL_QUERIES and 0 <= got["1"] <= got["5"] <= 1 and got["time"] > 0, got
    n = str(RECALL_QUERIES)
    assert lab.cells("rag-recall-text", ["done", "total"]) == [{"done": n, "total": n}]
    print(f"recall: {got}")

    # the hostile file: its name and text are characters on the page, nothing of it became an element or ran
    text = _card_text(page)
    for piece in ("<script>window.pwned=1</script>", '<img src=x onerror="window.pwned=1">',
                  "[click](javascript:alert(1))"):
        assert piece in text, piece
    assert _elements_made(page) == []
    assert page.evaluate("window.pwned") is None
    shot(lab, "retrieval", card="retrieval")
    assert not lab.foreign_requests() and not lab.errors()


def test_forget_wipes_the_index_and_empties_the_card(lab_rag):
    lab, page = lab_rag, lab_rag.page
    assert page.locator('[data-testid="rag-hit"]').count() > 0, "the test before leaves an index and an answer"
    page.click('[data-testid="forget"]')
    page.wait_for_selector('[data-testid="forget-status"][data-state="wiped"]', timeout=SLOW)
    # the worker's read-back, as the page shows it: the index's buffers held numbers before, and none after
    wiped = page.locator('[data-testid="rag-wiped"]')
    assert wiped.get_attribute("data-state") == "wiped"
    assert int(wiped.get_attribute("data-before")) > 0 and wiped.get_attribute("data-after") == "0"
    assert "retrieval.index" in wiped.inner_text()
    # the card holds nothing of the files any more
    for testid in ("rag-hit", "rag-file", "rag-refused"):
        assert page.locator(f'[data-testid="{testid}"]').count() == 0, testid
    assert page.evaluate("document.querySelector('[data-testid=rag-prompt]').textContent") == ""
    assert page.locator('[data-testid="rag-answers"]').is_hidden()
    assert page.input_value('[data-testid="rag-question"]') == ""
    text = _card_text(page)
    assert "Skarsgard" not in text and "pwned" not in text and "lighthouse.txt" not in text
    # a question now: a clear message, and the card is ready for the next one
    page.fill('[data-testid="rag-question"]', QUESTION)
    page.click('[data-testid="rag-ask"]')
    page.wait_for_selector('[data-testid="rag-status"][data-state="error"]', timeout=SLOW)
    assert "index some files first" in page.inner_text('[data-testid="rag-status"]')
    assert page.locator('[data-testid="rag-ask"]').is_enabled()
    # a file dropped on the card's drop zone is picked, as a user drags one in
    page.evaluate("""() => {
        const dt = new DataTransfer();
        dt.items.add(new File(["Edda keeps the light."], "dropped.txt", {type: "text/plain"}));
        document.querySelector('#rag-drop').dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true,
                                                                                 cancelable: true}));
    }""")
    assert "1 file picked: dropped.txt" in page.inner_text('[data-testid="rag-picked"]')
    assert page.locator('[data-testid="rag-index"]').is_enabled()
    assert not lab.foreign_requests() and not lab.errors()
