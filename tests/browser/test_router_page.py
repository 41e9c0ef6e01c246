"""The Router card in headless Chromium (SwiftShader WebGPU), driven as a user drives it, on the synthetic qwen3moe
F32 file (lab.host.synthetic.arch "qwen3moe": 4 routed layers of 8 experts, 2 a token, SmolLM2's vocabulary), against
the numpy reference (lab/host/reference/forward.py) on the same file and the page's own context ids:

- after a chat whose prompt holds HTML, the card, on screen, reads the conversation by itself: a tokens x experts
  heatmap a layer whose chosen experts are the reference's token for token and whose weights and entropies are within
  TOL of it, the pieces shown as text (no element made of them), the load row the count of the choices; the slider shows another
  layer; the entropy bars are the reference's mean entropies;
- with --slow (12 s of SwiftShader; tests/engine/test_router_card.py holds the ablation natively by default), an
  expert clicked is ablated (left out of that layer's weighted sum, not renormalised): its summary, the top 5, and the
  greedy continuations with and without it the reference's (the expert's weight zeroed);
- JSON and PNG export; the card at 1400 and 800 px pushes nothing sideways (screenshots to $LAB_SHOTS, and to
  docs/screenshots/ with LAB_DOC_SHOTS=1);
- Forget empties the card and says the router's rows (and the ablation's runs) read back as zero.

A dense model's card (no router: it says so, open and folded, and asks for nothing) is held on the synthetic Llama 3
by tests/browser/test_navigator_page.py, which records every message the page posts.

One page serves the module (the tests run in file order): the cards' page (tests/browser/conftest.py `card_page`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from lab.host.models import cache_dir
from lab.host.reference import Reference
from lab.host.reference.interventions import hooks
from lab.host.synthetic import arch as synthetic_arch
from lab.instruments.interventions import Intervention
from tests.browser.conftest import ON_SCREEN_JS, Lab, take
from tests.browser.test_layout import NARROW, WIDE, check_png, download, shot

SLOW = 600_000          # ms: a load, a reply or a reading on SwiftShader, the machine's two cores shared
# SwiftShader against numpy, both F32 on an F32 file: summation order apart (the engine holds 1e-4 of each traced
# tensor's magnitude natively, tests/engine/test_router_card.py); weights and entropies are at most 1 and 3 bits
TOL = 1e-3
PROMPT = "Say <b>hi</b> & <img src=x onerror=alert(1)>"
MAX_NEW = 4


@pytest.fixture(scope="module")
def path():
    return synthetic_arch.build("qwen3moe", "f32", cache_dir() / "synthetic")


@pytest.fixture(scope="module")
def ref(path):
    return Reference(path)


def show(lab: Lab, timeout_ms: int = 60_000) -> None:
    """The card brought on screen until the page counts it there (as conftest's Lab.open_panel for the panels)."""
    for _ in range(max(1, timeout_ms // 5_000)):
        lab.page.locator("#router").evaluate("e => e.scrollIntoView({block: 'start'})")
        try:
            lab.page.wait_for_function(ON_SCREEN_JS, arg="router", timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"the router card never counted as on screen: {lab.card_state('router')}")


@pytest.fixture(scope="module")
def moe(card_page, path):
    lab = take(card_page, path, viewport=WIDE)
    lab.page.check("[data-testid=greedy]")
    # the card on screen before the chat (the chat's column stays pinned beside it): after the reply it reads the
    # conversation by itself, and the probe cards, off screen, ask for nothing that would keep the worker busy first
    show(lab)
    assert "chat first" in lab.page.inner_text("[data-testid=router-status]")
    lab.send(PROMPT, max_tokens=MAX_NEW)
    lab.wait_in_card("router", "[data-testid=router-heatmap]", SLOW)
    return lab


def shown_layer(lab: Lab) -> dict:
    """The heatmap as drawn: its layer, and per token the (expert, weight) of every coloured cell and the entropy."""
    return lab.page.evaluate("""() => {
        const g = document.querySelector('[data-testid=router-heatmap]');
        const cells = [...g.querySelectorAll('[data-testid=router-cell]')];
        const rows = Number(g.dataset.rows), cols = Number(g.dataset.cols);
        const picks = Array.from({length: rows}, (_, j) => cells.slice(j * cols, (j + 1) * cols)
            .filter(c => c.dataset.weight != null).map(c => [Number(c.dataset.expert), Number(c.dataset.weight)]));
        const h = [...g.querySelectorAll('[data-testid=router-token-entropy]')].map(e => Number(e.dataset.value));
        const load = [...g.querySelectorAll('[data-testid=router-load]')].map(e => Number(e.dataset.value));
        const labels = [...g.querySelectorAll('.qlabel')].map(e => e.textContent);
        return {layer: Number(g.dataset.layer), rows, cols, picks, h, load, labels}; }""")


def check_against(lab: Lab, ref: Reference, drawn: dict) -> tuple[float, float]:
    """The drawn layer against the reference's trace; returns the largest weight and entropy differences."""
    il = drawn["layer"]
    want_ids = np.asarray(ref.trace[f"ffn_moe_topk-{il}"])
    want_w = np.asarray(ref.trace[f"ffn_moe_weights_norm-{il}"])
    p = np.asarray(ref.trace[f"ffn_moe_probs-{il}"], np.float64)
    want_h = -(p * np.log2(p)).sum(axis=1)
    assert drawn["rows"] == len(want_ids) and drawn["cols"] == 8
    worst = 0.0
    for j, picks in enumerate(drawn["picks"]):
        assert sorted(e for e, _ in picks) == sorted(want_ids[j].tolist()), f"layer {il} token {j}"
        for e, w in picks:
            worst = max(worst, abs(w - want_w[j][list(want_ids[j]).index(e)]))
    h = float(np.abs(np.array(drawn["h"]) - want_h).max())
    assert worst <= TOL and h <= TOL, (worst, h)
    assert drawn["load"] == np.bincount(want_ids.ravel(), minlength=8).tolist()
    return worst, h


def test_the_heatmap_is_the_engines_routing(moe, ref):
    page = moe.page
    ids = moe.ids()
    ref.hooks = {}
    ref.forward(ids, trace=True)
    drawn = shown_layer(moe)
    assert drawn["layer"] == 0
    errs = check_against(moe, ref, drawn)
    # the prompt's pieces as text: the user's "<img ...>" shown, never made an element
    assert any("<" in label for label in drawn["labels"]) and page.locator("#router img, #router b").count() == 0
    bars = moe.cells("router-entropy-row", ["layer", "value"])
    assert [int(b["layer"]) for b in bars] == [0, 1, 2, 3]
    for b in bars:
        p = np.asarray(ref.trace[f"ffn_moe_probs-{b['layer']}"], np.float64)
        assert abs(float(b["value"]) - float(-(p * np.log2(p)).sum(axis=1).mean())) <= TOL
    # the slider: another layer, drawn as the reference routes it
    page.locator("[data-testid=router-layer]").evaluate(
        "e => { e.value = '2'; e.dispatchEvent(new Event('input', {bubbles: true})); }")
    page.wait_for_selector("[data-testid=router-heatmap][data-layer='2']", timeout=5_000)
    assert "layer 2" in page.inner_text("[data-testid=router-layer-name]")
    errs = [max(a, b) for a, b in zip(errs, check_against(moe, ref, shown_layer(moe)))]
    print(f"\n{drawn['rows']} tokens in the page: layers 0 and 2 the reference's experts, weights within "
          f"{errs[0]:.2g}, entropies within {errs[1]:.2g} bits ({page.inner_text('[data-testid=router-status]')})")
    assert page.inner_text("#router [data-testid=router-what]").startswith("8 experts, 2 a token, at 4 routed layers")


ABLATED = []        # the ablation's test ran (--slow): the export and Forget then hold its result and buffers too


@pytest.mark.slow       # 12 s of SwiftShader (the conversation and 8 greedy tokens, twice); held natively by default
def test_an_expert_clicked_is_ablated_as_the_reference_without_it(moe, ref):
    page = moe.page
    drawn = shown_layer(moe)
    layer, load = drawn["layer"], drawn["load"]
    expert = load.index(max(load))                  # the busiest expert of the shown layer
    page.click(f"[data-testid=router-expert][data-expert='{expert}']")
    page.wait_for_selector("[data-testid=router-ablation][data-state=done]", timeout=SLOW)
    box = page.locator("[data-testid=router-ablation]")
    assert (int(box.get_attribute("data-layer")), int(box.get_attribute("data-expert"))) == (layer, expert)
    summary = page.inner_text("[data-testid=router-ablation-summary]")
    assert f"Expert {expert} of layer {layer} left out" in summary and "not renormalised" in summary
    assert f"{load[expert]} of the {len(moe.ids())} tokens had chosen it" in summary
    ids = moe.ids()
    ref.hooks = hooks([Intervention("expert", layer, "zero", experts=(expert,))], 64)
    want = ref.greedy(ids, MAX_NEW)
    got = [int(i) for i in page.get_attribute("[data-testid=router-greedy-after]", "data-ids").split(",")]
    # the page's eight greedy tokens stop early at an end-of-generation token; the reference's first MAX_NEW compared
    assert got[:MAX_NEW] == want[:len(got[:MAX_NEW])], (got, want)
    ref.hooks = {}
    plain = ref.greedy(ids, MAX_NEW)
    before = [int(i) for i in page.get_attribute("[data-testid=router-greedy-before]", "data-ids").split(",")]
    assert before[:MAX_NEW] == plain[:len(before[:MAX_NEW])]
    ref.hooks = hooks([Intervention("expert", layer, "zero", experts=(expert,))], 64)
    top = np.argsort(-ref.forward(ids)[-1], kind="stable")[:5].tolist()
    rows = moe.cells("router-top5-row", ["after"])
    assert [int(r["after"]) for r in rows] == top
    print(f"\nexpert {expert} of layer {layer} ablated in the page: greedy {before} -> {got}; "
          f"KL {float(box.get_attribute('data-kl')):.3g} bits")
    ABLATED.append(expert)


def test_export_and_the_card_at_both_widths(moe):
    page = moe.page
    name, raw = download(moe, "router", "json")
    data = json.loads(raw)
    assert name == "llm-lab-router.json" and data["card"] == "router" and data["n_expert"] == 8 and data["k"] == 2
    assert [L["layer"] for L in data["layers"]] == [0, 1, 2, 3] and data["tokens"] and "whole distribution" in \
        data["entropy"]
    if ABLATED:
        ablation = data["ablation"]
        assert ablation["expert"] == ABLATED[0] and ablation["greedy_after"] and ablation["pieces"]
    else:
        assert data["ablation"] is None
    name, png = download(moe, "router", "png")
    assert name == "llm-lab-router.png"
    w, h = check_png(png)
    assert w > 400 and h > 300
    for view, shot_name in ((WIDE, "router"), (NARROW, "router-narrow")):     # the docs take the wide one
        page.set_viewport_size(view)
        show(moe)
        assert page.evaluate("document.documentElement.scrollWidth") <= view["width"], view
        # nothing reaches past the card's right edge but inside the heatmap's own scrolled box
        over = page.evaluate("""() => { const c = document.getElementById('router'), r = c.getBoundingClientRect();
            return [...c.querySelectorAll('*')].filter(e => e.getBoundingClientRect().right > r.right + 1
                && !e.closest('.router-map')).map(e => e.className || e.tagName); }""")
        assert over == [], over
        shot(moe, shot_name, card="router", doc=view is WIDE)
    page.set_viewport_size(WIDE)


def test_forget_empties_the_card_and_proves_the_wipe(moe):
    page = moe.page
    page.click("[data-testid=forget]")
    page.wait_for_selector("[data-testid=forget-status][data-state=wiped]", timeout=SLOW)
    wiped = page.locator("[data-testid=router-wiped]")
    assert wiped.get_attribute("data-state") == "wiped", wiped.inner_text()
    assert int(wiped.get_attribute("data-before")) > 0 and wiped.get_attribute("data-after") == "0"
    text = wiped.inner_text()
    labels = ("router logits", "chosen experts", "expert weights") + (("intervene.",) if ABLATED else ())
    assert all(label in text for label in labels), text
    assert page.locator("[data-testid=router-heatmap]").count() == 0
    assert page.locator("[data-testid=router-ablation-summary]").count() == 0
    assert "chat first" in page.inner_text("[data-testid=router-status]")
    show(moe)
    shot(moe, "router-forgotten", card="router", doc=False)
    assert not moe.errors() and not moe.foreign_requests()
