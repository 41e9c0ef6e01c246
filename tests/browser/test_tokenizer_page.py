"""The Tokenizer card in headless Chromium (Pyodide; the training never touches the GPU), on the page that has the small
synthetic Llama 3 loaded (tests/conftest.py `tiny`: SmolLM2's vocabulary and tokenizer, so "the model's" bytes per
token are a real tokenizer's):

- a slice of tests/fixtures/constitution.txt trained to a small vocabulary: the first merges with their counts, bytes
  per token for the trained tokenizer and for the model's, and the text's opening cut both ways, each equal to what
  lab/text/tokenizer/train.py and the model's tokenizer give natively on the same text in this process; the JSON
  download byte for byte the file `lab tokenizer-train --out` writes, the GGUF download `TrainedBPE.gguf()`'s bytes;
- the chat's text as the source, without a file;
- every bad input refused in one line that says what to change, the page usable after each;
- Stop in the middle of the merges: the merges made are the whole run's first ones (the download is the smaller
  vocabulary's file), and the card trains again after;
- Forget and New chat empty the card, Forget during a run too, its late answer dropped (the worker keeps nothing
  after a run: tests/unit/test_tokenizer_card.py).

One page for the module (tests/browser/conftest.py `card_page`), the tests in file order. Screenshots go to $LAB_SHOTS.
`LAB_MEASURE=1` adds the measurement of docs/tokenizer-training.md: this repository's docs and code trained in the page.
"""

from __future__ import annotations

import glob
import json
import os
import random
import time
from pathlib import Path

import pytest

from lab.format import gguf
from lab.host import cli
from lab.settings import TOKENIZER
from lab.text.tokenizer import from_metadata, train
from tests.browser.conftest import take
from tests.browser.test_layout import shot
from tests.conftest import FIXTURES

RUN_MS = 300_000           # a run on SwiftShader's machine, two cores shared with other test runs
SLICE = 6000               # characters of the constitution: a few seconds of Pyodide for the whole run
VOCAB = 400
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lab(card_page, tiny_path):
    lab = take(card_page, tiny_path)
    lab.page.locator("#tokenizer").scroll_into_view_if_needed()
    return lab


