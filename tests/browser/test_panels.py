"""The panels and Forget in a real browser (headless Chromium, SwiftShader WebGPU) on the small synthetic Llama 3 file
(tests/conftest.py `tiny`: 4 layers of 256, 4 heads, SmolLM2's vocabulary). The panels' code is the same for every
model; what a real model's panels say (' king' among royal neighbours, ' Paris' at the last layer after "... France
is") is held natively on SmolLM2 (tests/engine/test_probes.py), and the page's engine on the real SmolLM2 by the chat
test (tests/browser/test_browser_chat.py).

One chat is shared by the module: the system prompt names a king, the user asks "The capital of France is", two tokens
are generated. Every panel's numbers are then checked against the numpy reference (lab/reference) on the same token
ids, read from the page; Forget runs last.

Tolerances: the page shows f32 values computed by the same WGSL as natively (tests/engine/test_probes.py, errors
~1e-5 there); SwiftShader's arithmetic (its exp above all) and the chat's decode-computed K/V add some. Measured on
SmolLM2 (30 layers): attention 1.1e-4, residual norms 5.4e-5 relative, lens probabilities 6.4e-4; on this file 6e-7,
4.5e-7 and 2.8e-6. The bounds keep SmolLM2's margin (3-10x its figures), so the test holds either file. A wrong layer,
head or position misses them by orders of magnitude; ids and neighbour order are compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.format import gguf
from lab.host.reference.forward import Reference
from lab.instruments import probes
from lab.text.tokenizer import from_metadata
from tests.browser.conftest import Lab, take

SYSTEM = "Answer the king briefly."
PROMPT = "The capital of France is"
KING = 4197                       # ' king' in SmolLM2's vocabulary, which the file carries (checked below)
N_LAYER, N_HEAD, N_EMBD, N_VOCAB = 4, 4, 256, 49152     # synthetic_arch "llama3"
ATTN_TOL = 1e-3
RESID_RTOL = 5e-4
LENS_TOL = 2e-3
COS_TOL = 1e-5
SLOW = 600_000                    # ms: a probe pass or the lens on SwiftShader takes a minute or two here


@pytest.fixture(scope="module")
def ref(tiny_path):
    return Reference(tiny_path)


@pytest.fixture(scope="module")
def tok(tiny_path):
    return from_metadata(gguf.read_file(tiny_path).metadata)


@pytest.fixture(scope="module")
def lab_chat(card_page, tiny_path):
    lab = take(card_page, tiny_path)
    chat(lab, PROMPT, system=SYSTEM, max_tokens=2)
    return lab


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
    assert int(values["count"]) == len(row) == N_EMBD
    shown = page.evaluate("[...document.querySelectorAll('[data-testid=embedding-values] [data-dim]')]"
                          ".map(e => Number(e.dataset.value))")
    np.testing.assert_array_equal(np.array(shown, np.float32), row)       # every value, exactly
    assert float(page.inner_text("[data-testid=embedding-norm]")) == pytest.approx(np.linalg.norm(row), abs=1e-4)
    cost = lab_chat.cells("embedding-cost", ["ms", "macs", "bytes"])[0]        # the whole table, read once
    assert float(cost["ms"]) > 0 and int(cost["macs"]) == N_VOCAB * N_EMBD
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
    lab_chat.wait_in_card("attention", "[data-testid=attention-cell]", SLOW)
    page.wait_for_selector("[data-testid=residual-bar]", timeout=SLOW)
    ref.forward(ids, trace=True)
    for layer, head in ((0, 0), (2, 1), (N_LAYER - 1, N_HEAD - 1)):
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
                                                            for il in range(N_LAYER)]
    assert [int(b["layer"]) for b in bars] == list(range(-1, N_LAYER))
    got = np.array([float(b["value"]) for b in bars])
    print(f"residual: max relative error {np.abs(got / want - 1).max():.2e}")
    np.testing.assert_allclose(got, want, rtol=RESID_RTOL)


def test_logit_lens(lab_chat, ref):
    page = lab_chat.page
    ids = lab_chat.ids()
    n = len(ids)
    lab_chat.open_panel("lens")
    page.wait_for_selector("[data-testid=logit-lens-cell]", timeout=SLOW)
    cells = lab_chat.cells("logit-lens-cell", ["layer", "pos", "id", "p"])
    top, prob = ref.logit_lens(ids)
    cols = min(probes.LENS_POSITIONS, n)
    assert len(cells) == N_LAYER * cols
    assert {int(c["pos"]) for c in cells} == set(range(n - cols, n))
    got_p = np.array([float(c["p"]) for c in cells])
    want_p = np.array([prob[int(c["layer"]), int(c["pos"])] for c in cells])
    print(f"\nlens: max |p - reference| {np.abs(got_p - want_p).max():.2e}")
    for c in cells:
        layer, pos = int(c["layer"]), int(c["pos"])
        assert int(c["id"]) == top[layer, pos], (layer, pos)
    np.testing.assert_allclose(got_p, want_p, atol=LENS_TOL)
    # its cost on the page: the time, and the work (layers x positions x the vocabulary x embedding head)
    cost = lab_chat.cells("lens-cost", ["ms", "macs", "bytes"])[0]
    head = ref.w.tensors["token_embd.weight"]
    assert float(cost["ms"]) > 0 and int(cost["macs"]) == N_LAYER * cols * N_VOCAB * N_EMBD
    assert int(cost["bytes"]) == N_LAYER * int(head.n_bytes)
    print("\nlens panel:", page.inner_text("#lens-body p"))


def test_kv_panel(lab_chat):
    page = lab_chat.page
    assert page.inner_text("[data-testid=kv-bytes-per-token]") == "4,096"     # 2 x 4 layers x 2 KV heads x 64 x 4
    used = lab_chat.cells("kv-used", ["used", "capacity"])[0]
    # two tokens generated, stopped by length: the last one was never fed back
    assert int(used["used"]) == len(lab_chat.ids()) - 1
    assert int(used["capacity"]) == 2048
    assert len(lab_chat.cells("kv-layer", ["used"])) == N_LAYER


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
    assert before > 0 and after == 0 and buffers > 2 * N_LAYER      # at least each layer's K and V caches
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
