"""Every way a session can go wrong in the page, each ending with the page usable: a good model loads and chats.

The files are the small synthetic Llama 3 (tests/conftest.py `tiny`; its Q8_0 copy for the NaN weights, whose blocks
open with the f16 scale a poisoned copy overwrites): what fails here is the page's handling, not a model's arithmetic.

Bad metadata, NaN weights, a second file picked while one loads, a cancelled load, Forget while a reply streams, and
a lost GPU device (destroyed from inside the worker, as a driver reset would take it). Screenshots of the failure
states go to $LAB_SHOTS (default /tmp/llm-lab-shots)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tests.conftest import F16_NAN, poisoned_copy, tiny


LOAD_MS = 300_000
REPLY_MS = 600_000
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
EPS_KEY = b"llama.attention.layer_norm_rms_epsilon"


@pytest.fixture(scope="module")
def lab(module_lab):
    """The module's tests share one page, in file order (tests/browser/conftest.py `module_lab`)."""
    return module_lab



def _shot(lab, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.screenshot(path=str(SHOTS / f"failure-{name}.png"), full_page=True)


def _negative_eps_copy(src: Path, dst: Path) -> Path:
    """The file with its RMSNorm epsilon (a float32 key) set to -1: fine bytes, hostile value."""
    data = bytearray(src.read_bytes())
    at = data.index(EPS_KEY) + len(EPS_KEY)
    assert struct.unpack_from("<I", data, at)[0] == 6          # GGUF type 6: float32
    struct.pack_into("<f", data, at + 4, -1.0)
    dst.write_bytes(bytes(data))
    return dst


def _wait_loaded(lab, name: str) -> None:
    try:
        lab.wait_loaded(name, LOAD_MS)
    except AssertionError:
        _shot(lab, "not-loaded")
        raise


def _wait_error(lab, text: str) -> str:
    lab.page.wait_for_function(
        "t => document.querySelector('[data-testid=load-error]').textContent.includes(t)", arg=text, timeout=LOAD_MS)
    return lab.page.inner_text('[data-testid="load-error"]')


def _chat(lab, text: str, max_tokens: int = 2) -> None:
    page = lab.page
    page.fill('[data-testid="max-tokens"]', str(max_tokens))
    page.fill('[data-testid="prompt"]', text)
    before = page.locator('[data-testid="message"]').count()
    page.press('[data-testid="prompt"]', "Enter")
    page.wait_for_function(
        "n => document.querySelectorAll('[data-testid=message]').length >= n + 2"
        " && document.querySelector('[data-testid=stop]').disabled", arg=before, timeout=REPLY_MS)


def _chats_after(lab, model: Path) -> None:
    """The good model loads and answers: the page survived whatever came before."""
    lab.pick(model)
    _wait_loaded(lab, model.name)
    _chat(lab, "Hi")
    assert lab.page.locator('[data-testid="message"]').last.inner_text().strip()
    assert lab.foreign_requests() == []


def test_hostile_files_cancel_and_a_second_pick(lab, tiny_path, smollm2_path, tmp_path):
    lab.wait_ready()
    page = lab.page
    # metadata: refused before any upload, naming the key and the value
    bad = _negative_eps_copy(tiny_path, tmp_path / "negative-eps.gguf")
    lab.pick(bad)
    msg = _wait_error(lab, "layer_norm_rms_epsilon")
    assert "-1" in msg and page.locator('[data-testid="prompt"]').is_disabled()
    _shot(lab, "metadata")

    # a load cancelled half way: said so, nothing loaded
    lab.pick(tiny_path)
    page.wait_for_selector('[data-testid="load-cancel"]:not([disabled])', timeout=LOAD_MS)
    page.click('[data-testid="load-cancel"]')
    _wait_error(lab, "cancelled")
    assert page.locator('[data-testid="prompt"]').is_disabled()

    # NaN weights load (the header is fine) and stop the reply with the layer where the values broke
    nan = poisoned_copy(tiny("q8_0"), tmp_path / "nan-weights.gguf", "blk.2.ffn_down.weight", F16_NAN)
    lab.pick(nan)
    _wait_loaded(lab, nan.name)
    page.fill('[data-testid="max-tokens"]', "4")
    page.fill('[data-testid="prompt"]', "Hi")
    page.press('[data-testid="prompt"]', "Enter")
    page.wait_for_function("document.querySelector('[data-testid=load-error]').textContent.includes('l_out-2')",
                           timeout=REPLY_MS)
    assert "NaN or infinite" in page.inner_text('[data-testid="load-error"]')
    assert page.locator('[data-testid="send"]').is_enabled()          # the turn ended; the page takes the next
    _shot(lab, "nan-weights")

    # a second file picked while the first loads: the second one is what ends up loaded. The first is SmolLM2, whose
    # kernels this page has not compiled yet: its load lasts seconds (a file loaded before would take a fraction of one,
    # its pipelines kept by the worker's device)
    lab.pick(smollm2_path)
    page.wait_for_selector('[data-testid="load-progress"]:not([hidden])', timeout=LOAD_MS)
    _chats_after(lab, tiny_path)
    assert tiny_path.name in page.inner_text('[data-testid="model-info"]')
    assert lab.errors() == []


def test_forget_while_a_reply_streams(lab, tiny_path):
    lab.wait_ready()
    page = lab.page
    lab.pick(tiny_path)
    _wait_loaded(lab, tiny_path.name)
    page.fill('[data-testid="max-tokens"]', "400")        # far longer than the wait for its first token
    page.fill('[data-testid="prompt"]', "Tell me a long story about a lighthouse keeper.")
    page.press('[data-testid="prompt"]', "Enter")
    page.wait_for_function("document.querySelectorAll('[data-testid=token]').length > 0", timeout=REPLY_MS)
    prompt_tokens = page.locator('[data-testid="token"]').count()
    page.wait_for_function("n => document.querySelectorAll('[data-testid=token]').length > n", arg=prompt_tokens,
                           timeout=REPLY_MS)                           # a generated token is on the page
    page.click('[data-testid="forget"]')
    page.wait_for_function("document.querySelector('[data-testid=forget-status]').dataset.state === 'wiped'",
                           timeout=REPLY_MS)
    assert int(page.inner_text('[data-testid="forget-after"]')) == 0
    assert int(page.inner_text('[data-testid="forget-before"]')) > 0
    assert page.locator('[data-testid="message"]').count() == 0 and page.locator('[data-testid="token"]').count() == 0
    _chat(lab, "Hi")
    assert "reused 0" in page.inner_text('[data-testid="reuse"]')
    assert lab.errors() == []


def test_lost_device_then_a_new_one(lab, tiny_path):
    lab.wait_ready()
    page = lab.page
    worker = next(w for w in page.workers if w.url.endswith("/web/worker.js"))
    # The worker's GPUDevice lives in Python; labUpload is handed it, so wrapping it catches the handle.
    worker.evaluate("() => { const up = globalThis.labUpload;"
                    " globalThis.labUpload = (device, ...rest) => { globalThis.caught = device; return up(device, ...rest); }; }")
    lab.pick(tiny_path)
    _wait_loaded(lab, tiny_path.name)
    _chat(lab, "Hi")
    # a card on screen asks for its inspection; its answer, a failure once the model is gone, must not take the lost
    # GPU's message off the page (web/main.js cardFailed)
    lab.open_panel("attention")
    worker.evaluate("() => globalThis.caught.destroy()")
    page.wait_for_function("document.querySelector('[data-testid=load-error]').textContent.includes('GPU device was lost')",
                           timeout=LOAD_MS)
    assert page.locator('[data-testid="message"]').count() == 0 and page.locator('[data-testid="token"]').count() == 0
    _shot(lab, "device-lost")
    page.wait_for_selector('[data-testid="gpu-selftest"][data-state="pass"]', timeout=LOAD_MS)   # a new device
    _chats_after(lab, tiny_path)
    assert [e for e in lab.errors() if "lost" not in e.lower()] == []
