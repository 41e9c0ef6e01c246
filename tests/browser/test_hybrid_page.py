"""Hybrids in the page (headless Chromium, SwiftShader WebGPU).

The synthetic LFM2 file (lab.host.synthetic.arch "lfm2",
F32: layers conv, conv, attention, conv, conv, attention; l_cache 3) loaded through the file input, a two-turn chat
whose second turn continues from the states the first left (and the chat says so), and the memory card: the KV
heatmap on the attention layers only, the conv rows the next token reads equal to the rings as read back raw
(`labStateBytes`, not through lab/instruments/memory.py), the bytes of each kind with their arithmetic, and the line of
both over the conversation. The attention panel offers the attention layers only and says why. Forget with one conv
state left out (the page's `labForgetSkipping`) says NOT wiped and keeps that layer's rows lit from its read-back; a
real Forget redraws every state as zero from what the GPU read back, and the raw read agrees.

The synthetic Qwen3.5 file (lab.host.synthetic.arch "qwen35", F32: layers delta, delta, attention, delta, delta,
attention; 2 key heads under 4 value heads of 64; l_cache 4) likewise, with what a delta-net layer adds: a strip per
layer of its state's norm as the tokens arrived, the picked head's 64 x 64 matrix equal to the raw state (its norm,
its largest value and the sign of every pixel), the bytes of both state kinds and of the engine's snapshots, and Forget
with one recurrent state left out (named, its strip and matrix still lit) and for real (every recurrent state, conv
state and snapshot read back raw as zero, and drawn as zero). Last, `lab bench --backend browser --profile`'s steps on
both files (issue #45).

Tolerance: the card's rows are the ring's own f32 values, sent as they were read: equal (the norms the cells carry are
summed in f64 by JS and by numpy over the same values: 1e-9 relative).
Screenshots of the card (memory.png, memory-qwen35.png) go to $LAB_SHOTS, and to docs/screenshots/ with LAB_DOC_SHOTS=1
(tests/browser/test_layout.py `shot`)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from tests.browser.conftest import take
from tests.browser.test_layout import shot

SLOW = 600_000                              # ms: a load or a reply on SwiftShader
KINDS = "conv conv attention conv conv attention"
RING = 18                                   # lab/engine/scratch.py conv_ring: l_cache - 1 + REWIND rows
SKIPPED = "conv state 3 [18, 256]"          # lab/engine/scratch.py Scratch._conv's label of layer 3's state


def _raw(page) -> dict:
    """Every state and snapshot as the worker's test hook read it raw: {conv: {layer: f32}, delta: {layer: f32},
    snapshots: [f32]} (flat arrays)."""
    m = page.evaluate("window.labStateBytes()")
    f32 = lambda b: np.frombuffer(base64.b64decode(b), np.float32)      # noqa: E731
    return {"conv": {int(il): f32(b) for il, b in m["conv"].items()},
            "delta": {int(il): f32(b) for il, b in m["delta"].items()}, "snapshots": [f32(b) for b in m["snapshots"]]}


def _states(page, ring: int = RING) -> dict[int, np.ndarray]:
    """{conv layer: its whole ring [ring, channels]}, read raw by the worker's test hook."""
    return {il: v.reshape(ring, -1) for il, v in _raw(page)["conv"].items()}


def _conv_cells(lab) -> dict[int, dict]:
    return {int(c["layer"]): c for c in lab.cells("conv-state", ["layer", "start", "end", "norm", "max", "lit"])}


def _forget(lab, skip: str | None = None) -> str:
    page = lab.page
    if skip:
        page.evaluate("label => window.labForgetSkipping(label)", skip)
    else:
        page.click('[data-testid="forget"]')
    page.wait_for_function("['wiped', 'nothing', 'failed'].includes(document.querySelector('[data-testid=forget-status]')"
                           ".dataset.state) && document.querySelector('[data-testid=memory-forget]')", timeout=SLOW)
    return page.get_attribute('[data-testid="memory-forget"]', "data-state")


@pytest.fixture(scope="module")
def hybrid_lab(card_page):
    """The cards' page (tests/browser/conftest.py `card_page`) for the module: each test picks its file in it."""
    return take(card_page, synthetic_arch.build("lfm2", "f32", cache_dir() / "synthetic"),
                viewport={"width": 1280, "height": 900})


