"""The page's layout and habits in headless Chromium: two columns on a wide screen and one on
a narrow one, no card over another (as seen: a part scrolled out of its column's own scroll is not there), the panels
on show once a model is loaded (every card open), one selection (click or arrow keys) that every panel follows, each
probe card's JSON and PNG export, the probe cards folded to one line each, and screenshots of the main states: always
to $LAB_SHOTS (default /tmp/llm-lab-shots), and to docs/screenshots/ when LAB_DOC_SHOTS=1. The navigator and the
pinned column have their own test (tests/browser/test_navigator_page.py).

The file is the small synthetic Llama 3 (tests/conftest.py `tiny`): the layout and the panels' wiring are the same for
every model, and the default run's shots show the page at work in seconds. LAB_DOC_SHOTS=1 takes the real SmolLM2, whose
panels read as a learner should see them (' Paris' in the lens), for the pictures in the docs.

One page is shared by the module (a load, a chat and the inspections cost a few minutes on SwiftShader); the tests
run in file order, Forget last. The lens covers one position (its cheapest path, a matvec per layer) unless
LAB_DOC_SHOTS=1 asks for the pictures, which show the page's default of 16."""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from itertools import pairwise
from pathlib import Path

import pytest

from tests.browser.conftest import Lab, take

WIDE = {"width": 1400, "height": 900}
NARROW = {"width": 800, "height": 1000}
SYSTEM = "Answer the king briefly."
PROMPT = "The capital of France is"
REPLY_TOKENS = 3
SLOW = 1_200_000                # ms: the pass and the lens take a minute or two on SwiftShader, ten on a loaded machine
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
DOC_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
DOC = os.environ.get("LAB_DOC_SHOTS") == "1"
LENS_POSITIONS = None if DOC else 1       # None: the page's default
PROBE_PANELS = ("embedding", "residual", "attention", "lens")
CARDS = "main .card"


# A card's picture alone: the pinned column and navigator would otherwise lie over a card taller than the screen
# (Playwright scrolls it under them to take it whole). Hidden through the CSSOM: the page's CSP refuses a style sheet
# of the test's (Playwright's screenshot `style`).
PINNED = "['column-chat', 'navigator'].map(id => document.getElementById(id))"


def shot(lab: Lab, name: str, card: str | None = None, doc: bool = True) -> None:
    """The viewport (or one card) as it is now, to $LAB_SHOTS and (LAB_DOC_SHOTS=1, unless doc is False)
    docs/screenshots/. Never the full page: the right column is several screens tall, and a learner sees a screen at a
    time."""
    dirs = [SHOTS] + ([DOC_SHOTS] if DOC and doc else [])
    lab.page.mouse.move(0, 0)                          # no hover left on a token or a button by the last click
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        if card:
            lab.page.evaluate(f"{PINNED}.forEach(e => {{ e.style.visibility = 'hidden'; }})")
            try:
                lab.page.locator(f"#{card}").screenshot(path=str(d / f"{name}.png"))
            finally:
                lab.page.evaluate(f"{PINNED}.forEach(e => {{ e.style.visibility = ''; }})")
        else:
            lab.page.screenshot(path=str(d / f"{name}.png"))


def boxes(lab: Lab, selector: str) -> list[dict]:
    """Bounding boxes (page coordinates) of the visible elements matching selector, with their ids, each cut to what
    the boxes that scroll around it show (the left column's model and chat scroll inside it)."""
    return lab.page.evaluate("""sel => [...document.querySelectorAll(sel)].filter(e => e.offsetParent !== null).map(e => {
        const r = e.getBoundingClientRect();
        let [top, bottom, left, right] = [r.top, r.bottom, r.left, r.right];
        for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
            const s = getComputedStyle(a);
            if (s.overflowX === 'visible' && s.overflowY === 'visible') continue;
            const q = a.getBoundingClientRect();
            [top, bottom, left, right] = [Math.max(top, q.top), Math.min(bottom, q.bottom), Math.max(left, q.left),
                                          Math.min(right, q.right)];
        }
        return {id: e.id, x: left + scrollX, y: top + scrollY, w: Math.max(0, right - left),
                h: Math.max(0, bottom - top)}; })""", selector)


