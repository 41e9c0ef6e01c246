"""The browser peer's bench page (scripts/peer, wllama) on the real SmolLM2, as `lab bench --backend wllama` drives it.

It loads through the file input under its own CSP and cross-origin isolation, a prompt fitted by the lab's tokenizer
is the length wllama counts, a turn decodes exactly what it was asked with the prompt cache off, a banned token is
never sampled, and the greedy ids of the fixtures' raw prompt are llama.cpp's CPU ids (wllama is llama.cpp; on
SwiftShader it runs on its CPU path). About 15 s here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.format import gguf
from lab.host.bench import browser as bench_browser
from lab.host.bench.wllama import FIXTURES, PEER, WASM, _fit
from lab.text.tokenizer import from_metadata

pytestmark = pytest.mark.skipif(not WASM.exists(), reason="scripts/peer's package is not installed (npm ci there)")


@pytest.fixture(scope="module")
def peer(browser, smollm2_path):
    srv, thread, url = bench_browser._serve(Path(smollm2_path), peer_dir=PEER)
    page = browser.new_context().new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(url + "/peer/")
    page.wait_for_function("window.peerBench !== undefined", timeout=60_000)
    page.set_input_files('[data-testid="model-file"]', str(smollm2_path))
    loaded = page.evaluate("o => peerBench.load(o)", {"n_ctx": 256})
    yield page, loaded, errors
    page.context.close()
    srv.should_exit = True
    thread.join(10)


def test_loads_isolated_and_says_its_path(peer):
    page, loaded, errors = peer
    assert loaded["cross_origin_isolated"] is True
    assert loaded["libllama"].startswith("b12211")
    assert loaded["context"]["n_ctx"] == 256
    off = loaded["offloaded"]
    # the GPU path names every layer, or llama.cpp printed no offload line at all (its CPU path)
    assert off is None or off["layers"] == off["of"] == 31, off
    assert errors == []


def test_a_fitted_turn_is_what_was_asked(peer, smollm2_path):
    page, _, errors = peer
    tok = from_metadata(gguf.read_file(smollm2_path).metadata)
    r = page.evaluate("o => peerBench.turn(o)", {"prompt": _fit(tok, 24), "max_tokens": 3})
    t = r["timings"]
    assert (t["prompt_n"], t["cache_n"], t["predicted_n"]) == (24, 0, 3)
    assert r["ttft_ms"] > 0 and r["decode_ms"] > 0 and r["finish_reason"] == "length"
    again = page.evaluate("o => peerBench.turn(o)", {"prompt": _fit(tok, 24), "max_tokens": 3})
    assert again["timings"]["cache_n"] == 0          # the prompt cache is off: the same prompt prefilled again
    assert errors == []


def test_greedy_ids_are_llama_cpps_and_a_ban_holds(peer):
    page, _, errors = peer
    ref = next(p for p in json.loads((FIXTURES / "smollm2.json").read_text())["prompts"] if not p["chat"])
    r = page.evaluate("o => peerBench.greedy(o)", {"prompt": ref["prompt"], "max_tokens": 8})
    ids = [c["id"] for c in r["choices"][0]["logprobs"]["content"]]
    assert ids == ref["ids"][:8]
    first = ref["ids"][0]
    free = page.evaluate("o => peerBench.turn(o)", {"prompt": ref["prompt"], "max_tokens": 1})
    banned = page.evaluate("o => peerBench.turn(o)", {"prompt": ref["prompt"], "max_tokens": 1, "ban": [first]})
    tok_text = r["choices"][0]["logprobs"]["content"][0]["token"]
    assert free["text"] == tok_text and banned["text"] != tok_text
    assert errors == []
