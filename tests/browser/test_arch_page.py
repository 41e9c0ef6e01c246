"""One new architecture held to llama.cpp in the page itself (headless Chromium, SwiftShader WebGPU): the synthetic
Llama 3 file (lab.host.synthetic_arch "llama3", F32: rope_freqs read from the file by the worker's one File.slice,
SmolLM2's vocabulary under the llama-bpe pre-tokenizer) is loaded through the file input, and its greedy continuation
of the fixture's prompt, run through the worker's engine (the `labGreedyIds` test hook: the prefill and decode steps
the chat runs, without a template), must be llama.cpp's id for id up to the first step where llama.cpp's own top-2
gap is a near-tie (tests/engine/test_architectures.py holds the same file natively, logits included)."""

from __future__ import annotations

import json

from lab.host import synthetic_arch
from lab.host.models import cache_dir
from tests.browser.conftest import open_lab
from tests.conftest import FIXTURES

NEAR_TIE = 0.01          # as tests/engine/test_architectures.py: F32 on both sides, summation order apart


def test_llama3_greedy_in_the_page_is_llama_cpps(browser, server_url):
    fx = json.loads((FIXTURES / "arch" / "llama3-f32.json").read_text())
    path = synthetic_arch.build("llama3", "f32", cache_dir() / "synthetic")
    with open_lab(browser, server_url) as lab:
        page = lab.page
        lab.wait_ready()
        lab.pick(path)
        lab.wait_loaded(path.name)
        want, gaps = fx["greedy"], fx["top2_gap"]
        got = page.evaluate("([ids, n]) => window.labGreedyIds(ids, n).then((m) => m.ids)", [fx["prompt_ids"], len(want)])
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            if gaps[i] < NEAR_TIE:
                break
            assert g == w, f"greedy step {i}: {g} != llama.cpp's {w} (gap {gaps[i]})"
        assert lab.errors() == [] and lab.foreign_requests() == []