def overlaps(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]


def check_layout(lab: Lab, columns: int) -> None:
    lab.page.evaluate("window.scrollTo(0, 0)")         # the chat column is pinned: its page position follows the scroll
    left, right = (boxes(lab, f"#{c}")[0] for c in ("column-chat", "column-panels"))
    if columns == 2:
        assert left["x"] + left["w"] <= right["x"] and abs(left["y"] - right["y"]) < 1, (left, right)
        assert right["w"] > left["w"]                  # the panels get the wider column
    else:
        assert left["y"] + left["h"] <= right["y"] and abs(left["x"] - right["x"]) < 1, (left, right)
    cards = boxes(lab, CARDS)
    assert {"model", "chat", "embedding", "residual", "attention", "lens", "gpu"} <= {c["id"] for c in cards}
    for i, a in enumerate(cards):
        for b in cards[i + 1:]:
            assert not overlaps(a, b), (a, b)
    width = lab.page.evaluate("document.documentElement.clientWidth")
    for c in cards:                                    # nothing sticks out of the page sideways
        assert c["x"] >= 0 and c["x"] + c["w"] <= width + 0.5, c
    # the panels (right column, or below the chat when narrow) come after the conversation's cards
    ids = [c["id"] for c in cards]
    assert ids.index("chat") < ids.index("embedding")


@pytest.fixture(scope="module")
def model(request):
    """(path, config) of the file the module loads: SmolLM2 for the docs' pictures, else the small synthetic one."""
    from lab.format import gguf
    from lab.format.model import from_gguf
    path = request.getfixturevalue("smollm2_path" if DOC else "tiny_path")
    return path, from_gguf(gguf.read_file(path))


@pytest.fixture(scope="module")
def lab_page(card_page, model):
    return take(card_page, model[0], viewport=WIDE)


@pytest.fixture(scope="module")
def loaded(lab_page):
    shot(lab_page, "loaded")
    return lab_page


@pytest.fixture(scope="module")
def replied(loaded):
    page = loaded.page
    page.fill('[data-testid="system-prompt"]', SYSTEM)
    page.fill('[data-testid="max-tokens"]', str(REPLY_TOKENS))
    page.fill('[data-testid="prompt"]', PROMPT)
    if LENS_POSITIONS:
        page.select_option("[data-testid=lens-positions]", str(LENS_POSITIONS))
    page.click('[data-testid="send"]')
    page.wait_for_function("document.querySelector('[data-testid=timings]').textContent.length > 0", timeout=SLOW)
    page.evaluate("window.scrollTo(0, 0)")
    shot(loaded, "replied")
    return loaded


@pytest.fixture(scope="module")
def panels(replied):
    """Every probe card filled: brought on screen one after the other, each waited for."""
    page = replied.page
    t0 = time.time()
    for name, testid in (("embedding", "neighbour"), ("residual", "residual-bar"), ("attention", "attention-cell"),
                         ("lens", "logit-lens-cell")):
        replied.open_panel(name)
        page.wait_for_selector(f"[data-testid={testid}]", timeout=SLOW)
        print(f"\n{name} filled {time.time() - t0:.0f} s after the reply")
    shot(replied, "attention", card="attention")
    shot(replied, "lens", card="lens")
    page.evaluate("window.scrollTo(0, 0)")
    shot(replied, "panels")
    return replied


def test_two_columns_wide_one_narrow(lab_page):
    check_layout(lab_page, 2)
    lab_page.page.set_viewport_size(NARROW)
    try:
        check_layout(lab_page, 1)
    finally:
        lab_page.page.set_viewport_size(WIDE)


