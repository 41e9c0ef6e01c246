"""The Experiments card in headless Chromium (SwiftShader WebGPU) on the small synthetic Llama 3 file
(lab.host.synthetic.arch "llama3", F32: 4 layers, 4 query heads, SmolLM2's vocabulary), against the same experiments
run natively (lab.host.experiments.Lab on this machine's wgpu adapter) on the same file.

- The chat goes on as if nothing ran: the KV rows of the conversation read back bit-identical after an attribution and
  an ablation, and the next turn (its reply and its reuse of the cache) is the one the same conversation gives
  without them. A token clicked in the context becomes the target (#ID).
- Attribution: a bar per layer for attention and MLP, the embedding and the remainder; the bars and the remainder sum
  to the logit, the remainder is small, every share is the native one; a layer's heads, expanded, sum to its bar.
- Bad inputs (a target of two tokens, a layer the model lacks, a range backwards) are refused before any run, each
  with what to change.
- Ablation: the layer x head heatmap (4 x 4) of the native deltas and the native base log-probability; a cell clicked
  picks its layer and head, and that one head run alone gives the same delta and the top 5 before and after.
  JSON and PNG export.
- Patching: prompts of different token counts are refused before running, both counts said; the layer x position
  heatmap (4 x 5, the clean prompt's pieces as column labels) holds the native recovery, and the card's own check
  (the last layer's residual patched everywhere gives the clean run) reads exact.
- A sweep estimated over ASK_S waits, says how long and why, and "Limit" runs only the layers that fit.
- Steering: the steered and unsteered replies stream side by side; the unsteered one is the chat's own reply to the
  same prompt with the same settings, the steered one differs.
- Forget lists the experiments' buffers as wiped (non-zero before, zero after) and empties the card.

One page serves the module (the tests run in file order): the cards' page (tests/browser/conftest.py `card_page`).
A screenshot of the card (patching) goes to $LAB_SHOTS, and
to docs/screenshots/experiments.png with LAB_DOC_SHOTS=1 (tests/browser/test_layout.py `shot`)."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from lab.host.synthetic import arch as synthetic_arch
from lab.host.experiments import Lab
from lab.host.models import cache_dir
from lab.worker.experiments import ASK_S
from tests.browser.conftest import take
from tests.browser.test_layout import SHOTS, check_png, download, shot

SLOW = 600_000           # ms: a load or a sweep on SwiftShader with the machine's two cores shared
N_LAYER, N_HEAD = 4, 4    # synthetic_arch's "llama3"
PROMPT = "The capital of France is"
CLEAN, CORRUPT = PROMPT, "The capital of Italy is"
TARGET = " Paris"
# SwiftShader against this machine's native adapter, both F32 on an F32 file: summation order apart. Shares and logits
# are compared relative to the target's logit (as tests/engine/test_attribute.py does), log-probabilities absolutely.
TOL = 2e-3
MAX_NEW = 4


@pytest.fixture(scope="module")
def path():
    return synthetic_arch.build("llama3", "f32", cache_dir() / "synthetic")


def _native(path) -> dict:
    lab = Lab.load(path, 256)
    try:
        target = lab.token(TARGET)
        return {"attribute": lab.attribute(lab.encode(PROMPT), target), "ablate": lab.ablate(lab.encode(PROMPT), target),
                "patch": lab.patch(lab.encode(CLEAN), lab.encode(CORRUPT), target)}
    finally:
        lab.close()


@pytest.fixture(scope="module")
def native(path):
    """The three sweeps natively, in a thread of their own: Lab runs each through asyncio.run, which refuses to start
    inside the event loop Playwright's sync API runs in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_native, path).result()


@pytest.fixture(scope="module")
def lab_exp(card_page, path):
    lab = take(card_page, path)
    lab.page.check('[data-testid="greedy"]')
    lab.page.fill('[data-testid="max-tokens"]', str(MAX_NEW))
    return lab


def _tab(lab, kind: str) -> None:
    lab.page.click(f'[data-testid="exp-tab-{kind}"]')
    lab.page.evaluate("document.querySelector('#experiments').scrollIntoView({block: 'start'})")


