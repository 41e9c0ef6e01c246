"""The walking skeleton in a real browser: Pyodide boots in the module worker, WGSL runs through
WebGPU from Python, a real GGUF is summarized from its header, and bad files give clear messages."""

from __future__ import annotations

import re

import pytest

from lab.format import gguf



@pytest.fixture(scope="module")
def lab(module_lab):
    """The module's tests share one page, in file order (tests/browser/conftest.py `module_lab`)."""
    return module_lab



def _facts(page, testid: str) -> dict:
    keys = page.locator(f'[data-testid="{testid}"] dt').all_inner_texts()
    vals = page.locator(f'[data-testid="{testid}"] dd').all_inner_texts()
    return dict(zip(keys, vals))


def test_boot_gpu_info_and_selftest(lab):
    lab.wait_ready()
    st = lab.page.locator('[data-testid="gpu-selftest"]')
    assert st.get_attribute("data-state") == "pass", st.inner_text()
    info = _facts(lab.page, "gpu-info")
    assert info["backend"] == "browser"
    assert info["adapter"].strip()
    assert re.search(r"Python 3\.\d+ booted|Python 314", lab.page.inner_text('[data-testid="boot-status"]'))
    # nothing loaded yet: the cards that need a model wait for one
    assert lab.page.locator('[data-testid="verify-run"]').is_disabled()
    assert lab.page.locator('[data-testid="prompt"]').is_disabled()
    # the tensor-core prefill is offered only where the adapter has int8 subgroup matrices (the H200 page)
    offered = lab.page.evaluate("() => document.querySelector('[data-testid=int8-prefill]').disabled") is False
    if "swiftshader" in info["adapter"].lower():
        assert not offered
        assert "not on this adapter" in lab.page.inner_text('[data-testid="int8-note"]')
    assert lab.errors() == []
    assert lab.foreign_requests() == []


def test_real_model_summary_then_bad_files(lab, smollm2_path, tmp_path):
    lab.wait_ready()
    page = lab.page
    page.set_input_files('[data-testid="model-file"]', str(smollm2_path))
    page.wait_for_selector('[data-testid="model-info"] dd[data-key="architecture"]', timeout=60_000)
    facts = _facts(page, "model-info")
    expected = gguf.summary(gguf.read_file(smollm2_path))
    assert facts["architecture"] == "llama" == expected["architecture"]
    assert facts["layers"] == "30" and facts["embedding"] == "576"
    assert facts["heads"] == "9" and facts["KV heads"] == "3"
    assert facts["vocabulary"] == "49152"
    assert facts["tokenizer"] == "gpt2 / smollm"
    assert facts["tensors"] == str(expected["tensor_count"])
    assert "Q4_1" in facts["quant types"]
    assert page.locator('[data-testid="load-error"]').is_hidden()

    text = tmp_path / "notes.txt"
    text.write_text("this is not a model\n" * 10)
    page.set_input_files('[data-testid="model-file"]', str(text))
    err = page.locator('[data-testid="load-error"]')
    err.wait_for(state="visible", timeout=30_000)
    assert "not a GGUF file" in err.inner_text()

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(smollm2_path.read_bytes()[:300_000])
    page.set_input_files('[data-testid="model-file"]', str(truncated))
    page.wait_for_function("document.querySelector('[data-testid=load-error]').textContent.includes('truncated')",
                           timeout=30_000)

    # The page is still usable: the real file loads again without a reload.
    page.set_input_files('[data-testid="model-file"]', str(smollm2_path))
    page.wait_for_selector('[data-testid="model-info"] dd[data-key="architecture"]', timeout=60_000)
    assert page.locator('[data-testid="load-error"]').is_hidden()
    assert lab.errors() == []
    assert lab.foreign_requests() == []