def test_panels_on_show_after_load(loaded):
    page = loaded.page
    assert page.locator("details").count() == 0                  # nothing to open
    for name in PROBE_PANELS:
        card = page.locator(f"[data-panel={name}]")
        assert card.is_visible()
        assert card.locator(".explain").inner_text().strip()      # what it shows, and the formula
        assert "No conversation yet." in card.locator(".panel-body").inner_text()
        for testid in ("export-json", "export-png"):             # nothing to export yet
            assert card.locator(f"[data-testid={testid}]").is_disabled()
    check_layout(loaded, 2)


def selection(lab: Lab) -> dict:
    """The selected position as each part of the page shows it."""
    return lab.page.evaluate("""() => {
        const q = (s) => [...document.querySelectorAll(s)];
        const tok = document.querySelector('.tok.selected');
        const head = document.querySelector('#residual-body p');
        return {
          strip: tok ? Number(tok.dataset.index) : null,
          current: q('.tok.current').map(t => Number(t.dataset.index)),
          embedding: document.querySelector('[data-testid=embedding-id]')?.textContent ?? null,
          residual: head ? (m => m ? Number(m[1]) : head.textContent)(head.textContent.match(/position (\\d+)/)) : null,
          attention: [...new Set(q('[data-testid=attention-cell].sel-row').map(c => Number(c.dataset.q)))],
          lens: [...new Set(q('[data-testid=logit-lens-cell].sel-col').map(c => Number(c.dataset.pos)))],
        }; }""")


def wait_embedding(lab: Lab, token_id: int) -> None:
    lab.page.wait_for_function("id => document.querySelector('[data-testid=embedding-id]')?.textContent === String(id)",
                               arg=token_id, timeout=120_000)


def wait_selected(lab: Lab, pos: int, token_id: int) -> None:
    """The embedding and the residual panel both on `pos`: they come from two requests (the residual's waits for
    any inspection still out, such as the lens's), so neither may be read before the other has arrived."""
    wait_embedding(lab, token_id)
    lab.page.wait_for_function("pos => (document.querySelector('#residual-body p')?.textContent ?? '')"
                               ".startsWith(`position ${pos} `)", arg=pos, timeout=120_000)


def test_one_selection_drives_every_panel(panels):
    page = panels.page
    ids = panels.ids()
    n = len(ids)
    lens_from = min(int(c["pos"]) for c in panels.cells("logit-lens-cell", ["pos"]))
    assert n <= 48                                                 # the whole conversation is in the attention window

    def follows(pos: int, chosen: bool) -> dict:
        """What every part of the page shows with `pos` selected (outlined in the strip while not chosen)."""
        return {"strip": pos if chosen else None, "current": [] if chosen else [pos], "embedding": str(ids[pos]),
                "residual": pos, "attention": [pos], "lens": [pos] if pos >= lens_from else []}

    # nothing chosen: every panel follows the newest token
    assert selection(panels) == follows(n - 1, False)
    # a click chooses; the arrow keys then move the choice while the strip has focus
    page.click(f'[data-testid=token][data-index="{n - 3}"]')
    assert page.evaluate("document.activeElement.dataset.testid") == "tokens"
    page.keyboard.press("ArrowLeft")
    wait_selected(panels, n - 4, ids[n - 4])
    assert selection(panels) == follows(n - 4, True)
    if n - 4 < lens_from:
        assert "left of these columns" in page.inner_text("#lens-body p")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    wait_selected(panels, n - 2, ids[n - 2])
    assert selection(panels) == follows(n - 2, True)
    page.keyboard.press("End")
    page.keyboard.press("ArrowRight")                              # stops at the end
    wait_selected(panels, n - 1, ids[n - 1])
    assert selection(panels) == follows(n - 1, True)
    page.keyboard.press("Home")
    page.keyboard.press("ArrowLeft")                               # stops at the start
    wait_selected(panels, 0, ids[0])
    assert selection(panels) == follows(0, True)
    page.keyboard.press("Escape")                                  # back to following the newest token
    wait_selected(panels, n - 1, ids[-1])
    assert selection(panels) == follows(n - 1, False)


