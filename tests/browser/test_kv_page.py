"""The KV panel in a real browser (headless Chromium, SwiftShader WebGPU) on the small synthetic Llama 3 file
(tests/conftest.py `tiny`: 4 layers, 2 KV heads of 64; the panel's code does not depend on the model): the heatmap of |K|
and |V| per layer and position grows with the reply and equals the cache as read back; Forget redraws it from its own
read-back and it goes blank; with one K buffer left out of the wipe (the page's test hook `labForgetSkipping`), the
same check fails, the cells of that buffer stay lit, and the page says NOT wiped and names it.

The oracle is independent of the panel's kernel (wgsl/kvview.wgsl): `labKvRows` reads the raw K and V rows straight
from the caches, and numpy takes their norms. Tolerance: the same f32 rows summed in f32 by the kernel and in f64 by
numpy, ~128 terms: measured 4e-7 relative natively (tests/engine/test_kv_view.py); RTOL = 1e-5.

Screenshots of the panel before and after Forget go to $LAB_SHOTS (default /tmp/llm-lab-shots)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.browser.conftest import take
from tests.browser.test_layout import check_png, download

SLOW = 600_000                   # ms: a load or a reply on SwiftShader
RTOL = 1e-5
N_LAYER = 4                      # synthetic_arch "llama3"
KV_BYTES = 4 * 2 * 2 * 64 * 4   # per token: layers x (K, V) x KV heads x head size x 4 bytes
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
SKIPPED = "k cache 3 [n_ctx, kv]"    # lab/engine/engine.py Scratch.alloc's label of layer 3's K cache


def _shot(lab, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.locator("#kv").screenshot(path=str(SHOTS / f"kv-{name}.png"))


def _cells(lab) -> dict[tuple[int, int], tuple[float, float]]:
    """{(layer, position): (|K|, |V|)} as the heatmap's cells carry them."""
    return {(int(c["layer"]), int(c["pos"])): (float(c["k"]), float(c["v"]))
            for c in lab.cells("kv-cell", ["layer", "pos", "k", "v"])}


def _numpy_norms(lab, positions: list[int]) -> np.ndarray:
    """[len(positions), n_layer, 2] norms of the raw rows the worker read from the caches, in f64."""
    r = lab.page.evaluate("ps => window.labKvRows(ps)", positions)
    rows = np.frombuffer(base64.b64decode(r["rows"]), np.float32).reshape(len(positions), r["n_layer"], 2, r["kvd"])
    return np.sqrt((rows.astype(np.float64) ** 2).sum(axis=-1))


def _forget(lab, skip: str | None = None) -> str:
    page = lab.page
    if skip:
        page.evaluate("label => window.labForgetSkipping(label)", skip)
    else:
        page.click('[data-testid="forget"]')
    page.wait_for_function("['wiped', 'nothing', 'failed'].includes(document.querySelector('[data-testid=forget-status]')"
                           ".dataset.state) && document.querySelector('[data-testid=kv-forget]')", timeout=SLOW)
    return page.get_attribute('[data-testid="forget-status"]', "data-state")


def _assert_blank(lab, used: int) -> None:
    """The check Forget must pass: a cell per layer and forgotten position, every one zero, and the page says wiped."""
    cells = _cells(lab)
    assert {p for _, p in cells} == set(range(used)) and len(cells) == N_LAYER * used
    lit = sorted(k for k, kv in cells.items() if kv != (0.0, 0.0))
    assert lit == [], f"{len(lit)} cells still lit, first {lit[:3]}"
    assert lab.page.get_attribute('[data-testid="kv-forget"]', "data-state") == "wiped"
    assert lab.page.get_attribute('[data-testid="forget-status"]', "data-state") == "wiped"


