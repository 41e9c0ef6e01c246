"""The Training card's adapter file in headless Chromium (SwiftShader): the synthetic Llama 3 F32 file is loaded, the
committed adapter (tests/fixtures/lora/adapter.gguf, made for it; llama.cpp's logits with and without it in
logits.npz) is picked in the card's "Adapter file" input, and the worker's engine (`labLastLogits`, the last row of a
prefill of the fixture's ids) gives llama.cpp's logits with the adapter, and, switched off, without it; the replies
without and with it differ; the download is the same adapter; a hostile file (the adapter with its header cut, the model file itself) is one line in the card,
the page stays usable and the model runs as before (without the adapter, switched off); Forget's read-back covers
the adapter's buffers (non-zero before, zero after) and the card empties. The handler's refusals one by one, natively:
tests/engine/test_adapter_file_card.py. The card's screenshots go to $LAB_SHOTS (default /tmp/llm-lab-shots),
adapter-file-*.png."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import numpy as np
import pytest

from lab.format import gguf
from lab.format.adapter import read_adapter
from lab.format.model import from_gguf
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch
from tests.browser.conftest import take
from tests.browser.test_training_page import forget_wipes_the_card
from tests.conftest import FIXTURES

RUN_MS = 600_000
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
FIX = FIXTURES / "lora"
LLAMA_TOL = 2e-3    # as tests/engine/test_lora_engine.py: both f32, other summation orders (measured 1.4e-5 natively)


@pytest.fixture(scope="module")
def model_path():
    return synthetic_arch.build("llama3", "f32", cache_dir() / "synthetic")


@pytest.fixture(scope="module")
def lab(card_page, model_path):
    return take(card_page, model_path)


@pytest.fixture(scope="module")
def golden():
    with np.load(FIX / "logits.npz") as z:
        return {k: z[k] for k in z.files}


def _shot(lab, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.locator("#training").screenshot(path=str(SHOTS / f"adapter-file-{name}.png"))


def _diff(page, golden, which: str) -> float:
    """max |logit - llama.cpp's| at the fixture's kept columns, for the last position of a prefill of its ids."""
    m = page.evaluate("(ids) => window.labLastLogits(ids).then((m) => m.logits)", [int(i) for i in golden["ids"]])
    row = np.frombuffer(base64.b64decode(m), np.float32)
    return float(np.abs(row[golden["cols"]] - golden[which][-1]).max())


def _refused(page, path, says: str) -> str:
    page.set_input_files('[data-testid="train-adapter-file"]', str(path))
    page.wait_for_function("says => document.querySelector('[data-testid=train-refusal]').textContent.includes(says)"
                           " && !document.querySelector('[data-testid=train-adapter-file]').disabled",
                           arg=says, timeout=RUN_MS)
    line = page.locator('[data-testid="train-refusal"]')
    assert line.get_attribute("data-kind") == "error"
    text = line.text_content()
    assert text.startswith(f"{path.name} is refused: ") and "\n" not in text
    return text


def test_an_adapter_file_in_the_page(lab, golden, model_path, tmp_path):
    page = lab.page
    t0 = time.perf_counter()
    page.locator("#training").scroll_into_view_if_needed()
    assert page.locator('[data-testid="train-after"]').is_hidden()
    page.set_input_files('[data-testid="train-adapter-file"]', str(FIX / "adapter.gguf"))
    page.wait_for_selector('[data-testid="train-adapter-info"][data-state="on"]', timeout=RUN_MS)
    info = page.inner_text('[data-testid="train-adapter-info"]')
    assert info.startswith("adapter.gguf") and "28 matrices at ranks 2 to 4" in info and "α 8" in info, info
    assert page.locator('[data-testid="train-refusal"]').is_hidden()
    assert page.locator('[data-testid="train-after"]').is_visible() and page.is_checked('[data-testid="train-on"]')
    _shot(lab, "loaded")
    # llama.cpp's logits with the adapter, then without it
    e_with = _diff(page, golden, "with_adapter")
    page.set_checked('[data-testid="train-on"]', False)
    page.wait_for_function("() => { const b = document.querySelector('[data-testid=train-on]');"
                           " return !b.checked && !b.disabled; }", timeout=RUN_MS)
    e_without = _diff(page, golden, "without")
    print(f"\nlast position vs llama.cpp in the page: with the file's adapter {e_with:.2e}, without {e_without:.2e}")
    assert e_with < LLAMA_TOL and e_without < LLAMA_TOL
    # the replies without and with it (the switch left off)
    page.fill('[data-testid="train-prompt"]', "The old lighthouse keeper")
    page.fill('[data-testid="train-new"]', "3")
    page.click('[data-testid="train-compare"]')
    page.wait_for_selector('[data-testid="train-with"][data-state="done"]', timeout=RUN_MS)
    without, with_ = page.inner_text('[data-testid="train-without"]'), page.inner_text('[data-testid="train-with"]')
    print(f"without {without!r}, with {with_!r}")
    assert without.strip() and with_.strip() and without != with_
    assert not page.is_checked('[data-testid="train-on"]')
    # the download: the adapter's own values, as a llama.cpp adapter of this model
    with page.expect_download(timeout=RUN_MS) as got:
        page.click('[data-testid="train-download"]')
    out = Path(got.value.path()).read_bytes()
    raw = (FIX / "adapter.gguf").read_bytes()
    cfg = from_gguf(gguf.read_file(model_path))
    a_in, a_out = read_adapter(raw, len(raw), cfg), read_adapter(out, len(out), cfg)
    assert a_out.bases == a_in.bases and a_out.alpha == a_in.alpha
    assert all(raw[p.a_offset:p.a_offset + p.a_nbytes] == out[q.a_offset:q.a_offset + q.a_nbytes]
               and raw[p.b_offset:p.b_offset + p.b_nbytes] == out[q.b_offset:q.b_offset + q.b_nbytes]
               for p, q in zip(a_in.pairs, a_out.pairs))
    # hostile files: one line each; the adapter the card holds and the model's logits as they were (switched off)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[:300])
    print(_refused(page, cut, "truncated"))
    print(_refused(page, model_path, "not a LoRA adapter"))
    assert page.get_attribute('[data-testid="train-adapter-info"]', "data-state") == "on"
    assert not page.is_checked('[data-testid="train-on"]') and page.is_enabled('[data-testid="train-on"]')
    assert _diff(page, golden, "without") < LLAMA_TOL
    _shot(lab, "refused")
    print(f"the test took {time.perf_counter() - t0:.1f} s")
    assert not lab.foreign_requests() and not lab.errors()


def test_forget_wipes_the_adapter_file(lab):
    page = lab.page
    wiped = forget_wipes_the_card(page)
    assert "adapter file's 2 buffers" in wiped.inner_text()
    assert page.inner_text('[data-testid="train-adapter-info"]') == ""
    assert page.locator('[data-testid="train-refusal"]').is_hidden()
    _shot(lab, "forgotten")
    assert not lab.foreign_requests() and not lab.errors()