def test_lfm2_memory_card_two_turns_and_forget(hybrid_lab):
    path = synthetic_arch.build("lfm2", "f32", cache_dir() / "synthetic")
    lab = hybrid_lab
    page = lab.page
    lab.pick(path)
    lab.wait_loaded(path.name)
    page.check('[data-testid="greedy"]')
    page.evaluate("document.querySelector('#kv').scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)              # the card's IntersectionObserver marks it on screen
    lab.send("Hello there", max_tokens=4)
    assert page.inner_text('[data-testid="reuse"]').startswith("prefilled ")
    lab.send("And then?", max_tokens=4)
    reuse = page.inner_text('[data-testid="reuse"]')
    reused = int(reuse.split("reused ")[1].split(":")[0])
    assert reused > 0 and "the conv states as the last turn left them" in reuse, reuse
    used = int(lab.cells("kv-used", ["used"])[0]["used"])

    # every layer's kind, and the KV heatmap on the attention layers only
    assert page.get_attribute('[data-testid="memory-kinds"]', "data-kinds") == KINDS
    kv = lab.cells("kv-cell", ["layer", "pos", "k"])
    assert {int(c["layer"]) for c in kv} == {2, 5} and len(kv) == 2 * used
    assert all(float(c["k"]) > 0 for c in kv)

    # the conv rows the next token reads: positions used-2 and used-1 of each conv layer's ring, as read raw
    conv, rings = _conv_cells(lab), _states(page)
    assert sorted(conv) == [0, 1, 3, 4] == sorted(rings)
    for il, c in conv.items():
        assert (int(c["start"]), int(c["end"])) == (used - 2, used)
        rows = rings[il][[(used - 2) % RING, (used - 1) % RING]].astype(np.float64)
        assert np.abs(rows).max() > 0
        np.testing.assert_allclose(float(c["norm"]), np.sqrt((rows ** 2).sum()), rtol=1e-9)
        np.testing.assert_allclose(float(c["max"]), np.abs(rows).max(), rtol=1e-9)

    # the bytes, and the line: the KV cache's grow with the tokens, the states' stay flat
    conv_bytes = int(page.get_attribute('[data-testid="memory-conv-bytes"]', "data-bytes"))
    assert conv_bytes == 4 * 2 * 256 * 4
    assert "4 layers × 2 inputs (l_cache − 1) × 256 channels × 4 bytes = 8,192 B" in page.inner_text(
        '[data-testid="memory-conv-bytes"]')
    g = page.eval_on_selector('[data-testid="memory-growth"]', "e => ({...e.dataset})")
    per_token = 2 * 2 * 2 * 64 * 4                 # 2 (K, V) x 2 attention layers x 2 KV heads x 64 x 4 bytes
    assert int(g["used"]) == used and int(g["kvBytes"]) == used * per_token
    assert int(g["stateBytes"]) == conv_bytes and int(g["cross"]) == 4
    shot(lab, "memory", card="kv")

    # the attention panel: the attention layers only, and why
    lab.open_panel("attention")
    lab.wait_in_card("attention", "[data-testid=attention-cell]", SLOW)
    options = page.eval_on_selector_all("[data-testid=attention-layer] option", "os => os.map(o => o.value)")
    assert options == ["2", "5"]
    why = page.inner_text("[data-testid=attention-why]")
    assert "Layers 0, 1, 3, 4 are short-conv layers" in why, why
    # the inspection ran the conv layers from position 0 with the states set aside: they are as the chat left them
    after_probe = _states(page)
    assert all(np.array_equal(after_probe[il], rings[il]) for il in rings)

    # Forget leaving layer 3's state alone: NOT wiped, that layer's rows redrawn from its read-back, still lit
    page.evaluate("document.querySelector('#kv').scrollIntoView({block: 'start'})")
    assert _forget(lab, skip=SKIPPED) == "failed"
    assert SKIPPED in page.inner_text('[data-testid="memory-forget"]')
    conv = _conv_cells(lab)
    assert float(conv[3]["norm"]) > 0 and int(conv[3]["lit"]) > 0
    assert all(float(conv[il]["norm"]) == 0 and int(conv[il]["lit"]) == 0 for il in (0, 1, 4))
    # a real Forget: every state read back as zero, drawn as zero, and the raw read agrees
    assert _forget(lab) == "wiped"
    conv = _conv_cells(lab)
    assert sorted(conv) == [0, 1, 3, 4]
    assert all(float(c["norm"]) == 0 and float(c["max"]) == 0 and int(c["lit"]) == 0 for c in conv.values())
    assert all(not r.any() for r in _states(page).values())
    assert page.get_attribute('[data-testid="forget-status"]', "data-state") == "wiped"
    assert lab.errors() == [] and lab.foreign_requests() == []


# -- qwen35 --------------------------------------------------------------------------------------------------------
Q_KINDS = "delta delta attention delta delta attention"
Q_RING = 19                                 # l_cache - 1 + REWIND
Q_SKIPPED = "delta-net state 3 [4, 64, 64]"  # lab/engine/scratch.py Scratch._conv's label of layer 3's recurrent state
RED, BLUE = np.array([201, 42, 42]), np.array([59, 91, 219])     # web/panels.js's signed colours


def _pixels(values: np.ndarray) -> np.ndarray:
    """The RGB web/panels.js signedPixels paints for signed values: white blended towards red (positive) or blue
    (negative) by sqrt(|v| / max|v|) (ImageData rounds to bytes: the caller allows 1)."""
    a = np.sqrt(np.abs(values) / np.abs(values).max())
    c = np.where(values[..., None] >= 0, RED, BLUE)
    return 255 - (255 - c) * a[..., None]


def _head_picture(page) -> tuple[dict, np.ndarray]:
    """The delta-state canvas's data attributes and its pixels [d_k, d_v, RGB]."""
    return page.eval_on_selector('[data-testid="delta-state"]', """c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        return [{...c.dataset}, Array.from(d), c.height, c.width]; }""")


def _delta_cells(lab) -> dict[int, list[float]]:
    """{delta-net layer: its strip's values, in record order}."""
    out: dict[int, list[float]] = {}
    for c in lab.cells("delta-norm", ["layer", "value"]):
        out.setdefault(int(c["layer"]), []).append(float(c["value"]))
    return out


def _send_watching(lab, text: str, max_tokens: int) -> None:
    """Lab.send with the memory card kept on screen while the reply streams (the page reads the states with each token
    only then): the send button is pressed from script, as Playwright's click would first scroll to it."""
    page = lab.page
    page.fill('[data-testid="max-tokens"]', str(max_tokens))
    page.fill('[data-testid="prompt"]', text)
    before = page.locator('[data-testid="message"]').count()
    page.evaluate("document.querySelector('#kv').scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)                  # the card's IntersectionObserver marks it on screen
    page.evaluate("document.querySelector('[data-testid=send]').click()")
    page.wait_for_function("n => document.querySelectorAll('[data-testid=message]').length >= n + 2"
                           " && document.querySelector('[data-testid=stop]').disabled"
                           " && document.querySelector('[data-testid=timings]').textContent.length > 0", arg=before,
                           timeout=SLOW)


# with --slow (38 s): by default lfm2's memory card runs in the page, and the verification card holds qwen35's file
# there to llama.cpp (tests/browser/test_verify_page.py test_card_on_a_hybrid)
@pytest.mark.slow
def test_qwen35_memory_card_two_turns_delta_states_and_forget(hybrid_lab):
    path = synthetic_arch.build("qwen35", "f32", cache_dir() / "synthetic")
    lab = hybrid_lab
    page = lab.page
    lab.pick(path)
    lab.wait_loaded(path.name)
    page.check('[data-testid="greedy"]')
    _send_watching(lab, "Hello there", 4)
    reuse = page.inner_text('[data-testid="reuse"]')
    assert reuse.startswith("prefilled ") and "nothing of this text was run before" in reuse, reuse
    first = _delta_cells(lab)
    # the card was on screen from the first turn: reads as its tokens arrived, not only at its end. One a token
    # where each step is read back before the next (SwiftShader); on a fast GPU the greedy steps run ahead in
    # blocks, the states with them, and a read finds them where the GPU has left them: 2 to 4 distinct records.
    assert all(2 <= len(v) <= 4 and len(set(v)) == len(v) for v in first.values()), first
    _send_watching(lab, "And then?", 4)
    reuse = page.inner_text('[data-testid="reuse"]')
    reused = int(reuse.split("reused ")[1].split(":")[0])
    # one greedy step a read on SwiftShader: the live states end where the session's cache does
    assert reused > 0 and "the conv and delta-net states as the last turn left them" in reuse, reuse
    used = int(lab.cells("kv-used", ["used"])[0]["used"])
    assert page.get_attribute('[data-testid="memory-kinds"]', "data-kinds") == Q_KINDS
    kv = lab.cells("kv-cell", ["layer", "pos", "k"])
    assert {int(c["layer"]) for c in kv} == {2, 5} and len(kv) == 2 * used

    # a strip per delta-net layer: its state's norm read as the tokens arrived, > 0 and moving with them
    strips = _delta_cells(lab)
    assert sorted(strips) == [0, 1, 3, 4]
    for il, values in strips.items():
        # the second turn streamed with the card on screen: its reads (one a token where steps are read back one
        # by one, fewer where the GPU runs ahead, as above), each at a new position, appended to the first turn's
        new = values[len(first[il]):]
        assert values[:len(first[il])] == first[il] and 2 <= len(new) <= 4, (il, values)
        assert all(v > 0 for v in values) and len(set(new)) == len(new), (il, values)
    raw = _raw(page)
    last = {int(c["layer"]): float(c["value"]) for c in lab.cells("delta-norm", ["layer", "value"])}
    for il, s in raw["delta"].items():          # the last record is the states as they stand: ‖S‖ over all heads
        np.testing.assert_allclose(last[il], np.sqrt((s.astype(np.float64) ** 2).sum()), rtol=1e-5)

    # pick layer 3, head 2: its 64 x 64 matrix, drawn from the GPU's bytes
    page.click('[data-testid="delta-pick"][data-layer="3"]')
    page.select_option('[data-testid="memory-head"]', "2")
    page.wait_for_selector('[data-testid="delta-state"][data-layer="3"][data-head="2"]', timeout=SLOW)
    want = raw["delta"][3].reshape(4, 64, 64)[2].astype(np.float64)
    data, pixels, h, w = _head_picture(page)
    assert (h, w) == (64, 64) and np.abs(want).max() > 0
    np.testing.assert_allclose(float(data["norm"]), np.sqrt((want ** 2).sum()), rtol=1e-9)
    np.testing.assert_allclose(float(data["max"]), np.abs(want).max(), rtol=1e-9)
    rgba = np.array(pixels, np.float64).reshape(64, 64, 4)
    assert np.abs(rgba[..., :3] - _pixels(want)).max() <= 1        # every pixel, rows k and columns v
    assert np.abs(rgba[..., :3] - _pixels(want.T)).max() > 1       # (the transpose is another picture)

    # the conv rows the next token reads: the last 3 inputs (q, k, v: 512 channels) of each ring, as read raw
    conv, rings = _conv_cells(lab), _states(page, Q_RING)
    assert sorted(conv) == [0, 1, 3, 4] == sorted(rings)
    for il, c in conv.items():
        assert (int(c["start"]), int(c["end"])) == (used - 3, used)
        rows = rings[il][[(p % Q_RING) for p in range(used - 3, used)]].astype(np.float64)
        np.testing.assert_allclose(float(c["norm"]), np.sqrt((rows ** 2).sum()), rtol=1e-9)
        np.testing.assert_allclose(float(c["max"]), np.abs(rows).max(), rtol=1e-9)

    # the bytes: the KV cache grows with the tokens, the states (and their snapshots) stay flat
    delta_bytes = int(page.get_attribute('[data-testid="memory-delta-bytes"]', "data-bytes"))
    conv_bytes = int(page.get_attribute('[data-testid="memory-conv-bytes"]', "data-bytes"))
    assert (delta_bytes, conv_bytes) == (4 * 4 * 64 * 64 * 4, 4 * 3 * 512 * 4)
    assert "4 layers × 4 heads × 64 × 64 × 4 bytes = 262,144 B" in page.inner_text(
        '[data-testid="memory-delta-bytes"]')
    assert "4 layers × 3 inputs (l_cache − 1) × 512 channels × 4 bytes = 24,576 B" in page.inner_text(
        '[data-testid="memory-conv-bytes"]')
    snap_line = page.inner_text('[data-testid="memory-snapshot-bytes"]')
    assert "3 copies × (262,144 B of delta-net states + 155,648 B of whole conv rings) = 1,253,376 B" in snap_line
    assert 155_648 == 4 * Q_RING * 512 * 4
    g = page.eval_on_selector('[data-testid="memory-growth"]', "e => ({...e.dataset})")
    per_token = 2 * 2 * 1 * 64 * 4                 # 2 (K, V) x 2 attention layers x 1 KV head x 64 x 4 bytes
    assert int(g["used"]) == used and int(g["kvBytes"]) == used * per_token
    assert int(g["stateBytes"]) == delta_bytes + conv_bytes and int(g["cross"]) == 280    # 286,720 / 1,024
    snaps = lab.cells("state-snapshot", ["slot", "pos"])
    held = sorted(int(c["pos"]) for c in snaps if c["pos"])
    assert len(snaps) == 3 and held and held[-1] == used and all(s.any() for s in raw["snapshots"])
    shot(lab, "memory-qwen35", card="kv")

    # the attention panel: layers 2 and 5 only, and why
    lab.open_panel("attention")
    lab.wait_in_card("attention", "[data-testid=attention-cell]", SLOW)
    options = page.eval_on_selector_all("[data-testid=attention-layer] option", "os => os.map(o => o.value)")
    assert options == ["2", "5"]
    assert "Layers 0, 1, 3, 4 are gated delta-net layers" in page.inner_text("[data-testid=attention-why]")
    after_probe = _raw(page)        # the inspection set the states aside and put them back, bit for bit
    assert all(np.array_equal(after_probe["delta"][il], raw["delta"][il]) for il in raw["delta"])

    # Forget leaving layer 3's recurrent state alone: NOT wiped, named, its strip and the picked head still lit
    page.evaluate("document.querySelector('#kv').scrollIntoView({block: 'start'})")
    assert _forget(lab, skip=Q_SKIPPED) == "failed"
    assert Q_SKIPPED in page.inner_text('[data-testid="memory-forget"]')
    strips = _delta_cells(lab)
    assert strips[3][-1] > 0 and all(strips[il] == [0.0] for il in (0, 1, 4))
    data, pixels, _, _ = _head_picture(page)
    assert (data["layer"], data["head"]) == ("3", "2")
    np.testing.assert_allclose(float(data["norm"]), np.sqrt((want ** 2).sum()), rtol=1e-9)
    assert all(float(c["norm"]) == 0 for c in _conv_cells(lab).values())
    assert [c["after"] for c in lab.cells("state-snapshot", ["after"])] == ["0", "0", "0"]
    # a real Forget: every recurrent state, conv state and snapshot read back as zero and drawn as zero
    assert _forget(lab) == "wiped"
    assert all(v == [0.0] for v in _delta_cells(lab).values()) and sorted(_delta_cells(lab)) == [0, 1, 3, 4]
    data, pixels, _, _ = _head_picture(page)
    assert float(data["norm"]) == 0 and float(data["max"]) == 0 and set(pixels) == {255}
    assert all(float(c["norm"]) == 0 and int(c["lit"]) == 0 for c in _conv_cells(lab).values())
    assert [c["after"] for c in lab.cells("state-snapshot", ["after"])] == ["0", "0", "0"]
    raw = _raw(page)
    assert not any(v.any() for part in ("conv", "delta") for v in raw[part].values())
    assert len(raw["snapshots"]) == 3 and not any(s.any() for s in raw["snapshots"])
    assert lab.errors() == [] and lab.foreign_requests() == []


# qwen35 first: the test before left its file loaded
@pytest.mark.parametrize("spec", ["qwen35", "lfm2"])
def test_the_bench_profile_of_a_hybrid(hybrid_lab, spec):
    """`lab bench --backend browser --profile` on a hybrid (issue #45): the bench (lab/host/bench/browser.py
    _gpu_profile) asks the worker's `profile` for the prefill at 0, then for a decode at a turn's position, each after
    warm_ms of steps at 0 that leave the conv and delta-net states at max_batch (64 on SwiftShader), past that position.
    A step there would be refused ("cannot be cut back like a KV cache"): lab.instruments.profile.prime fills the ids by
    a step at 0, and the decode plan at the position is timed on the states as they lie (tests/engine/test_profile.py
    holds the same natively). As the llama3 file's profile in tests/browser/test_arch_page.py: the families partition
    each step's dispatches, and every pass took GPU time."""
    path = synthetic_arch.build(spec, "f32", cache_dir() / "synthetic")
    lab = hybrid_lab
    page = lab.page
    if not page.evaluate("n => document.querySelector('[data-testid=model-info]').textContent.includes(n)", path.name):
        lab.pick(path)
        lab.wait_loaded(path.name)
    for t, pos in ((8, 0), (1, 12)):
        m = page.evaluate("([t, pos]) => window.labProfile(t, pos, true, 1, 50)", [t, pos])
        whole, fams = m["rows"][0], m["rows"][1:]
        assert whole["family"] == "whole step" and sum(r["dispatches"] for r in fams) == whole["dispatches"] > 0
        assert any(r["family"].startswith(("shortconv", "deltanet")) for r in fams), fams
        assert all(r["gpu_us"] > 0 for r in m["rows"]), m["rows"]
    assert lab.errors() == [] and lab.foreign_requests() == []