@pytest.fixture(scope="module")
def lab_kv(card_page, tiny_path):
    # a short window: with the KV card scrolled to the top, no other panel is on screen (each would run its probes)
    lab = take(card_page, tiny_path, viewport={"width": 1280, "height": 640})
    lab.page.check('[data-testid="greedy"]')
    lab.page.evaluate("document.querySelector('#kv').scrollIntoView({block: 'start'})")
    lab.page.wait_for_timeout(500)            # the card's IntersectionObserver marks it on screen
    return lab


def test_heatmap_grows_and_equals_the_cache_then_forget_blanks_it(lab_kv):
    lab, page = lab_kv, lab_kv.page
    # every picture drawn while the reply streams: (columns, ms of the read)
    page.evaluate("""() => { window.kvSeen = [];
        new MutationObserver(() => { const g = document.querySelector('[data-testid=kv-heatmap]');
            if (g) window.kvSeen.push([Number(g.dataset.columns), g.dataset.ms]); })
        .observe(document.querySelector('#kv-body'), {childList: true}); }""")
    lab.send("Name three colours.", max_tokens=4)
    used = int(lab.cells("kv-used", ["used"])[0]["used"])
    n_ids = len(lab.ids())
    assert used == n_ids - 1                       # the last token made was never fed back
    seen = page.evaluate("window.kvSeen")
    counts = sorted({c for c, _ in seen if c})
    # prefill's columns came with the first token, then one more per token fed back: it grew as the reply streamed
    assert counts == list(range(used - 3, used + 1)), counts
    ms = sorted(float(m) for c, m in seen if c and m)
    timings = page.inner_text('[data-testid="timings"]')
    print(f"\nKV view reads during the reply: {ms} ms; {timings}")

    cells = _cells(lab)
    assert len(cells) == N_LAYER * used and {p for _, p in cells} == set(range(used))
    positions = [1, 7, used - 2, used - 1]
    want = _numpy_norms(lab, positions)
    assert want.min() > 0
    got = np.array([[cells[(il, p)] for il in range(N_LAYER)] for p in positions])
    np.testing.assert_allclose(got, want, rtol=RTOL)
    # hovering a cell names its layer, position, token and both magnitudes
    title = page.get_attribute(f'[data-testid=kv-cell][data-layer="2"][data-pos="{used - 1}"]', "title")
    k2, v2 = cells[(2, used - 1)]
    head = f"layer 2 · position {used - 1} "
    assert title.startswith(head) and len(title.split("\n")[0]) > len(head)
    assert f"‖k‖ = {k2:.4f}" in title and f"‖v‖ = {v2:.4f}" in title, title
    assert page.inner_text('[data-testid="kv-bytes-per-token"]') == f"{KV_BYTES:,}"
    # the selected token's column is marked
    page.click('[data-testid=token][data-index="7"]')
    page.wait_for_selector('[data-testid=kv-cell].selected[data-pos="7"]')
    assert page.locator('[data-testid=kv-cell].selected').count() == N_LAYER
    page.evaluate("document.querySelector('#kv').scrollIntoView({block: 'start'})")
    _shot(lab, "before-forget")
    # the export holds the numbers the cells show, and its picture is a real PNG
    name, raw = download(lab, "kv", "json")
    d = json.loads(raw)
    assert name == "llm-lab-kv-cache.json" and d["positions"] == list(range(used))
    np.testing.assert_array_equal(np.array(d["k"], np.float32).T, [[cells[(il, p)][0] for il in range(N_LAYER)]
                                                                   for p in range(used)])
    np.testing.assert_array_equal(np.array(d["v"], np.float32).T, [[cells[(il, p)][1] for il in range(N_LAYER)]
                                                                   for p in range(used)])
    check_png(download(lab, "kv", "png")[1])

    assert _forget(lab) == "wiped"
    _assert_blank(lab, used)
    line = page.get_attribute('[data-testid="kv-forget"]', "data-before")
    assert int(line) > 0 and page.get_attribute('[data-testid="kv-forget"]', "data-after") == "0"
    _shot(lab, "after-forget")
    assert lab.errors() == [] and lab.foreign_requests() == []