def _run(lab, kind: str, wait_for: str = "done") -> None:
    """Press Run on the tab `kind` and wait until the card's status is `wait_for`; an error fails with its words."""
    page = lab.page
    _tab(lab, kind)
    page.click('[data-testid="exp-run"]')
    page.wait_for_function("want => ['error', want].includes(document.querySelector('[data-testid=exp-status]')"
                           ".dataset.state)", arg=wait_for, timeout=SLOW)
    status = page.locator('[data-testid="exp-status"]')
    assert status.get_attribute("data-state") == wait_for, status.inner_text()


def _kv(lab) -> bytes:
    n = len(lab.ids())
    return base64.b64decode(lab.page.evaluate("ps => window.labKvRows(ps).then((m) => m.rows)", list(range(n))))


def _look(lab, name: str) -> None:
    """The card as it is now, to $LAB_SHOTS only (the docs take the patching one, `shot`); nothing in it sticks out
    sideways."""
    assert lab.page.evaluate("(e => e.scrollWidth <= e.clientWidth)(document.querySelector('#experiments'))"), name
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.locator("#experiments").screenshot(path=str(SHOTS / f"experiments-{name}.png"))


def _near(got: float, want: float, scale: float = 1.0) -> bool:
    return abs(got - want) <= TOL * max(1.0, abs(scale))


def test_the_chat_goes_on_as_if_nothing_ran(lab_exp):
    lab, page = lab_exp, lab_exp.page
    # the conversation without experiments, first, while the cache has only ever held chat turns
    lab.send("Hello there")
    plain = lab.send("And then?")
    plain_reuse = page.inner_text('[data-testid="reuse"]')
    # the same conversation with two experiments between its turns, each overwriting the engine's cache from
    # position 0 while it runs (New chat wiped the cache: its first turn prefills from empty, as the first chat did)
    page.click('[data-testid="new-chat"]')
    lab.send("Hello there")
    rows = _kv(lab)
    assert rows.strip(b"\x00"), "the conversation's KV rows are empty"
    # a token clicked in the context becomes every target
    ids = lab.ids()
    page.click('[data-testid="token"][data-index="2"]')
    assert page.input_value('[data-testid="exp-ab-target"]') == f"#{ids[2]}"
    assert page.input_value('[data-testid="exp-at-target"]') == f"#{ids[2]}"
    for kind, t in (("ablate", "exp-ab-target"), ("patch", "exp-pa-target"), ("attribute", "exp-at-target")):
        _tab(lab, kind)
        page.fill(f'[data-testid="{t}"]', TARGET)
    _run(lab, "attribute")
    _tab(lab, "ablate")
    page.fill('[data-testid="exp-ab-layers"]', "1")
    page.fill('[data-testid="exp-ab-heads"]', "2")
    _run(lab, "ablate")
    assert _kv(lab) == rows, "the chat's KV rows changed under an experiment"
    assert lab.send("And then?") == plain
    assert page.inner_text('[data-testid="reuse"]') == plain_reuse
    print(f"\nthe second turn, with and without experiments before it: {plain!r} ({plain_reuse})")
    assert not lab.errors() and not lab.foreign_requests()


def test_attribution_sums_to_the_logit_and_is_the_native_one(lab_exp, native):
    lab, page = lab_exp, lab_exp.page
    _tab(lab, "attribute")
    page.fill('[data-testid="exp-at-prompt"]', PROMPT)
    page.fill('[data-testid="exp-at-target"]', TARGET)
    _run(lab, "attribute")
    want = native["attribute"]
    s = page.locator('[data-testid="exp-attr-sum"]')
    logit, total = float(s.get_attribute("data-logit")), float(s.get_attribute("data-total"))
    assert _near(logit, want["logit"], want["logit"]), (logit, want["logit"])
    assert abs(total - logit) <= 1e-6 * max(1.0, abs(logit))
    rows = lab.cells("exp-attr-row", ["layer", "attn", "mlp"])
    assert [r["layer"] for r in rows] == ["-1", *map(str, range(N_LAYER)), "remainder"]
    for r, w in zip(rows[1:-1], want["rows"]):
        assert _near(float(r["attn"]), w["attn"], logit) and _near(float(r["mlp"]), w["mlp"], logit), (r, w)
    assert f"{logit:.3f}" in s.inner_text()
    # a layer's heads, expanded, add up to its attention bar
    page.click('[data-testid="exp-attr-row"][data-layer="1"]')
    heads = lab.cells("exp-attr-head", ["layer", "head", "value"])
    assert [int(h["head"]) for h in heads] == list(range(N_HEAD)) and {h["layer"] for h in heads} == {"1"}
    attn = float(rows[2]["attn"])
    assert abs(sum(float(h["value"]) for h in heads) - attn) <= 1e-3 * max(1.0, abs(logit)), (heads, attn)
    _look(lab, "attribution")
    print(f"\nattribution: logit {logit:.4f} (native {want['logit']:.4f}), layer 1 attention {attn:+.4f}")


