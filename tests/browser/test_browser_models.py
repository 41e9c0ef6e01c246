"""Qwen2.5-Coder-0.5B-Instruct and Gemma 3 270M in headless Chromium (SwiftShader WebGPU), loaded through the file
input: a greedy chat reply byte-identical to llama.cpp's, then the embedding inspector and the logit lens on the same
loaded model, each with its cost on the page. With --slow only (`pytest --slow tests/browser/test_browser_models.py`).

One page per model, shared by its tests (a load and a chat cost a minute or two here). Expected values come from
llama.cpp (tests/fixtures/<model>.f32.json: greedy ids on an F32 copy of the weights, which is the arithmetic our
engine does on the quantized file) and from the numpy reference (lab/reference), never from numbers typed in here.

Cost: SwiftShader runs on two shared cores, and Qwen's forward is about 4x SmolLM2's, so replies are a few tokens, the
lens shows one position, and it runs on Gemma only: its 262,144-wide tied head is the wider case, and Qwen's lens
would add a minute or more here (measured once: docs/panels.md). Tolerances are test_panels.py's, for the same
reasons (f32 WGSL against numpy f32).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from lab.format import gguf
from lab.host.reference.forward import Reference
from lab.instruments import probes
from lab.text.tokenizer import from_metadata
from tests.browser.conftest import open_lab
from tests.conftest import load_fixture

QUESTION = "What is the capital of France?"
PATHS = {"qwen2.5": "qwen_path", "gemma3": "gemma_path"}
N_REPLY = 4            # greedy tokens compared with llama.cpp (Qwen: "The capital of France"); 10 s a decode step here
NEAR_TIE = 0.01        # llama.cpp top-2 gap under which a divergence would be a tie (tests/engine/test_engine.py)
LENS_POSITIONS = 1     # the last reply token: what comes after it is llama.cpp's next greedy token
LENS_MODELS = {"gemma3"}
COS_TOL = 1e-5
LENS_TOL = 2e-3
LOAD_MS = 300_000
SLOW_MS = 600_000      # a prefill or the lens of Qwen on SwiftShader takes minutes at worst here


class Model:
    """One model loaded in one page, after one chat turn; the reference and the fixture made on first use."""

    def __init__(self, name, path, lab):
        self.name, self.path, self.lab = name, path, lab
        self.header = gguf.read_file(path)
        self.tensors = {t.name: t for t in self.header.tensors}
        self.tok = from_metadata(self.header.metadata)
        fx = load_fixture(f"{name}.f32.json")
        self.want = next(p for p in fx["prompts"] if p.get("messages") == [{"role": "user", "content": QUESTION}])
        self.reply = ""
        self._ref = None

    @property
    def ref(self) -> Reference:
        if self._ref is None:
            self._ref = Reference(self.path)
        return self._ref


def _cost(page, testid: str) -> tuple[float, int, int]:
    """A panel's cost as the page shows it (time, multiply-adds, weight bytes), checked against its data attributes."""
    c = page.locator(f"[data-testid={testid}]")
    ms, macs, nbytes = (c.get_attribute(f"data-{k}") for k in ("ms", "macs", "bytes"))
    assert re.fullmatch(rf"{re.escape(ms)} ms: [\d.]+ [KMGT]? ?multiply-adds over [\d.]+ [KMGT]?B of weights",
                        c.inner_text()), c.inner_text()
    return float(ms), int(macs), int(nbytes)


def _timings(page) -> dict:
    text = page.inner_text('[data-testid="timings"]')
    m = re.fullmatch(r"first token (\d+) ms · prefill ([\d.]+) tok/s · decode ([\d.]+) tok/s · "
                     r"(\d+) tokens \((\w+)\)", text.strip())
    assert m, text
    return {"ttft_ms": int(m[1]), "prefill_tok_s": float(m[2]), "decode_tok_s": float(m[3]), "tokens": int(m[4]),
            "stop": m[5]}


# Both run with --slow (a load and a reply cost 2-3 minutes each on SwiftShader); natively both are in the default
# run, and in the page the default run holds SmolLM2 (test_browser_chat.py) and a Llama 3 file (test_arch_page.py).
@pytest.fixture(scope="module", params=[pytest.param(n, marks=pytest.mark.slow) for n in PATHS])
def model(request, browser, server_url):
    name = request.param
    path = request.getfixturevalue(PATHS[name])
    with open_lab(browser, server_url) as lab:
        m = Model(name, path, lab)
        page = lab.page
        lab.wait_ready()
        lab.pick(path)
        lab.wait_loaded(path.name, LOAD_MS)
        page.fill('[data-testid="max-tokens"]', str(N_REPLY))
        page.fill('[data-testid="prompt"]', QUESTION)
        page.press('[data-testid="prompt"]', "Enter")
        page.wait_for_function("document.querySelector('[data-testid=timings]').textContent.length > 0 && "
                               "document.querySelector('[data-testid=stop]').disabled", timeout=SLOW_MS)
        m.reply = page.locator('[data-testid="message"]').last.inner_text()
        yield m


