"""The panels and Forget in a real browser (headless Chromium, SwiftShader WebGPU) on the real SmolLM2 file.

One chat is shared by the module (a model load and a chat cost about a minute here): the system prompt names a king,
the user asks "The capital of France is", two tokens are generated. Every panel's numbers are then spot-checked
against the numpy reference (lab/reference) on the same token ids, read from the page; Forget runs last.

Tolerances: the page shows f32 values computed by the same WGSL as natively (tests/engine/test_probes.py, errors
~1e-5 there); SwiftShader's arithmetic (its exp above all) and the chat's decode-computed K/V add some. Measured
here: attention 1.1e-4, residual norms 5.4e-5 relative, lens probabilities 6.4e-4; the bounds are 3-10x those. A
wrong layer, head or position misses them by orders of magnitude; ids and neighbour order are compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.format import gguf
from lab.host.reference.forward import Reference
from lab.instruments import probes
from lab.text.tokenizer import from_metadata
from tests.browser.conftest import Lab, open_lab

SYSTEM = "Answer the king briefly."
PROMPT = "The capital of France is"
KING, PARIS = 4197, 7042          # ' king', ' Paris' in SmolLM2's vocabulary (checked below)
ATTN_TOL = 1e-3
RESID_RTOL = 5e-4
LENS_TOL = 2e-3
COS_TOL = 1e-5
SLOW = 600_000                    # ms: a probe pass or the lens on SwiftShader takes a minute or two here


@pytest.fixture(scope="module")
def ref(smollm2_path):
    return Reference(smollm2_path)


@pytest.fixture(scope="module")
def tok(smollm2_path):
    return from_metadata(gguf.read_file(smollm2_path).metadata)


@pytest.fixture(scope="module")
def lab_chat(browser, server_url, smollm2_path):
    with open_lab(browser, server_url) as lab:
        lab.wait_ready()
        lab.page.set_input_files('[data-testid="model-file"]', str(smollm2_path))
        lab.page.wait_for_selector('[data-testid="model-info"] dd[data-key="status"]', timeout=120_000)
        chat(lab, PROMPT, system=SYSTEM, max_tokens=2)
        yield lab


def chat(lab: Lab, prompt: str, system: str = "", max_tokens: int = 2) -> None:
    page = lab.page
    page.fill('[data-testid="system-prompt"]', system)
    page.fill('[data-testid="max-tokens"]', str(max_tokens))
    page.fill('[data-testid="prompt"]', prompt)
    page.click('[data-testid="send"]')
    page.wait_for_function("document.querySelector('[data-testid=timings]').textContent.length > 0", timeout=SLOW)


def test_king_embedding_and_neighbours(lab_chat, ref, tok):
    assert tok.encode(" king") == [KING]
    page = lab_chat.page
    ids = lab_chat.ids()
    pos = ids.index(KING)
    page.click(f'[data-testid=token][data-index="{pos}"]')
    lab_chat.open_panel("embedding")
    page.wait_for_selector("[data-testid=neighbour]", timeout=120_000)
    got = lab_chat.cells("neighbour", ["id", "cos"])
    want_ids, want_cos = ref.neighbours(KING, probes.NEIGHBOURS)
    assert [int(c["id"]) for c in got] == [int(i) for i in want_ids]
    np.testing.assert_allclose([float(c["cos"]) for c in got], want_cos, atol=COS_TOL)
    assert page.inner_text("[data-testid=embedding-id]") == str(KING)
    assert page.inner_text("[data-testid=embedding-text]") == "·king"
    values = lab_chat.cells("embedding-values", ["count"])[0]
    row = ref.w.get("token_embd.weight")[KING]
    assert int(values["count"]) == len(row) == 576
    shown = page.evaluate("[...document.querySelectorAll('[data-testid=embedding-values] [data-dim]')]"
                          ".map(e => Number(e.dataset.value))")
    np.testing.assert_array_equal(np.array(shown, np.float32), row)       # every value, exactly
    assert float(page.inner_text("[data-testid=embedding-norm]")) == pytest.approx(np.linalg.norm(row), abs=1e-4)
    cost = lab_chat.cells("embedding-cost", ["ms", "macs", "bytes"])[0]        # the whole table, read once
    assert float(cost["ms"]) > 0 and int(cost["macs"]) == 49152 * 576
    assert int(cost["bytes"]) == int(ref.w.tensors["token_embd.weight"].n_bytes)
    assert page.query_selector("[data-testid=embedding-per-layer]") is None       # no per-layer table: no section
    assert "Per-layer" not in page.inner_text("#embedding-body")
    print("\n' king' neighbours in Chromium:", page.locator("[data-testid=neighbour]").all_inner_texts())
    print("embedding panel:", page.inner_text("#embedding-body p"))


def test_attention_and_residual(lab_chat, ref):
    page = lab_chat.page
    ids = lab_chat.ids()
    n = len(ids)
    lab_chat.open_panel("attention")
    lab_chat.open_panel("residual")
    page.wait_for_selector("[data-testid=attention-cell]", timeout=SLOW)
    page.wait_for_selector("[data-testid=residual-bar]", timeout=SLOW)
    ref.forward(ids, trace=True)
    for layer, head in ((0, 0), (7, 3), (29, 8)):
        page.select_option("[data-testid=attention-layer]", str(layer))
        page.select_option("[data-testid=attention-head]", str(head))
        page.wait_for_function(f"document.querySelector('#attention-body p').textContent.startsWith('layer {layer}, head {head}')")
        if layer == 0:
            print("\nattention panel:", page.inner_text("#attention-body p"))
            assert float(page.get_attribute("[data-testid=attention-cost]", "data-ms")) > 0
        cells = lab_chat.cells("attention-cell", ["q", "k", "value"])
        assert len(cells) == n * (n + 1)                 # the whole conversation fits the window: n x (n + earlier)
        p = ref.trace[f"kq_soft_max-{layer}"][head]      # [t, n_kv]
        errs = [abs(float(c["value"]) - p[int(c["q"]), int(c["k"])]) for c in cells if c["k"] != "earlier"]
        print(f"\nattention layer {layer} head {head}: max |p - reference| {max(errs):.2e}")
        for c in cells:
            if c["k"] == "earlier":
                assert float(c["value"]) == 0.0          # the window starts at position 0
                continue
            q, k = int(c["q"]), int(c["k"])
            assert float(c["value"]) == pytest.approx(p[q, k], abs=ATTN_TOL), (layer, head, q, k)
    # the residual panel shows the selected position (the king, clicked in the test before, or the last one)
    bars = lab_chat.cells("residual-bar", ["layer", "value"])
    pos = page.evaluate("(() => { const s = document.querySelector('.tok.selected'); "
                        "return s ? Number(s.dataset.index) : null; })()")
    pos = len(ids) - 1 if pos is None else pos
    want = [np.linalg.norm(ref.trace["inp_embd"][pos])] + [np.linalg.norm(ref.trace[f"l_out-{il}"][pos])
                                                            for il in range(30)]
    assert [int(b["layer"]) for b in bars] == list(range(-1, 30))
    got = np.array([float(b["value"]) for b in bars])
    print(f"residual: max relative error {np.abs(got / want - 1).max():.2e}")
    np.testing.assert_allclose(got, want, rtol=RESID_RTOL)


def test_logit_lens_paris(lab_chat, ref, tok):
    assert tok.encode(" Paris") == [PARIS]
    page = lab_chat.page
    ids = lab_chat.ids()
    n = len(ids)
    lab_chat.open_panel("lens")
    page.wait_for_selector("[data-testid=logit-lens-cell]", timeout=SLOW)
    cells = lab_chat.cells("logit-lens-cell", ["layer", "pos", "id", "p"])
    top, prob = ref.logit_lens(ids)
    cols = min(probes.LENS_POSITIONS, n)
    assert len(cells) == 30 * cols
    assert {int(c["pos"]) for c in cells} == set(range(n - cols, n))
    got_p = np.array([float(c["p"]) for c in cells])
    want_p = np.array([prob[int(c["layer"]), int(c["pos"])] for c in cells])
    print(f"\nlens: max |p - reference| {np.abs(got_p - want_p).max():.2e}")
    for c in cells:
        layer, pos = int(c["layer"]), int(c["pos"])
        assert int(c["id"]) == top[layer, pos], (layer, pos)
    np.testing.assert_allclose(got_p, want_p, atol=LENS_TOL)
    # After "... France is" the last layer says " Paris"
    at_is = max(i for i, t in enumerate(ids[:-2]) if t == tok.encode(" is")[0])
    paris = [c for c in cells if int(c["layer"]) == 29 and int(c["pos"]) == at_is]
    assert paris and int(paris[0]["id"]) == PARIS
    first = min(int(c["layer"]) for c in cells if int(c["pos"]) == at_is and int(c["id"]) == PARIS)
    # its cost on the page: the time, and the work (30 layers x 16 positions x the 49,152 x 576 head)
    cost = lab_chat.cells("lens-cost", ["ms", "macs", "bytes"])[0]
    head = ref.w.tensors["token_embd.weight"]
    assert float(cost["ms"]) > 0 and int(cost["macs"]) == 30 * cols * 49152 * 576
    assert int(cost["bytes"]) == 30 * int(head.n_bytes)
    print("\nlens panel:", page.inner_text("#lens-body p"))
    print(f"logit lens in Chromium: ' Paris' top-1 at the position of ' is' from layer {first}, "
          f"p = {float(paris[0]['p']):.3f} at layer 29")


def test_kv_panel(lab_chat):
    page = lab_chat.page
    assert page.inner_text("[data-testid=kv-bytes-per-token]") == "46,080"     # 2 x 30 x 3 x 64 x 4
    used = lab_chat.cells("kv-used", ["used", "capacity"])[0]
    # two tokens generated, stopped by length: the last one was never fed back
    assert int(used["used"]) == len(lab_chat.ids()) - 1
    assert int(used["capacity"]) == 2048
    assert len(lab_chat.cells("kv-layer", ["used"])) == 30


def test_nothing_is_stored(lab_chat):
    """After a chat and every panel: no cookie, web storage, IndexedDB database or Cache Storage entry, and the
    URL carries nothing."""
    stored = lab_chat.page.evaluate("""async () => ({
        cookie: document.cookie, local: localStorage.length, session: sessionStorage.length,
        idb: (await indexedDB.databases()).length, caches: (await caches.keys()).length,
        url: location.search + location.hash })""")
    assert stored == {"cookie": "", "local": 0, "session": 0, "idb": 0, "caches": 0, "url": ""}


def test_forget_wipes_and_checks(lab_chat):
    """Runs last: Forget clears the conversation everywhere the lab can reach and proves it on the GPU."""
    page = lab_chat.page
    assert page.locator("[data-testid=message]").count() > 0
    page.click("[data-testid=forget]")
    page.wait_for_function("['wiped', 'nothing', 'failed'].includes(document.querySelector('[data-testid=forget-status]').dataset.state)",
                           timeout=SLOW)
    before = int(page.inner_text("[data-testid=forget-before]"))
    after = int(page.inner_text("[data-testid=forget-after]"))
    buffers = int(page.inner_text("[data-testid=forget-buffers]"))
    print(f"\nForget in Chromium: {buffers} buffers, {before} non-zero words before, {after} after; "
          + page.inner_text("[data-testid=forget-status]"))
    assert before > 0 and after == 0 and buffers > 100
    assert page.get_attribute("[data-testid=forget-status]", "data-state") == "wiped"
    # the page holds nothing of the conversation
    assert page.locator("[data-testid=message]").count() == 0
    assert page.locator("[data-testid=token]").count() == 0
    for testid in ("neighbour", "attention-cell", "logit-lens-cell", "residual-bar"):
        assert page.locator(f"[data-testid={testid}]").count() == 0, testid
    assert page.input_value("[data-testid=prompt]") == "" and page.input_value("[data-testid=system-prompt]") == ""
    assert int(lab_chat.cells("kv-used", ["used"])[0]["used"]) == 0
    # a second Forget finds nothing, and says so
    page.click("[data-testid=forget]")
    page.wait_for_function("document.querySelector('[data-testid=forget-status]').dataset.state === 'nothing'", timeout=SLOW)
    assert page.inner_text("[data-testid=forget-before]") == "0" == page.inner_text("[data-testid=forget-after]")
    assert "Nothing to wipe" in page.inner_text("[data-testid=forget-status]")
    # the next chat starts clean: no reuse of the forgotten cache, only the new turn in the context
    chat(lab_chat, "Hi", max_tokens=1)
    assert "reused 0" in page.inner_text("[data-testid=reuse]")
    assert page.locator("[data-testid=message]").count() == 2
    assert lab_chat.errors() == []
    assert lab_chat.foreign_requests() == []