def test_ablation_heatmap_then_one_head_alone(lab_exp, native):
    lab, page = lab_exp, lab_exp.page
    _tab(lab, "ablate")
    page.fill('[data-testid="exp-ab-prompt"]', PROMPT)
    page.fill('[data-testid="exp-ab-target"]', TARGET)
    page.select_option('[data-testid="exp-ab-what"]', "heads")
    page.fill('[data-testid="exp-ab-layers"]', "")
    page.fill('[data-testid="exp-ab-heads"]', "")
    page.select_option('[data-testid="exp-ab-mode"]', "zero")
    # bad inputs: refused before any run, each with what to change
    for testid, bad, said in (("exp-ab-target", "Paris is", "is 2 tokens"), ("exp-ab-layers", "2, 9", "layers 0 .. 3"),
                              ("exp-ab-heads", "3-1", "from the lower number to the higher")):
        good = page.input_value(f'[data-testid="{testid}"]')
        page.fill(f'[data-testid="{testid}"]', bad)
        _run(lab, "ablate", "error")
        assert said in page.inner_text('[data-testid="exp-status"]'), page.inner_text('[data-testid="exp-status"]')
        page.fill(f'[data-testid="{testid}"]', good)
    _run(lab, "ablate")
    grid = page.locator('#exp-result [data-testid="exp-heatmap"]')
    assert (grid.get_attribute("data-rows"), grid.get_attribute("data-cols")) == (str(N_LAYER), str(N_HEAD))
    want = native["ablate"]
    base = float(page.get_attribute('#exp-result .exp-summary', "data-base"))
    assert abs(base - want["base_logprob"]) <= TOL * max(1.0, abs(base)), (base, want["base_logprob"])
    cells = {(int(c["layer"]), int(c["head"])): float(c["value"]) for c in lab.cells("exp-cell", ["layer", "head", "value"])}
    assert len(cells) == N_LAYER * N_HEAD
    _look(lab, "ablation")
    for r in want["rows"]:
        assert abs(cells[r["layer"], r["head"]] - r["delta"]) <= TOL * max(1.0, abs(base)), r
    # JSON and PNG of what the card shows
    name, raw = download(lab, "experiments", "json")
    data = json.loads(raw)
    assert name == "llm-lab-experiments.json" and data["experiment"] == "ablate" and len(data["result"]["rows"]) == 16
    name, raw = download(lab, "experiments", "png")
    assert name == "llm-lab-experiments.png"
    check_png(raw)
    # the cell picked: its layer and head fill the inputs; alone, the same delta and the top 5 before and after
    page.click('#exp-result [data-testid="exp-cell"][data-layer="2"][data-head="1"]')
    assert page.input_value('[data-testid="exp-ab-layers"]') == "2"
    assert page.input_value('[data-testid="exp-ab-heads"]') == "1"
    _run(lab, "ablate")
    (one,) = lab.cells("exp-cell", ["layer", "head", "value"])
    assert (one["layer"], one["head"]) == ("2", "1") and abs(float(one["value"]) - cells[2, 1]) <= 1e-5
    table = page.locator('[data-testid="exp-top5"] tr')
    assert table.count() == 6
    _look(lab, "ablation-one")
    print(f"\nablation: base log p {base:.4f} (native {want['base_logprob']:.4f}); layer 2 head 1 {cells[2, 1]:+.4f}")
    assert not lab.errors()