def test_greedy_reply_is_llama_cpp(model):
    want, lab = model.want, model.lab
    assert min(want["top2_gap"][:N_REPLY + 1]) >= NEAR_TIE      # no tie that could excuse a divergence
    ids = want["ids"][:N_REPLY]
    assert not set(ids) & model.tok.eos_ids                      # the reply runs the whole length
    assert model.reply.encode() == model.tok.decode_bytes(ids)
    assert want["text"].startswith(model.reply)
    assert lab.ids() == want["prompt_ids"] + ids
    t = _timings(lab.page)
    assert t["tokens"] == N_REPLY and t["stop"] == "length"
    upload = lab.page.inner_text('[data-testid="model-info"] dd[data-key="upload"]')
    print(f"\n{model.name} in Chromium: reply {model.reply!r}; upload {upload}; "
          f"first token {t['ttft_ms']} ms ({len(want['prompt_ids'])} prompt tokens), prefill {t['prefill_tok_s']} "
          f"tok/s, decode {t['decode_tok_s']} tok/s")


def test_embedding_neighbours(model):
    """Click ' France' in the prompt: its row and nearest tokens over the whole table, as the reference has them."""
    lab, page = model.lab, model.lab.page
    (tid,) = model.tok.encode(" France")
    pos = lab.ids().index(tid)
    page.click(f'[data-testid=token][data-index="{pos}"]')
    lab.open_panel("embedding")
    page.wait_for_selector("[data-testid=neighbour]", timeout=SLOW_MS)
    got = lab.cells("neighbour", ["id", "cos"])
    want_ids, want_cos = model.ref.neighbours(tid, probes.NEIGHBOURS)
    got_cos = np.array([float(c["cos"]) for c in got])
    print(f"\n{model.name}: max |cos - reference| {np.abs(got_cos - want_cos).max():.1e}, "
          f"closest neighbours {np.diff(want_cos).__abs__().min():.1e} apart")
    assert [int(c["id"]) for c in got] == [int(i) for i in want_ids]
    np.testing.assert_allclose(got_cos, want_cos, atol=COS_TOL)
    row = model.ref.w.get("token_embd.weight")[tid]
    shown = page.evaluate("[...document.querySelectorAll('[data-testid=embedding-values] [data-dim]')]"
                          ".map(e => Number(e.dataset.value))")
    np.testing.assert_array_equal(np.array(shown, np.float32), row)
    # its cost: the time, and the whole table read once (n_vocab x n_embd multiply-adds), as the file's header has it
    table = model.tensors["token_embd.weight"]
    ms, macs, nbytes = _cost(page, "embedding-cost")
    assert ms > 0 and (macs, nbytes) == (table.n_elements, table.nbytes)
    print(f"{model.name} ' France' neighbours in Chromium:", page.locator("[data-testid=neighbour]").all_inner_texts())
    print("embedding panel:", page.inner_text("#embedding-body p"))


def test_logit_lens(model):
    """The lens over the last positions: every cell as the reference's lens; the last layer is the model's own
    prediction, so it names llama.cpp's greedy tokens too."""
    if model.name not in LENS_MODELS:
        pytest.skip(f"the lens runs on {', '.join(sorted(LENS_MODELS))} only: a minute or more per model here")
    lab, page = model.lab, model.lab.page
    ids = lab.ids()
    n, n_layer = len(ids), model.ref.hp.n_layer
    # chosen before the card comes on screen (set in place: select_option would scroll it into view and start the
    # default request), so the first request is already this small
    page.eval_on_selector("[data-testid=lens-positions]",
                          "(s, v) => { s.value = v; s.dispatchEvent(new Event('change')); }", str(LENS_POSITIONS))
    lab.open_panel("lens")
    page.wait_for_selector("[data-testid=logit-lens-cell]", timeout=SLOW_MS)
    cells = lab.cells("logit-lens-cell", ["layer", "pos", "id", "p"])
    assert len(cells) == n_layer * LENS_POSITIONS
    assert {int(c["pos"]) for c in cells} == set(range(n - LENS_POSITIONS, n))
    top, prob = model.ref.logit_lens(ids)
    for c in cells:
        layer, pos = int(c["layer"]), int(c["pos"])
        assert int(c["id"]) == top[layer, pos], (layer, pos)
    got_p = np.array([float(c["p"]) for c in cells])
    want_p = np.array([prob[int(c["layer"]), int(c["pos"])] for c in cells])
    print(f"\n{model.name} lens: max |p - reference| {np.abs(got_p - want_p).max():.2e}")
    np.testing.assert_allclose(got_p, want_p, atol=LENS_TOL)
    last = [int(c["id"]) for c in cells if int(c["layer"]) == n_layer - 1]
    assert last == [model.want["ids"][N_REPLY]]
    # its cost: the time, and the head once per layer (n_layer x n_vocab x n_embd multiply-adds per position)
    head = model.tensors.get("output.weight", model.tensors["token_embd.weight"])
    ms, macs, nbytes = _cost(page, "lens-cost")
    assert ms > 0 and (macs, nbytes) == (n_layer * LENS_POSITIONS * head.n_elements, n_layer * head.nbytes)
    print("lens panel:", page.inner_text("#lens-body p"))


def test_no_errors_no_foreign_requests(model):
    assert model.lab.errors() == []
    assert model.lab.foreign_requests() == []
