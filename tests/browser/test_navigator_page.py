"""The navigator, the folding cards and the pinned column (web/navigator.js) in headless Chromium, on the small synthetic
Llama 3 (tests/conftest.py `tiny`: a reply and a probe take a second or two on SwiftShader):

- the navigator goes to every card and back, each landing at the top of the screen below the pinned navigator;
- every card folds to its title and one line and opens again, by its title and by the keys (J, K, F), which a field
  being typed into keeps for itself;
- a folded card asks the worker for nothing: every message the page posts is recorded (Worker.prototype.postMessage
  wrapped in the page), and with the cards inside the model and the Experiments card folded and on screen, a load, a
  reply, a click on a token and the arrow keys post none of their messages; opened, each asks for what it lacks; the
  Router card of this dense model says, folded and open, that it has no router, and asks for nothing;
- what is folded survives a reply and New chat;
- the context strip and Forget stay on screen (their boxes inside the viewport) while the last card is, at 1400 x 900
  and at 800 x 1000, and a token of the strip can be clicked there.

One page for the module (tests/browser/conftest.py `card_page`), the tests in file order. Screenshots go to $LAB_SHOTS
(the docs' pictures, on SmolLM2, come from tests/browser/test_layout.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser.conftest import Lab, take

WIDE = {"width": 1400, "height": 900}
NARROW = {"width": 800, "height": 1000}
SLOW = 300_000                  # ms: a reply or a probe on SwiftShader, the machine shared
SHOTS = Path(os.environ.get("LAB_SHOTS", "/tmp/llm-lab-shots"))
# the cards in the template's order, by group, with the short name the navigator shows
GROUPS = {
    "inside": ["embedding", "residual", "attention", "lens", "kv", "rope", "router"],
    "change": ["experiments", "training"],
    "trust": ["verify", "perplexity", "forget-card", "gpu"],
    "files": ["retrieval", "grounded", "tokenizer"],
}
ORDER = [c for cards in GROUPS.values() for c in cards]
# what each card asks the worker for by itself: none of it may go while the card is folded
ASKS = {"embedding": {"probe-embedding"}, "residual": {"probe-inspect"}, "attention": {"probe-inspect"},
        "lens": {"probe-inspect"}, "kv": {"kv-picture", "memory-head"}, "router": {"router", "router-ablate"},
        "experiments": {"experiment-tokens"}}
CARD_MESSAGES = set().union(*ASKS.values())

# Every message the page posts to its worker, as {type, kv_view, attention, lens, residual}: Worker.prototype.postMessage
# wrapped once in the page (main.js calls worker.postMessage, which finds the wrapper on the prototype).
RECORD = """() => { if (window.labSent) return;
    window.labSent = [];
    const post = Worker.prototype.postMessage;
    Worker.prototype.postMessage = function (m, ...rest) {
        window.labSent.push({type: m.type, kv_view: m.kv_view ?? null, attention: !!m.attention, lens: m.lens ?? 0,
                             residual: !!m.residual});
        return post.call(this, m, ...rest); }; }"""


@pytest.fixture(scope="module")
def nav(card_page, tiny_path):
    lab = take(card_page, tiny_path, viewport=WIDE)
    lab.page.evaluate(RECORD)
    yield lab
    open_all(lab)                                   # the next module's page starts with every card open
    lab.page.set_viewport_size(WIDE)


@pytest.fixture(autouse=True)
def every_card_open(nav):
    """Each test starts with every card open, whatever the one before left (a failure half-way included)."""
    open_all(nav)


def open_all(lab: Lab) -> None:
    for card in ORDER:
        if folded(lab, card):
            lab.page.click(f"#{card} [data-testid=fold]")


def sent(lab: Lab) -> list[dict]:
    return lab.page.evaluate("window.labSent")


def clear_sent(lab: Lab) -> None:
    lab.page.evaluate("window.labSent.length = 0")


def box(lab: Lab, selector: str) -> dict:
    """The element's box on the screen (viewport coordinates), and the screen's size."""
    return lab.page.evaluate("""sel => { const r = document.querySelector(sel).getBoundingClientRect();
        return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, height: r.height,
                vw: document.documentElement.clientWidth, vh: innerHeight}; }""", selector)


def inside(b: dict) -> bool:
    return b["top"] >= 0 and b["left"] >= 0 and b["bottom"] <= b["vh"] and b["right"] <= b["vw"] and b["height"] > 0


def folded(lab: Lab, card: str) -> bool:
    return lab.page.evaluate("id => document.getElementById(id).classList.contains('folded')", card)


def go(lab: Lab, card: str) -> dict:
    """Click the card's name in the navigator; the card's box and the navigator's bottom after it."""
    lab.page.click(f"#navigator [data-card='{card}']")
    return {**box(lab, f"#{card}"), "nav": box(lab, "#navigator")["bottom"]}