def test_patching_refuses_unequal_lengths_then_draws_the_native_recovery(lab_exp, native):
    lab, page = lab_exp, lab_exp.page
    _tab(lab, "patch")
    page.fill('[data-testid="exp-pa-clean"]', CLEAN)
    page.fill('[data-testid="exp-pa-corrupt"]', CORRUPT + " not")
    page.wait_for_selector('[data-testid="exp-pa-lengths"]:not([hidden])', timeout=SLOW)
    said = page.inner_text('[data-testid="exp-pa-lengths"]')
    assert "5 tokens" in said and "6" in said and "must match" in said, said
    assert page.locator('[data-testid="exp-run"]').is_disabled()
    page.fill('[data-testid="exp-pa-corrupt"]', CORRUPT)
    page.wait_for_selector('[data-testid="exp-pa-lengths"][hidden]', state="attached", timeout=SLOW)
    page.fill('[data-testid="exp-pa-target"]', TARGET)
    page.fill('[data-testid="exp-pa-foil"]', "")
    page.fill('[data-testid="exp-pa-layers"]', "")
    _run(lab, "patch")
    grid = page.locator('#exp-result [data-testid="exp-heatmap"]')
    assert (grid.get_attribute("data-rows"), grid.get_attribute("data-cols")) == (str(N_LAYER), "5")
    labels = page.locator('#exp-result .klabel').all_inner_texts()
    assert labels == ["The", "·capital", "·of", "·France", "·is"], labels
    assert page.get_attribute('[data-testid="exp-sanity"]', "data-exact") == "true"
    want = native["patch"]
    for c in lab.cells("exp-cell", ["layer", "pos", "value"]):
        w = want["recovery"][int(c["layer"])][int(c["pos"])]
        assert abs(float(c["value"]) - w) <= 1e-2, (c, w)        # a ratio of differences: looser than a logit
    _look(lab, "patching")
    shot(lab, "experiments", card="experiments")
    assert not lab.errors()


def test_a_long_sweep_asks_first_and_limit_runs_what_fits(lab_exp):
    lab, page = lab_exp, lab_exp.page
    # the longest prompt pair one step takes on SwiftShader (64 tokens): 4 layers x 60 positions, over ASK_S there
    filler = " ".join(["and"] * 55)
    _tab(lab, "patch")
    page.fill('[data-testid="exp-pa-clean"]', f"{filler} {CLEAN}")
    page.fill('[data-testid="exp-pa-corrupt"]', f"{filler} {CORRUPT}")
    page.fill('[data-testid="exp-pa-layers"]', "")
    page.wait_for_selector('[data-testid="exp-pa-lengths"][hidden]', state="attached", timeout=SLOW)
    _tab(lab, "patch")
    page.click('[data-testid="exp-run"]')
    page.wait_for_function("['ask', 'done', 'error'].includes(document.querySelector('[data-testid=exp-status]')"
                           ".dataset.state)", timeout=SLOW)
    plan = page.locator('[data-testid="exp-plan"]')
    estimate = float(plan.get_attribute("data-estimate"))
    if estimate <= ASK_S:
        assert page.get_attribute('[data-testid="exp-status"]', "data-state") == "done"
        pytest.skip(f"this adapter runs the sweep in {estimate:.1f} s, under ASK_S")
    assert page.get_attribute('[data-testid="exp-status"]', "data-state") == "ask", plan.inner_text()
    text = plan.inner_text()
    assert f"longer than {ASK_S:.0f} s" in text and plan.get_attribute("data-runs") in text, text
    assert page.locator('[data-testid="exp-cell"]').count() == N_LAYER * 5, "the earlier heatmap stays until a run"
    limit = page.locator('[data-testid="exp-limit"]')
    if "even one layer is longer" in text:
        # a slow CPU adapter (SwiftShader on a loaded 2-core machine: 524 ms a run, a layer's 60 runs 31 s): the page
        # offers no limit, and says why
        assert not limit.is_visible() and estimate / N_LAYER > ASK_S * 0.9, (estimate, text)
        pytest.skip(f"one layer alone takes about {estimate / N_LAYER:.0f} s here, over ASK_S: no limit to offer")
    assert limit.is_visible(), text
    page.click('[data-testid="exp-limit"]')
    page.wait_for_function("['done', 'error'].includes(document.querySelector('[data-testid=exp-status]').dataset.state)",
                           timeout=SLOW)
    assert page.get_attribute('[data-testid="exp-status"]', "data-state") == "done"
    layers = page.input_value('[data-testid="exp-pa-layers"]')
    rows = {c["layer"] for c in lab.cells("exp-cell", ["layer"])}
    first, _, last = layers.partition("-")
    assert rows == {str(i) for i in range(int(first), int(last or first) + 1)} and str(N_LAYER - 1) in rows, layers
    done = float(page.get_attribute('[data-testid="exp-plan"]', "data-estimate"))
    assert done <= ASK_S * 1.5, done      # the estimate of the limited sweep, from a fresh timing
    print(f"\nthe sweep: about {estimate:.0f} s asked first; limited to layers {layers}")