# After the slice: a line whose characters are not one byte each, so that bytes and characters differ.
NOT_ASCII = "\nGrüße aus Köln — 日本語のテキスト, русский текст 😀\n"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "constitution-slice.txt"
    path.write_text((FIXTURES / "constitution.txt").read_text(encoding="utf-8")[:SLICE] + NOT_ASCII, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def other_file(tmp_path_factory) -> Path:
    """A second file, so that the run's word counts are the sum over files, as the CLI's."""
    path = tmp_path_factory.mktemp("tok2") / "perplexity-opening.txt"
    path.write_text((FIXTURES / "perplexity_text.txt").read_text(encoding="utf-8")[:1500], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model_tok(tiny_path):
    return from_metadata(gguf.read_file(tiny_path).metadata)


def train_on(lab, *, files=None, vocab=VOCAB, chat=False) -> None:
    page = lab.page
    if files is not None:
        page.set_input_files('[data-testid="tok-files"]', [str(f) for f in files])
    page.check('[data-testid="tok-source-chat"]' if chat else '[data-testid="tok-source-files"]')
    page.fill('[data-testid="tok-vocab"]', str(vocab))
    page.click('[data-testid="tok-train"]')


def wait_state(lab, *states: str) -> str:
    """Wait until the status line is in one of `states`; returns the one it is in."""
    try:
        lab.page.wait_for_function("states => states.includes(document.querySelector('[data-testid=tok-status]')"
                                   ".dataset.state)", arg=list(states), timeout=RUN_MS)
    except Exception:
        raise AssertionError(f"the card never reached {states}: {lab.card_state('tokenizer')}") from None
    return lab.page.get_attribute('[data-testid="tok-status"]', "data-state")


def value(lab, testid: str) -> str:
    return lab.page.get_attribute(f'[data-testid="{testid}"]', "data-value")


def download(lab, testid: str) -> bytes:
    with lab.page.expect_download(timeout=RUN_MS) as got:
        lab.page.click(f'[data-testid="{testid}"]')
    return Path(got.value.path()).read_bytes()


def test_it_trains_what_the_cli_trains(lab, text_file, other_file, model_tok, tmp_path):
    page = lab.page
    t0 = time.time()
    train_on(lab, files=[text_file, other_file])
    assert wait_state(lab, "done", "error") == "done", page.inner_text('[data-testid="tok-error"]')
    texts = [text_file.read_text(encoding="utf-8"), other_file.read_text(encoding="utf-8")]
    print(f"\nthe page trained two files, {sum(len(t.encode()) for t in texts):,} bytes, to {VOCAB} tokens: "
          f"{value(lab, 'tok-time')} s of training, {time.time() - t0:.1f} s from the click to the result")
    text = texts[0]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    native = train.train(texts, VOCAB)
    tok = native.tokenizer()
    # the vocabulary and the measures, as natively: the texts' UTF-8 bytes over the tokens each tokenizer makes of them
    assert n_bytes > sum(map(len, texts)) and value(lab, "tok-text") == str(n_bytes)
    assert value(lab, "tok-vocab-size") == str(VOCAB)
    assert float(value(lab, "tok-bpt")) == round(n_bytes / sum(len(tok.encode(t)) for t in texts), 4)
    assert float(value(lab, "tok-model-bpt")) == round(n_bytes / sum(len(model_tok.encode(t)) for t in texts), 4)
    # the first merges, in order, with their counts
    pieces = {t: tok.piece(i) for i, t in enumerate(native.tokens)}
    shown = page.evaluate("[...document.querySelectorAll('[data-testid=tok-merges] li')]"
                          ".map(li => [li.dataset.left, li.dataset.right, Number(li.dataset.count)])")
    assert shown == [[pieces[a], pieces[b], c] for (a, b), c in zip(native.merges[:20], native.counts)]
    # the text's opening, cut both ways
    strip = ("[...document.querySelectorAll('[data-testid={}] .tok')].map(t => t.dataset.piece)")
    sample = page.evaluate(strip.format("tok-sample-trained"))
    assert "".join(sample) == text[:len("".join(sample))] and len(sample) > 10
    assert sample == [tok.piece(i) for i in tok.encode("".join(sample))]
    assert page.evaluate(strip.format("tok-sample-model")) == [model_tok.piece(i)
                                                                 for i in model_tok.encode("".join(sample))]
    # the downloads: the CLI's file for the same text and size, byte for byte, and the vocabulary's GGUF
    out = tmp_path / "cli.json"
    assert cli.main(["tokenizer-train", str(text_file), str(other_file), "--vocab", str(VOCAB), "--out", str(out)]) == 0
    assert download(lab, "tok-download-json") == out.read_bytes()
    assert download(lab, "tok-download-gguf") == native.gguf()
    shot(lab, "tokenizer-card", card="tokenizer")
    assert not lab.foreign_requests() and not lab.errors()


def test_the_conversation_is_a_source_too(lab):
    page = lab.page
    page.fill('[data-testid="max-tokens"]', "3")
    page.fill('[data-testid="prompt"]', "The words of the chat, the words of the chat, the words.")
    page.press('[data-testid="prompt"]', "Enter")
    page.wait_for_function("document.querySelectorAll('[data-testid=message]').length === 2 && "
                           "!document.querySelector('[data-testid=send]').disabled", timeout=RUN_MS)
    messages = page.evaluate("[...document.querySelectorAll('[data-testid=message]')].map(m => m.textContent)")
    train_on(lab, chat=True, vocab=300)
    assert wait_state(lab, "done", "error") == "done", page.inner_text('[data-testid="tok-error"]')
    text = "\n\n".join(m for m in messages if m.strip())
    native = train.train([text], 300)
    assert page.inner_text('[data-testid="tok-text"]').endswith("of the conversation: "
                                                                  f"{len(train.word_counts([text]))} distinct words")
    assert value(lab, "tok-text") == str(len(text.encode("utf-8")))
    assert value(lab, "tok-vocab-size") == str(len(native.tokens))
    assert download(lab, "tok-download-json") == native.dumps().encode("utf-8")


@pytest.mark.parametrize("case", ["no-file", "empty-chat", "binary", "latin-1", "too-big", "vocab-low", "vocab-high",
                                  "vocab-empty"])
def test_bad_input_is_refused_in_one_line(lab, case, tmp_path, text_file):
    page = lab.page
    if case == "empty-chat":
        page.click('[data-testid="new-chat"]')
    bad = tmp_path / {"binary": "picture.png", "latin-1": "latin1.txt", "too-big": "big.txt"}.get(case, "x.txt")
    if case == "binary":
        bad.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    elif case == "latin-1":
        bad.write_bytes("café au lait".encode("latin-1"))
    elif case == "too-big":
        bad.write_bytes(b"word " * (TOKENIZER.max_bytes // 5) + b"x")
    files = {"no-file": None, "empty-chat": None}.get(case, [bad] if case in ("binary", "latin-1", "too-big")
                                                     else [text_file])
    if case == "no-file":
        page.set_input_files('[data-testid="tok-files"]', [])
    vocab = {"vocab-low": "100", "vocab-high": "100000", "vocab-empty": ""}.get(case, str(VOCAB))
    train_on(lab, files=files, chat=case == "empty-chat", vocab=vocab)
    assert wait_state(lab, "error") == "error"
    line = page.inner_text('[data-testid="tok-error"]')
    want = {
        "no-file": "no text: choose one or more text files",
        "empty-chat": "no text: choose one or more text files, or train on the conversation once it has messages",
        "binary": "picture.png: a binary file (it holds NUL bytes), not text",
        "latin-1": "latin1.txt: not UTF-8 text (byte 3 is 0xe9): save it as UTF-8 and pick it again",
        "too-big": f"{TOKENIZER.max_bytes + 1:,} bytes of text: the page trains on at most {TOKENIZER.max_bytes:,}",
        "vocab-low": "a vocabulary of 100 tokens is below the 257 special and byte tokens: choose 257 .. 65,536",
        "vocab-high": "a vocabulary of 100,000 tokens is above 65,536",
        "vocab-empty": "no vocabulary size: choose 257 .. 65,536",
    }[case]
    assert want in line and "\n" not in line.strip()
    # nothing half-done is shown, and the card takes the next request
    assert page.locator('[data-testid="tok-facts"]').is_hidden()
    assert page.locator('[data-testid="tok-train"]').is_enabled()
    assert not lab.errors()
    if case == "vocab-empty":
        shot(lab, "tokenizer-refused", card="tokenizer")


def random_text(n_bytes: int) -> str:
    """Words of random letters: many distinct pairs, so that the merges, not the counting, take the run's time."""
    rng = random.Random(7)
    words, size = [], 0
    while size < n_bytes:
        w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 12)))
        words.append(w)
        size += len(w) + 1
    return " ".join(words)


def test_stop_keeps_the_first_merges(lab, tmp_path, text_file):
    page = lab.page
    path = tmp_path / "random.txt"
    text = random_text(200_000)
    path.write_text(text, encoding="utf-8")
    train_on(lab, files=[path], vocab=20_000)
    # stopped once the merges are under way (the progress line counts them)
    lab.wait_in_card("tokenizer", '[data-testid="tok-status"][data-phase="merge"]:not([data-done="0"])', RUN_MS)
    assert page.locator('[data-testid="tok-bar"]').is_visible()
    page.click('[data-testid="tok-stop"]')
    assert wait_state(lab, "stopped", "done") == "stopped"
    got = download(lab, "tok-download-json")
    made = len(json.loads(got)["merges"])
    assert 0 < made < 20_000 - 257
    assert page.inner_text('[data-testid="tok-status"]') == f"stopped after {made:,} of {20_000 - 257:,} merges"
    assert page.inner_text('[data-testid="tok-bpt"]') == "not measured (stopped)"
    # the whole run's first `made` merges, counts and all: the trainer stopped natively at the same merge
    native = train.BPETrainer(train.word_counts([text]), 20_000)
    native.run(made)
    assert got == native.result().dumps().encode("utf-8")
    shot(lab, "tokenizer-stopped", card="tokenizer")
    # the card trains again at once
    train_on(lab, files=[text_file], vocab=300)
    assert wait_state(lab, "done", "error") == "done"
    assert value(lab, "tok-vocab-size") == "300"


def card_is_empty(lab) -> bool:
    return lab.page.evaluate("""() => {
        const hidden = (id) => document.querySelector(`[data-testid=${id}]`).closest('[hidden]') !== null;
        return hidden('tok-facts') && hidden('tok-merges') && hidden('tok-sample-trained')
            && hidden('tok-download-json') && !document.querySelector('[data-testid=tok-merges] li')
            && !document.querySelector('[data-testid=tok-sample-trained] .tok')
            && document.querySelector('[data-testid=tok-files]').files.length === 0
            && document.querySelector('[data-testid=tok-files-note]').textContent === ''
            && document.querySelector('[data-testid=tok-status]').dataset.state === 'idle'; }""")


@pytest.mark.parametrize("button", ["forget", "new-chat"])
def test_forget_and_new_chat_empty_the_card(lab, text_file, button):
    page = lab.page
    train_on(lab, files=[text_file], vocab=300)
    assert wait_state(lab, "done") == "done" and not card_is_empty(lab)
    page.click(f'[data-testid="{button}"]')
    assert card_is_empty(lab)
    page.click("#tokenizer [data-testid=fold]")           # folded, its one line says there is nothing
    assert page.inner_text("#tokenizer .fold-line") == "no tokenizer trained yet"
    page.click("#tokenizer [data-testid=fold]")
    assert not lab.foreign_requests() and not lab.errors()


def test_forget_during_a_run_stops_it_and_its_answer_is_dropped(lab, tmp_path):
    """Forget while the merges run: the page posts stop, then forget; the worker finishes the run at its next slice
    and answers it (the page drops the answer: its run was given up), then wipes. The card stays empty."""
    page = lab.page
    path = tmp_path / "random.txt"
    path.write_text(random_text(200_000), encoding="utf-8")
    train_on(lab, files=[path], vocab=20_000)
    lab.wait_in_card("tokenizer", '[data-testid="tok-status"][data-phase="merge"]:not([data-done="0"])', RUN_MS)
    page.click('[data-testid="forget"]')
    assert card_is_empty(lab)
    # Forget's report comes after the run's answer (the worker takes one message at a time)
    page.wait_for_function("['wiped', 'nothing', 'failed'].includes("
                           "document.querySelector('[data-testid=forget-status]').dataset.state)", timeout=RUN_MS)
    assert card_is_empty(lab) and page.locator('[data-testid="tok-train"]').is_enabled()
    assert not lab.errors()


@pytest.mark.skipif(os.environ.get("LAB_MEASURE") != "1", reason="a measurement for the docs: LAB_MEASURE=1")
def test_measure_this_repository_s_text(lab, tmp_path, model_tok):
    """docs/tokenizer-training.md's rows: this repository's docs/*.md, lab/**/*.py and wgsl/*.wgsl in one file (1.9
    MB), and the same text twice (just under the page's cap), trained in the page and natively (train.train and the
    two bytes_per_token passes, as the CLI with --model runs them), one after the other on the same machine."""
    files = sorted(glob.glob(str(ROOT / "docs" / "*.md")) + glob.glob(str(ROOT / "lab" / "**" / "*.py"), recursive=True)
                   + glob.glob(str(ROOT / "wgsl" / "*.wgsl")))
    text = "".join(Path(f).read_text(encoding="utf-8") for f in files)
    for copies, vocab in ((1, 1024), (1, 4096), (2, 4096)):
        path = tmp_path / f"repo-{copies}-{vocab}.txt"       # a new file each time: a File picked goes stale
        path.write_text(text * copies, encoding="utf-8")       # when its file is written again
        t0 = time.time()
        train_on(lab, files=[path], vocab=vocab)
        assert wait_state(lab, "done", "error") == "done", lab.page.inner_text('[data-testid="tok-error"]')
        page_s = time.time() - t0
        t0 = time.perf_counter()
        trained = train.train([text * copies], vocab)
        native_train = time.perf_counter() - t0
        n_bytes = path.stat().st_size
        own = train.bytes_per_token(trained.tokenizer(), [text * copies], n_bytes)
        model = train.bytes_per_token(model_tok, [text * copies], n_bytes)
        native_s = time.perf_counter() - t0
        assert float(value(lab, "tok-bpt")) == own and float(value(lab, "tok-model-bpt")) == model
        print(json.dumps({"bytes": n_bytes, "vocab": vocab, "merges": len(trained.merges),
                          "page_train_s": float(value(lab, "tok-time")), "page_click_to_result_s": round(page_s, 1),
                          "native_train_s": round(native_train, 3), "native_with_both_counts_s": round(native_s, 2),
                          "bpt": own, "model_bpt": model}))