def test_a_buffer_left_out_of_the_wipe_stays_lit_and_is_named(lab_kv):
    lab, page = lab_kv, lab_kv.page
    lab.send("Hi", max_tokens=3)
    used = int(lab.cells("kv-used", ["used"])[0]["used"])
    want = _numpy_norms(lab, list(range(used)))
    assert _forget(lab, skip=SKIPPED) == "failed"
    with pytest.raises(AssertionError):           # the check that passed above catches the missed buffer
        _assert_blank(lab, used)
    cells = _cells(lab)
    lit = {k for k, kv in cells.items() if kv != (0.0, 0.0)}
    assert {(3, p) for p in range(used)} <= lit and {il for il, _ in lit} == {3}
    for (il, p) in lit:
        k, v = cells[(il, p)]
        assert v == 0.0
        if p < used:
            assert k == pytest.approx(want[p, 3, 0], rel=1e-6)    # redrawn in Python from the read-back bytes
    kv_line = page.inner_text('[data-testid="kv-forget"]')
    assert "NOT wiped" in kv_line and SKIPPED in kv_line, kv_line
    assert page.get_attribute('[data-testid="kv-forget"]', "data-state") == "failed"
    status = page.inner_text('[data-testid="forget-status"]')
    assert "NOT wiped" in status and SKIPPED in status, status
    _shot(lab, "forget-skipped-one-buffer")
    # a real Forget then clears what was left
    assert _forget(lab) == "wiped"
    assert page.get_attribute('[data-testid="kv-forget"]', "data-state") == "wiped"
    assert all(kv == (0.0, 0.0) for kv in _cells(lab).values())
    assert lab.errors() == [] and lab.foreign_requests() == []


def test_the_f16_cache_chats_draws_and_forgets(lab_kv):
    """The f16 box (any adapter: SwiftShader has no shader-f16, and needs none): ticking it loads the file again with a
    cache of f16 values. The greedy reply is the f32 cache's (natively the two agree for 16 tokens,
    tests/engine/test_f16_cache.py), the heatmap equals the rows read back (labKvRows widens them to f32) and Forget
    blanks it."""
    lab, page = lab_kv, lab_kv.page
    assert not page.evaluate("document.querySelector('[data-testid=kv-f16]').disabled")
    prompt = "Name three colours."
    lab.send(prompt, max_tokens=6)
    ids32 = lab.ids()
    assert _forget(lab) == "wiped"
    page.check('[data-testid="kv-f16"]')            # loads the file again
    page.wait_for_function("!document.querySelector('[data-testid=prompt]').disabled && document.querySelector("
                           "'[data-testid=model-info]').textContent.includes('per token (f16)')", timeout=SLOW)
    assert "on:" in page.inner_text('[data-testid="kv-f16-note"]')
    assert "f16" in page.inner_text('[data-testid="context-plan"]')
    lab.send(prompt, max_tokens=6)
    assert lab.ids() == ids32
    used = int(lab.cells("kv-used", ["used"])[0]["used"])
    assert page.inner_text('[data-testid="kv-bytes-per-token"]') == f"{KV_BYTES // 2:,}"      # half of f32's
    r = page.evaluate("ps => window.labKvRows(ps)", [0])
    assert r["kv_type"] == "f16"
    cells = _cells(lab)
    positions = [1, used - 2, used - 1]
    want = _numpy_norms(lab, positions)
    got = np.array([[cells[(il, p)] for il in range(N_LAYER)] for p in positions])
    np.testing.assert_allclose(got, want, rtol=RTOL)
    page.evaluate("document.querySelector('#kv').scrollIntoView({block: 'start'})")
    _shot(lab, "f16-before-forget")
    assert _forget(lab) == "wiped"
    _assert_blank(lab, used)
    assert lab.errors() == [] and lab.foreign_requests() == []