def download(lab: Lab, card: str, kind: str) -> tuple[str, bytes]:
    with lab.page.expect_download() as d:
        lab.page.click(f"#{card} [data-testid=export-{kind}]")
    dl = d.value
    data = Path(dl.path()).read_bytes()
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / f"export-{dl.suggested_filename}").write_bytes(data)      # to look at
    return dl.suggested_filename, data


def check_png(data: bytes) -> tuple[int, int]:
    """A well-formed RGBA PNG (every chunk's CRC, the image data's size) that is not one flat colour."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        (size,), kind = struct.unpack(">I", data[at:at + 4]), data[at + 4:at + 8]
        body = data[at + 8:at + 8 + size]
        assert struct.unpack(">I", data[at + 8 + size:at + 12 + size])[0] == zlib.crc32(kind + body)
        chunks.setdefault(kind, []).append(body)
        at += 12 + size
    assert b"IEND" in chunks
    w, h, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    channels = {6: 4, 2: 3}[colour]
    assert depth == 8 and len(raw) == h * (1 + w * channels)
    assert len(set(raw)) > 16                                      # not blank
    return w, h


def test_export_embedding(panels, model):
    page = panels.page
    name, data = download(panels, "embedding", "json")
    assert name == "llm-lab-embedding.json"
    d = json.loads(data)
    pos = selection(panels)["current"][0]
    assert d["position"] == pos and str(d["id"]) == page.inner_text("[data-testid=embedding-id]")
    shown = page.evaluate("[...document.querySelectorAll('[data-testid=embedding-values] [data-dim]')]"
                          ".map(e => Number(e.dataset.value))")
    assert d["values"] == shown and len(shown) == model[1].n_embd
    assert abs(d["norm"] - float(page.inner_text("[data-testid=embedding-norm]"))) <= 5e-5   # shown to 4 decimals
    cells = panels.cells("neighbour", ["id", "cos"])
    assert [(n["id"], n["cos"]) for n in d["neighbours"]] == [(int(c["id"]), float(c["cos"])) for c in cells]
    name, data = download(panels, "embedding", "png")
    assert name == "llm-lab-embedding.png"
    w, h = check_png(data)
    print(f"\nembedding: JSON {len(json.dumps(d)):,} chars, PNG {w}x{h} {len(data):,} bytes")
    assert w > 400 and h > 200 and len(data) > 5000


def test_export_residual(panels, model):
    d = json.loads(download(panels, "residual", "json")[1])
    bars = panels.cells("residual-bar", ["layer", "value"])
    assert d["norms"] == [{"layer": int(b["layer"]), "value": float(b["value"])} for b in bars]
    assert len(bars) == model[1].n_layer + 1 and d["position"] == selection(panels)["residual"]
    name, data = download(panels, "residual", "png")
    w, h = check_png(data)
    print(f"\nresidual: PNG {w}x{h} {len(data):,} bytes")
    assert name == "llm-lab-residual.png" and h > 200 and len(data) > 5000        # a bar a layer: 288 px for 4


def test_export_attention(panels, model):
    page = panels.page
    layer = min(7, model[1].n_layer - 1)
    page.select_option("[data-testid=attention-layer]", str(layer))
    page.select_option("[data-testid=attention-head]", "3")
    d = json.loads(download(panels, "attention", "json")[1])
    assert (d["layer"], d["head"]) == (layer, 3)
    cells = panels.cells("attention-cell", ["q", "k", "value"])
    assert len(cells) == len(d["positions"]) * (len(d["positions"]) + 1)
    for c in cells:
        q = int(c["q"]) - d["start"]
        k = 0 if c["k"] == "earlier" else int(c["k"]) - d["start"] + 1
        assert d["p"][q][k] == float(c["value"]), c
    assert d["heads"][3] == d["p"] and len(d["heads"]) == model[1].n_head
    name, data = download(panels, "attention", "png")
    w, h = check_png(data)
    print(f"\nattention: PNG {w}x{h} {len(data):,} bytes")
    assert name == "llm-lab-attention.png" and w > 400 and h > 400


def test_export_lens(panels, model):
    d = json.loads(download(panels, "lens", "json")[1])
    by_cell = {(c["layer"], c["pos"]): c["top"] for c in d["cells"]}
    cells = panels.cells("logit-lens-cell", ["layer", "pos", "id", "p"])
    assert len(cells) == len(by_cell) == model[1].n_layer * len(d["positions"])
    for c in cells:
        top = by_cell[int(c["layer"]), int(c["pos"])]
        assert (top[0]["id"], top[0]["p"]) == (int(c["id"]), float(c["p"])), c
        assert all(a["p"] >= b["p"] for a, b in pairwise(top))
    name, data = download(panels, "lens", "png")
    w, h = check_png(data)
    print(f"\nlens: PNG {w}x{h} {len(data):,} bytes")
    assert name == "llm-lab-logit-lens.png" and w > 400 and h > 200      # a row a layer: 316 px for 4


def folded_line(lab: Lab, card: str) -> str:
    return lab.page.inner_text(f"#{card} [data-testid=fold-line]")


def test_folded_cards_say_their_result_in_one_line(panels, model):
    """Folded, each probe card keeps its title and one line of what it shows; open again, it shows it all."""
    page = panels.page
    fold = ("embedding", "residual", "kv", "rope")
    for card in fold:
        page.click(f"#{card} [data-testid=fold]")
    pos, piece = selection(panels)["current"][0], page.inner_text("[data-testid=embedding-text]")
    assert folded_line(panels, "embedding").startswith(f"position {pos} {piece} · ‖e‖ ")
    residual = folded_line(panels, "residual")
    assert residual.startswith(f"position {pos} {piece} · ‖h‖ ") and f" after layer {model[1].n_layer - 1}" in residual
    used = int(panels.cells("kv-used", ["used"])[0]["used"])
    assert folded_line(panels, "kv").startswith(f"KV cache: {used} of ")
    for card in ("attention", "lens"):                            # open: no line
        assert not page.locator(f"#{card} [data-testid=fold-line]").is_visible()
    page.evaluate("window.scrollTo(0, 0)")
    shot(panels, "folded")
    for card in fold:
        page.click(f"#{card} [data-testid=fold]")
    assert page.locator("main .card.folded").count() == 0


def test_narrow_page_with_panels(panels):
    """At 800 px the filled page is one column, nothing overlaps, and no panel pushes the page sideways; among the
    cards, the context strip stays pinned above them."""
    page = panels.page
    page.set_viewport_size(NARROW)
    try:
        check_layout(panels, 1)
        assert page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
        page.click("#navigator [data-card=attention]")            # a card, with the strip pinned above it
        strip = boxes(panels, "#tokens")[0]
        assert page.evaluate("scrollY") <= strip["y"] and strip["y"] + strip["h"] <= page.evaluate("scrollY + innerHeight")
        shot(panels, "narrow")
    finally:
        page.set_viewport_size(WIDE)


def test_forget_empties_every_panel(panels):
    page = panels.page
    page.click("[data-testid=forget]")
    page.wait_for_function("document.querySelector('[data-testid=forget-status]').dataset.state === 'wiped'", timeout=SLOW)
    for name in PROBE_PANELS:
        card = page.locator(f"[data-panel={name}]")
        assert "No conversation yet." in card.locator(".panel-body").inner_text(), name
        assert card.locator("[data-testid=export-json]").is_disabled()
    page.locator("#forget-card").scroll_into_view_if_needed()
    shot(panels, "forgotten")
    assert panels.errors() == []
    assert panels.foreign_requests() == []