def test_forget_wipes_the_experiments_buffers(lab_exp):
    lab, page = lab_exp, lab_exp.page
    _tab(lab, "patch")                   # the patching tests' results (before steering's New chat drops them)
    assert page.locator('#exp-result [data-testid="exp-cell"]').count() > 0
    page.click('[data-testid="forget"]')
    page.wait_for_selector('[data-testid="forget-status"][data-state="wiped"]', timeout=SLOW)
    wiped = page.locator('[data-testid="exp-wiped"]')
    assert wiped.get_attribute("data-state") == "wiped", wiped.inner_text()
    assert int(wiped.get_attribute("data-before")) > 0 and wiped.get_attribute("data-after") == "0"
    assert "experiment.results" in wiped.inner_text()
    assert page.locator('#exp-result [data-testid="exp-cell"]').count() == 0
    assert page.input_value('[data-testid="exp-pa-clean"]') == CLEAN     # the example back, what was typed gone
    assert not lab.errors() and not lab.foreign_requests()


def test_steering_streams_both_replies_and_the_plain_one_is_the_chats(lab_exp):
    lab, page = lab_exp, lab_exp.page
    _tab(lab, "steer")
    page.fill('[data-testid="exp-st-prompt"]', "Tell me about your weekend.")
    page.fill('[data-testid="exp-st-layer"]', "2")
    page.fill('[data-testid="exp-st-scale"]', "8")
    page.fill('[data-testid="exp-st-n"]', str(MAX_NEW))
    page.check('[data-testid="exp-st-chat"]')
    _run(lab, "steer")
    assert page.get_attribute('[data-testid="exp-replies"]', "data-state") == "done"
    steered = page.inner_text('[data-testid="exp-steered-text"]')
    plain = page.inner_text('[data-testid="exp-plain-text"]')
    assert steered and plain and steered != plain, (steered, plain)
    _look(lab, "steering")
    page.click('[data-testid="new-chat"]')
    assert lab.send("Tell me about your weekend.") == plain
    print(f"\nsteered {steered!r}, unsteered {plain!r}")


# with --slow (36 s): by default the card's patching is held to the native one in the page (the test above)
@pytest.mark.slow
def test_the_cli_runs_the_cards_patching_in_the_page(path, native):
    """`lab patch --backend browser` (the H200 sweep's command) posts the card's message to a page of its own, twice,
    and prints the native command's JSON with the sweep's timings: the same recovery as natively. (A process of its
    own: Playwright's sync API will not start where this session's browser fixture already runs.)"""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "lab.host.cli", "patch", str(path), "--clean", CLEAN, "--corrupt",
                           CORRUPT, "--target", TARGET, "--backend", "browser"], capture_output=True, text=True,
                          timeout=SLOW / 1000)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    want = native["patch"]
    assert out["backend"] == "browser" and len(out["timings"]) == 2 and out["sanity"]["exact"]
    assert out["foil_id"] == want["foil_id"] and out["runs"] == len(want["layers"]) * len(out["positions"])
    for row, ref in zip(out["recovery"], want["recovery"]):
        assert all(abs(a - b) <= 0.01 for a, b in zip(row, ref)), (row, ref)
