"""The RoPE demo card (web/rope.js) in headless Chromium (SwiftShader WebGPU) on the small synthetic Mistral-style file
(lab.host.synthetic.arch "mistral", F32: llama's layout and adjacent pairing, 4 query heads over 1 KV head of 64, no
rope_freqs; the card's arithmetic does not depend on the model, and SmolLM2's own heads are held natively by
tests/engine/test_rope_probe.py).

1. The relative-position identity the card shows holds: q·k at (m + s, n + s) equals q·k at (m, n) for every shift,
   a different m − n changes it, for both pairings; and the card's numbers are the rotation numpy computes from the
   card's own q and k (read from data-* attributes), so a rotation that is consistently wrong is caught too.
2. A real head: after a chat, the card fetches layer 0's q and k before RoPE; the row it computes with the model's
   pairing (adjacent for a llama GGUF) is shown to match the engine's attention row (the check mark), and
   switching the pairing changes the row by far more than that tolerance.
3. The card's JSON export holds the rows shown, its PNG is an image; Forget empties the real-head rows.
Screenshots of the card (rope.png, rope-wrong-pairing.png) go to $LAB_SHOTS (default /tmp/llm-lab-shots).

Tolerances: the identity in float64, |Δ| <= 1e-9 |q||k| (the card's own bound); numpy and the page compute the same
float64 expression in a different order, within 1e-12 relative. The real-head check's tolerance is the card's
(rope.js MATCH_TOL, 1e-4; measured here 3.4e-8, 2.3e-7 on SmolLM2); the wrong pairing must move the picked row by
more than WRONG_MIN = 0.01 (measured 0.070 for layer 0 head 3 of this file at the last position of this chat; 0.36 on
SmolLM2).

A shifted adjacent pairing (2i+1, 2i+2) in rope.js, still a rotation (so the identity itself still holds), fails
the numpy comparison of part 1 and the check mark of part 2 (max |dp| 0.16): tried once on purpose.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.browser.conftest import Lab, take

SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
SLOW = 600_000                 # ms: a chat's prefill and a probe pass take a minute or more on SwiftShader
HEAD = 3
GROUP = 4                      # query heads a KV head serves in the file (4 over 1)
WRONG_MIN = 0.01
VIEW = {"width": 1600, "height": 1000}


@pytest.fixture(scope="module")
def lab_rope(card_page):
    from lab.host.synthetic import arch as synthetic_arch
    from lab.host.models import cache_dir
    return take(card_page, synthetic_arch.build("mistral", "f32", cache_dir() / "synthetic"), viewport=VIEW)


def set_value(lab: Lab, testid: str, value) -> None:
    sel = f'[data-testid="{testid}"]'
    lab.page.fill(sel, str(value))
    lab.page.press(sel, "Tab")              # the card listens to "change"


def rotate(x: np.ndarray, pos: int, base: float, neox: bool) -> np.ndarray:
    d = len(x)
    half = d // 2
    theta = pos * base ** (-2.0 * np.arange(half) / d)
    a, b = (np.arange(half), np.arange(half) + half) if neox else (2 * np.arange(half), 2 * np.arange(half) + 1)
    out = x.copy()
    out[a] = x[a] * np.cos(theta) - x[b] * np.sin(theta)
    out[b] = x[a] * np.sin(theta) + x[b] * np.cos(theta)
    return out


def identity_rows(lab: Lab) -> tuple[dict, list[dict], list[dict]]:
    card = lab.page.evaluate("(() => ({...document.querySelector('[data-testid=rope-identity]').dataset}))()")
    keys = ["m", "n", "delta", "dot"]
    return card, lab.cells("rope-shift-row", keys), lab.cells("rope-contrast-row", keys)


@pytest.mark.parametrize("pairing", ["adjacent", "neox"])
def test_relative_position_identity(lab_rope, pairing):
    lab = lab_rope
    lab.page.select_option('[data-testid="rope-pairing"]', pairing)
    set_value(lab, "rope-m", 12)
    set_value(lab, "rope-n", 5)
    set_value(lab, "rope-d", 64)
    set_value(lab, "rope-base", 10000)
    card, shifts, contrast = identity_rows(lab)
    assert (card["pairing"], card["d"], card["base"]) == (pairing, "64", "10000")
    q = np.array([float(v) for v in card["q"].split(",")])
    k = np.array([float(v) for v in card["k"].split(",")])
    assert len(q) == len(k) == 64
    norm = np.linalg.norm(q) * np.linalg.norm(k)
    dots = [float(r["dot"]) for r in shifts]
    assert {int(r["delta"]) for r in shifts} == {7} and len(shifts) >= 5
    assert max(int(r["m"]) for r in shifts) >= 10_000
    assert max(abs(x - dots[0]) for x in dots) <= 1e-9 * norm                  # only m - n matters
    for r in contrast:                                                          # ... and it does matter
        assert int(r["delta"]) != 7 and abs(float(r["dot"]) - dots[0]) > 1e-3 * norm
    for r in shifts + contrast:                                                 # the card's numbers are RoPE's
        want = rotate(q, int(r["m"]), 10000, pairing == "neox") @ rotate(k, int(r["n"]), 10000, pairing == "neox")
        assert abs(float(r["dot"]) - want) <= 1e-12 * norm, r
    check = lab.cells("rope-identity-check", ["ok"])[0]
    assert check["ok"] == "true"


def test_real_head_matches_the_engine_and_the_wrong_pairing_does_not(lab_rope):
    lab, page = lab_rope, lab_rope.page
    page.fill('[data-testid="max-tokens"]', "2")
    page.fill('[data-testid="prompt"]', "The capital of France is")
    page.click('[data-testid="send"]')
    page.locator("#rope").scroll_into_view_if_needed()      # the probe panels leave the screen: they compute nothing
    page.wait_for_function("document.querySelector('[data-testid=timings]').textContent.length > 0", timeout=SLOW)
    n = len(lab.ids())
    page.select_option('[data-testid="rope-layer"]', "0")
    page.select_option('[data-testid="rope-head"]', str(HEAD))
    page.select_option('[data-testid="rope-pairing"]', "adjacent")       # the file's own
    page.click('[data-testid="rope-fetch"]')
    page.wait_for_selector('[data-testid="rope-engine-check"]', timeout=SLOW)
    what = lab.cells("rope-real-what", ["layer", "pos", "head", "kvhead", "stale"])[0]
    assert what == {"layer": "0", "pos": str(n - 1), "head": str(HEAD), "kvhead": str(HEAD // GROUP), "stale": "false"}
    check = lab.cells("rope-engine-check", ["ok", "maxdiff", "wrongdiff", "tol", "pairing"])[0]
    print(f"RoPE demo, layer 0 head {HEAD}, query {n - 1}: right pairing max |dp| "
          f"{float(check['maxdiff']):.2e}, wrong pairing {float(check['wrongdiff']):.3f}")
    assert check["pairing"] == "adjacent" and check["ok"] == "true"
    assert float(check["maxdiff"]) <= float(check["tol"])
    assert page.inner_text('[data-testid="rope-engine-check"]').startswith("✓")

    def row(name: str) -> np.ndarray:
        cells = [c for c in lab.cells("rope-real-cell", ["row", "key", "p", "selected"]) if c["row"] == name]
        assert [int(c["key"]) for c in cells] == list(range(n))
        return np.array([float(c["p"]) for c in cells])

    def picked() -> tuple[str, np.ndarray]:
        name = {c["row"] for c in lab.cells("rope-real-cell", ["row", "selected"]) if c["selected"] == "true"}
        assert len(name) == 1
        name = name.pop()
        return name, row(name)

    engine = row("engine")
    assert abs(engine.sum() - 1) < 1e-5
    name, right = picked()
    assert name == "adjacent" and np.abs(right - engine).max() <= float(check["tol"])
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#rope").screenshot(path=str(SHOTS / "rope.png"))
    page.select_option('[data-testid="rope-pairing"]', "neox")
    name, wrong = picked()
    assert name == "neox"
    assert np.abs(wrong - engine).max() > WRONG_MIN                # switching the pairing changes the row
    assert np.array_equal(row("engine"), engine)                    # the engine's row stays what it was
    assert lab.cells("rope-engine-check", ["ok"])[0]["ok"] == "true"    # the check is about the model's pairing
    page.locator("#rope").screenshot(path=str(SHOTS / "rope-wrong-pairing.png"))
    # export (web/export.js): the JSON holds the numbers shown, the PNG is a picture
    name, raw = download(lab, "json")
    data = json.loads(raw)
    assert name == "llm-lab-rope.json" and data["real_head"]["matches"] is True
    assert data["real_head"]["model_pairing"] == "adjacent" and data["settings"]["pairing"] == "neox"
    np.testing.assert_allclose(data["real_head"]["engine"], engine, rtol=1e-6)
    np.testing.assert_allclose(data["real_head"]["neox"], wrong, rtol=1e-6)
    name, raw = download(lab, "png")
    assert name == "llm-lab-rope.png" and raw[:8] == b"\x89PNG\r\n\x1a\n"


def download(lab: Lab, kind: str) -> tuple[str, bytes]:
    with lab.page.expect_download() as d:
        lab.page.click(f"#rope [data-testid=export-{kind}]")
    return d.value.suggested_filename, Path(d.value.path()).read_bytes()


def test_forget_drops_the_heads_numbers(lab_rope):
    page = lab_rope.page
    assert lab_rope.cells("rope-real-cell", ["p"])
    page.click('[data-testid="forget"]')
    page.wait_for_selector('[data-testid="forget-status"][data-state="wiped"]', timeout=120_000)
    assert lab_rope.cells("rope-real-cell", ["p"]) == []
    assert not lab_rope.errors()
    assert not lab_rope.foreign_requests()