def landed(lab: Lab, card: str, at: dict) -> None:
    """The card is on screen, below the pinned navigator, at the top unless the page ends before it could get there;
    the navigator names it as the current one."""
    end = lab.page.evaluate("scrollY + innerHeight >= document.documentElement.scrollHeight - 1")
    assert at["nav"] <= at["top"] < at["vh"] - 40, (card, at)
    assert at["top"] - at["nav"] < 24 or end, (card, at)
    lab.page.wait_for_selector(f"#navigator [data-card='{card}'][aria-current=true]", timeout=5_000)
    assert lab.page.evaluate("document.activeElement.id") == card      # J, K and F go on from here


def test_the_navigator_goes_to_every_card_and_back(nav):
    page = nav.page
    shown = page.evaluate("""() => [...document.querySelectorAll('#navigator .nav-group')].map(g =>
        [g.dataset.group, [...g.querySelectorAll('[data-card]')].map(b => [b.dataset.card, b.textContent])])""")
    assert [(g, [c for c, _ in cards]) for g, cards in shown] == list(GROUPS.items())
    assert all(name for _, cards in shown for _, name in cards)
    # every card of the right column is in the navigator, in the page's order
    assert page.evaluate("[...document.querySelectorAll('#column-panels > .card')].map(c => c.id)") == ORDER
    for card in ORDER + ORDER[::-1]:
        landed(nav, card, go(nav, card))


def test_every_card_folds_and_opens(nav):
    page = nav.page
    for card in ORDER:
        go(nav, card)
        tall = box(nav, f"#{card}")["height"]
        page.click(f"#{card} [data-testid=fold]")
        assert folded(nav, card) and page.get_attribute(f"#{card} [data-testid=fold]", "aria-expanded") == "false"
        line = page.locator(f"#{card} [data-testid=fold-line]")
        assert line.is_visible() and line.inner_text().strip(), card         # its current result, in one line
        short = box(nav, f"#{card}")["height"]
        assert short < 90 and short < tall, (card, short, tall)
        assert "folded" in page.get_attribute(f"#navigator [data-card='{card}']", "class")
        page.click(f"#{card} [data-testid=fold]")
        assert not folded(nav, card) and page.get_attribute(f"#{card} [data-testid=fold]", "aria-expanded") == "true"
        assert not page.locator(f"#{card} [data-testid=fold-line]").is_visible()
        assert abs(box(nav, f"#{card}")["height"] - tall) < 2, card


def test_the_keys_go_to_cards_and_fold_them(nav):
    page = nav.page
    help_line = page.inner_text("[data-testid=keys-help]")
    assert all(k in help_line for k in ("J", "K", "F", "←", "→"))
    go(nav, "attention")
    page.keyboard.press("j")
    assert page.evaluate("document.activeElement.id") == "lens"
    page.keyboard.press("k")
    page.keyboard.press("k")
    landed(nav, "residual", {**box(nav, "#residual"), "nav": box(nav, "#navigator")["bottom"]})
    page.keyboard.press("f")
    assert folded(nav, "residual")
    page.keyboard.press("f")
    assert not folded(nav, "residual")
    # a key typed into a field is the field's
    page.click("[data-testid=system-prompt]")
    page.keyboard.type("jf")
    assert page.input_value("[data-testid=system-prompt]") == "jf" and not folded(nav, "residual")
    page.fill("[data-testid=system-prompt]", "")


