"""The verification card in headless Chromium (SwiftShader WebGPU): "Does it match llama.cpp?".

By default the card runs on the synthetic Qwen3.5-shaped file (its exact fixture in reference/; the replay carries the
delta-net and conv states) in the cards' page (tests/browser/conftest.py `card_page`; that the card waits for a model:
tests/browser/test_skeleton.py), with the turn after it, which must reuse nothing of what the replay overwrote. With
--slow,
the real SmolLM2 (exact and quantized references; its llama.cpp parity in the page is held by default by
tests/browser/test_browser_chat.py, the card's comparison logic natively by tests/engine/test_verify.py):

1. The default model (SmolLM2), loaded by its button, then the card's run. The rows must be the eight
   (exact and quant x max |diff|, RMS, argmax, greedy 16) with the verdicts the native test holds (every exact row
   "pass", quant max |diff| and argmax "pass"), the numbers within their tolerances, and "N of N kernels match their
   fixtures" for every kernel fixture (reference/kernels.json). Then a greedy turn: llama.cpp's reply, token for
   token (the replay overwrote the KV cache; the chat must not reuse it).
2. A copy of SmolLM2 under the same file name with one tensor byte changed inside a sampled slice: the card says
   "no reference for this file" (matched by content, never by name), and the kernel checks still run.

Screenshots of the card go to $LAB_SHOTS (default /tmp/llm-lab-shots).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from lab.format import gguf
from lab.host.verify_native import REFERENCE
from lab.instruments import verify
from tests.browser.conftest import take
from tests.conftest import load_fixture

SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
LOAD_MS = 300_000
REPLY_MS = 600_000
VERIFY_MS = 1_500_000
QUESTION = "What is the capital of France?"


def _n_kernel_cases() -> int:
    return len(json.loads((REFERENCE / "kernels.json").read_text())["cases"])


def _shot(lab, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.locator("#verify").screenshot(path=str(SHOTS / f"{name}.png"))


def _ask(lab, text: str) -> list[int]:
    page = lab.page
    page.fill('[data-testid="max-tokens"]', "8")
    page.fill('[data-testid="prompt"]', text)
    prev = page.locator('[data-testid="timings"]').inner_text()
    page.press('[data-testid="prompt"]', "Enter")
    page.wait_for_function(
        "prev => { const t = document.querySelector('[data-testid=timings]').textContent;"
        " return t.length > 0 && t !== prev && document.querySelector('[data-testid=stop]').disabled; }",
        arg=prev, timeout=REPLY_MS)
    return lab.ids()


def _run_card(lab) -> None:
    page = lab.page
    page.locator("#verify").scroll_into_view_if_needed()
    t0 = time.time()
    page.click('[data-testid="verify-run"]')
    try:
        page.wait_for_selector('[data-testid="verify-kernels-summary"]:is([data-state="pass"], [data-state="fail"], '
                               '[data-state="error"])', timeout=VERIFY_MS)
        print(f"kernel checks answered after {time.time() - t0:.1f} s", file=sys.stderr)
        page.wait_for_selector('[data-testid="verify-status"]:is([data-state="done"], [data-state="no-reference"], '
                               '[data-state="error"])', timeout=VERIFY_MS)
        print(f"card answered after {time.time() - t0:.1f} s", file=sys.stderr)
    except Exception:
        print("status:", page.locator('[data-testid="verify-status"]').inner_text(), "| kernels:",
              page.locator('[data-testid="verify-kernels-summary"]').inner_text(), "| console:", lab.console[-20:],
              file=sys.stderr)
        _shot(lab, "verify-timeout")
        raise


def _kernels_all_pass(lab) -> None:
    n = _n_kernel_cases()
    summary = lab.page.locator('[data-testid="verify-kernels-summary"]')
    print(summary.inner_text(), file=sys.stderr)
    assert summary.get_attribute("data-state") == "pass", summary.inner_text()
    assert summary.inner_text().startswith(f"{n} of {n} kernels match their fixtures")
    rows = lab.cells("verify-kernel-row", ["name", "verdict"])
    assert len(rows) == n and all(r["verdict"] == "pass" for r in rows), rows


@pytest.mark.slow   # SmolLM2's two replays on SwiftShader; the default run holds the card on the hybrid file below
def test_card_on_the_default_model(lab):
    page = lab.page
    lab.wait_ready()
    assert page.locator('[data-testid="verify-run"]').is_disabled()         # nothing loaded yet
    page.click('[data-testid="load-default"]')
    page.wait_for_selector('[data-testid="prompt"]:not([disabled])', timeout=LOAD_MS)

    _run_card(lab)
    status = page.locator('[data-testid="verify-status"]')
    print(status.inner_text(), file=sys.stderr)
    assert status.get_attribute("data-state") == "done", status.inner_text()
    assert status.get_attribute("data-ok") == "true", status.inner_text()
    rows = lab.cells("verify-row", ["reference", "check", "verdict", "number"])
    for r in page.locator('[data-testid="verify-row"]').all_inner_texts():
        print(r.replace("\t", " | "), file=sys.stderr)
    got = {(r["reference"], r["check"]): r for r in rows}
    assert set(got) == {(k, c) for k in ("exact", "quant") for c in ("max |diff|", "RMS diff", "argmax", "greedy 16")}
    for c in ("max |diff|", "RMS diff", "argmax", "greedy 16"):
        assert got[("exact", c)]["verdict"] == "pass", got[("exact", c)]
    assert float(got[("exact", "max |diff|")]["number"]) < verify.EXACT_REL * 40
    assert float(got[("exact", "greedy 16")]["number"]) == 16
    assert got[("quant", "max |diff|")]["verdict"] == "pass"
    assert float(got[("quant", "max |diff|")]["number"]) <= verify.QUANT_MAX
    assert got[("quant", "argmax")]["verdict"] == "pass"
    assert got[("quant", "greedy 16")]["verdict"] in ("pass", "reported")
    assert "8 bits" in page.locator('[data-testid="verify-explain"]').inner_text()
    tolerances = page.locator('[data-testid="verify-row"] td:nth-child(5)').all_inner_texts()
    assert all(t.strip() for t in tolerances)
    _kernels_all_pass(lab)
    _shot(lab, "verify-card")
    page.screenshot(path=str(SHOTS / "verify-page.png"), full_page=True)

    # the chat after the card's run: llama.cpp's greedy reply (F32 fixture) to the same question. (That the replay's
    # cache is never reused by a conversation that came before it: tests/engine/test_verify.py.)
    fx = next(p for p in load_fixture("smollm2.f32.json")["prompts"]
              if p.get("messages") == [{"role": "user", "content": QUESTION}])
    if not page.locator('[data-testid="greedy"]').is_checked():
        page.check('[data-testid="greedy"]')
    ids = _ask(lab, QUESTION)
    n = len(fx["prompt_ids"])
    assert ids[:n] == fx["prompt_ids"]
    assert ids[n:] == fx["ids"][:len(ids) - n] and len(ids) - n >= 4, (ids[n:], fx["ids"][:8])
    assert lab.errors() == [] and lab.foreign_requests() == []


@pytest.mark.slow   # a second model load on SwiftShader; the content hash is held natively in tests/unit/test_verify_compare.py
def test_same_name_other_bytes_has_no_reference(lab, smollm2_path, tmp_path):
    header = gguf.read_file(smollm2_path)
    ranges = verify.hash_ranges(smollm2_path.stat().st_size, header.data_offset)
    off, n = ranges[4]                        # a tensor byte in the middle sampled slice
    copy = tmp_path / smollm2_path.name       # the very same name
    shutil.copyfile(smollm2_path, copy)
    with open(copy, "r+b") as f:
        f.seek(off + n // 2)
        b = f.read(1)[0]
        f.seek(off + n // 2)
        f.write(bytes([b ^ 0x01]))
    page = lab.page
    lab.wait_ready()
    page.set_input_files('[data-testid="model-file"]', str(copy))
    page.wait_for_selector('[data-testid="prompt"]:not([disabled])', timeout=LOAD_MS)
    _run_card(lab)
    status = page.locator('[data-testid="verify-status"]')
    print(status.inner_text(), file=sys.stderr)
    assert status.get_attribute("data-state") == "no-reference", status.inner_text()
    assert "no reference for this file" in status.inner_text()
    assert page.locator('[data-testid="verify-row"]').count() == 0
    _kernels_all_pass(lab)
    _shot(lab, "verify-no-reference")
    assert lab.errors() == [] and lab.foreign_requests() == []


def test_card_on_a_hybrid(card_page):
    """The synthetic Qwen3.5-shaped file (gated delta-net layers: the replay's prefill and 16 decode steps carry their
    conv and recurrent states): found by its content, and every exact row passes as for the real models. The turn
    after the card reuses nothing of the turn before it, since the replay overwrote its states."""
    from lab.host.synthetic import arch as synthetic_arch
    from lab.host.models import cache_dir
    lab = take(card_page, synthetic_arch.build("qwen35", "f32", cache_dir() / "synthetic"))
    page = lab.page
    if not page.locator('[data-testid="greedy"]').is_checked():
        page.check('[data-testid="greedy"]')
    _ask(lab, "Hi")
    _run_card(lab)
    status = page.locator('[data-testid="verify-status"]')
    assert status.get_attribute("data-state") == "done" and status.get_attribute("data-ok") == "true", \
        status.inner_text()
    got = {(r["reference"], r["check"]): r for r in lab.cells("verify-row", ["reference", "check", "verdict", "number"])}
    assert all(got[("exact", c)]["verdict"] == "pass" for c in ("max |diff|", "RMS diff", "argmax", "greedy 16")), got
    assert float(got[("exact", "greedy 16")]["number"]) == 16
    _kernels_all_pass(lab)
    _shot(lab, "verify-card")
    # the follow-up turn: without the card it would reuse the first turn's states (tests/browser/test_hybrid_page.py)
    _ask(lab, "And after the card?")
    assert "reused 0" in page.inner_text('[data-testid="reuse"]'), page.inner_text('[data-testid="reuse"]')
    assert lab.errors() == [] and lab.foreign_requests() == []