def test_a_folded_card_asks_the_worker_nothing(nav, tiny_path):
    page = nav.page
    quiet = [c for c in ORDER if c in ASKS or c == "rope"]      # the RoPE card between them, so all fit on one screen
    for card in quiet:
        go(nav, card)
        page.click(f"#{card} [data-testid=fold]")
    page.evaluate("window.scrollTo(0, 0)")
    for card in ASKS:                                  # folded, and on screen: only the folding keeps them quiet
        assert folded(nav, card) and inside(box(nav, f"#{card}")), card
    clear_sent(nav)
    nav.pick(tiny_path)                                # a load: the Experiments card would ask for its prompts' tokens
    nav.wait_loaded(tiny_path.name)
    page.check("[data-testid=greedy]")
    nav.send("The capital of France is", max_tokens=3)
    n = len(nav.ids())
    page.click(f'[data-testid=token][data-index="{n - 3}"]')
    page.keyboard.press("ArrowLeft")
    page.wait_for_timeout(1500)                        # a request would leave at once; give a late one time to show
    posted = sent(nav)
    assert [m["type"] for m in posted if m["type"] in CARD_MESSAGES] == [], posted
    chats = [m for m in posted if m["type"] == "chat"]
    assert len(chats) == 1 and chats[0]["kv_view"] is None        # the memory card asked for no picture
    # folded, each says where it stands in one line
    used = int(page.evaluate("document.querySelector('[data-testid=tokens]').children.length")) - 1
    assert page.inner_text("#kv [data-testid=fold-line]").startswith(f"KV cache: {used} of ")
    pos = int(page.get_attribute("[data-testid=tokens]", "data-selected"))
    assert page.inner_text("#embedding [data-testid=fold-line]").startswith(f"open it to compute the row of #{pos} ")
    shot(nav, "navigator-folded")

    # opened (gone to with the navigator, so it is on screen), each asks for what it lacks, and shows it
    for card, asked, filled in (("embedding", "probe-embedding", "neighbour"), ("kv", "kv-picture", "kv-cell"),
                                ("attention", "probe-inspect", "attention-cell"),
                                ("residual", "probe-inspect", "residual-bar"), ("lens", "probe-inspect", "logit-lens-cell"),
                                ("experiments", "experiment-tokens", None)):
        go(nav, card)
        clear_sent(nav)
        page.click(f"#{card} [data-testid=fold]")
        page.wait_for_function("t => window.labSent.some(m => m.type === t)", arg=asked, timeout=SLOW)
        if filled:
            page.wait_for_selector(f"#{card} [data-testid={filled}]", timeout=SLOW)
    page.click("#rope [data-testid=fold]")
    kv_columns = page.evaluate("new Set([...document.querySelectorAll('[data-testid=kv-cell]')].map(c => c.dataset.pos)).size")
    assert kv_columns == used
    page.wait_for_function("document.querySelector('[data-testid=exp-pa-clean-tokens]').dataset.count > 0",
                           timeout=SLOW)                              # the patching prompts' tokens came back
    # the Router card of a dense model: folded, its line says there is no router; opened and on screen, it says so
    # and asks for nothing (tests/browser/test_router_page.py drives it on a mixture of experts)
    assert "has no router" in page.inner_text("#router [data-testid=fold-line]")
    go(nav, "router")
    clear_sent(nav)
    page.click("#router [data-testid=fold]")
    page.wait_for_timeout(1000)                        # a request would leave at once
    assert "has no router" in page.inner_text("[data-testid=router-none]")
    assert [m for m in sent(nav) if m["type"].startswith("router")] == []
    assert page.locator("[data-testid=router-heatmap]").count() == 0
    assert nav.errors() == [] and nav.foreign_requests() == []


def test_what_is_folded_survives_a_reply_and_new_chat(nav):
    page = nav.page
    fold = ["rope", "verify", "gpu", "lens"]
    for card in fold:
        go(nav, card)
        page.click(f"#{card} [data-testid=fold]")
        folded_now(nav, [c for c in ORDER if c in fold[:fold.index(card) + 1]])
    want = [c for c in ORDER if c in fold]
    nav.send("And Italy?", max_tokens=2)
    folded_now(nav, want)
    page.click("[data-testid=new-chat]")
    folded_now(nav, want)
    for card in fold:
        page.click(f"#{card} [data-testid=fold]")
    folded_now(nav, [])


def folded_now(lab: Lab, want: list[str]) -> None:
    """The folded cards are `want` (in the page's order) once the page has drawn what the last action changed: a
    reply's and a new chat's renders run after the worker's messages, so the state is waited for, not read at once."""
    try:
        lab.page.wait_for_function("a => a.order.filter(id => document.getElementById(id).classList.contains("
                                   "'folded')).join() === a.want.join()", arg={"want": want, "order": ORDER},
                                   timeout=5_000)
    except Exception:
        pass
    assert [c for c in ORDER if folded(lab, c)] == want


def shot(lab: Lab, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.mouse.move(0, 0)                          # no hover left on a token or a button by the last click
    lab.page.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.mark.parametrize("view", [WIDE, NARROW], ids=["1400x900", "800x1000"])
def test_the_strip_and_forget_stay_on_screen_with_the_last_card(nav, view):
    page = nav.page
    page.set_viewport_size(view)
    if not nav.ids():
        nav.send("The capital of France is", max_tokens=2)
    at = go(nav, ORDER[-1])
    assert at["top"] < at["vh"] and at["bottom"] > at["nav"]                  # the last card is on screen
    assert page.evaluate("scrollY") > 0
    for part in ("[data-testid=tokens]", "[data-testid=forget]", "[data-testid=stop]", "[data-testid=new-chat]",
                 "#navigator", "#tokens .tok:last-child"):
        assert inside(box(nav, part)), (view, part, box(nav, part))
    # the pinned parts do not cover one another: the navigator sits below the strip (one column) or beside it
    strip, bar = box(nav, "[data-testid=tokens]"), box(nav, "#navigator")
    assert strip["bottom"] <= bar["top"] or strip["right"] <= bar["left"], (strip, bar)
    # the strip still works from here, and the last card stays where it was on the screen: a click on a token (the
    # mouse's, where the token is seen: Playwright's click would first scroll the page to where the pinned strip would
    # sit unpinned, as focusing it did before main.js showInStrip), then an arrow key
    t = box(nav, '[data-testid=token][data-index="2"]')
    page.mouse.click(t["left"] + 2, t["top"] + 4)
    page.keyboard.press("ArrowLeft")
    assert page.get_attribute("[data-testid=tokens]", "data-selected") == "1"
    assert abs(box(nav, f"#{ORDER[-1]}")["top"] - at["top"]) < 2
    shot(nav, f"navigator-last-card-{view['width']}")
    page.keyboard.press("Escape")
