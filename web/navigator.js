// The navigator, folding, the pinned column and the page's keys: how a learner finds a card among fourteen, folds the
// ones they are not reading, and keeps the chat and the context strip in reach while the cards scroll.
//
// The cards are the sections of the right column (server/templates/index.html), in the template's order; each says
// its group and short name there (data-group, data-short), so a new card is one section in the template, in its group.
// What it owns is store.nav (freshNav): the ids of the folded cards and which cards are on screen, in the page's memory
// only (no storage, no URL: a reload opens every card again). `computes(store, id)` is the one test main.js asks before
// it posts a card's request to the worker: a card computes only while it is open and on screen.
// What it does not know: what a card shows or asks the worker for (main.js and the card modules; on opening, main.js
// is told through `opened`), nor the one line a folded card shows: each card's `summary` (web/cards.js) or, for the
// built-in panels, web/panels.js LINES.

const $ = (id) => document.getElementById(id);

// The groups, by what a learner does, in the template's order.
export const GROUPS = { inside: "Inside the model", change: "Change it", trust: "Trust it", files: "Your files" };

// A card counts as on screen from a tenth of it in view (below what the pinned parts cover): a sliver at the edge does
// not make it compute (an inspection holds the worker for seconds to minutes on a CPU device).
const SHOWN = 0.1;

export function freshNav() {
  return {
    folded: new Set(),     // ids of the folded cards; a new reply, New chat, Forget and another model keep them
    onScreen: {},          // id -> true while SHOWN of the card is in view
  };
}

export const isOpen = (store, id) => !store.nav.folded.has(id);
// The one question before a card's request goes to the worker.
export const computes = (store, id) => !!store.nav.onScreen[id] && isOpen(store, id);

const cards = () => [...document.querySelectorAll("#column-panels > .card[data-group]")];

// ---- the pinned parts --------------------------------------------------------------------------------------------
// Two columns: the left one is sticky and as tall as the screen (style.css), so nothing here moves it. One column: it
// sticks with a negative top, so that only its last part, the dock's buttons and the context strip (#dock-pin),
// stays on screen above the cards; CSS cannot know that height, so it is measured here (--pin-top, --pin-h). The
// navigator sticks below it. What they cover of the screen's top (--covered) is left out when cards scroll to a
// place (scroll-padding) and when they count as on screen (the observer's rootMargin).
function pin() {
  const col = $("column-chat"), dock = $("dock-pin"), nav = $("navigator");
  const pinH = Math.ceil(col.getBoundingClientRect().bottom - dock.getBoundingClientRect().top);
  const root = document.documentElement.style;
  root.setProperty("--pin-h", `${pinH}px`);
  root.setProperty("--pin-top", `${pinH - col.offsetHeight}px`);
  const covered = Math.ceil((parseFloat(getComputedStyle(nav).top) || 0) + nav.offsetHeight);
  root.setProperty("--covered", `${covered}px`);
  return covered;
}

// ---- what is on screen -------------------------------------------------------------------------------------------
let seen = null, seenCovered = null;

function watch(store, changed) {
  const covered = pin();
  if (seen && covered === seenCovered) return;
  if (seen) seen.disconnect();
  seenCovered = covered;
  seen = new IntersectionObserver((entries) => {
    for (const e of entries) store.nav.onScreen[e.target.id] = e.isIntersecting && e.intersectionRatio >= SHOWN;
    changed();
  }, { threshold: [0, SHOWN], rootMargin: `-${covered}px 0px 0px 0px` });
  for (const card of cards()) seen.observe(card);
}

// ---- going to a card, folding one --------------------------------------------------------------------------------
function go(store, card, render) {
  card.scrollIntoView({ block: "start" });          // below the pinned parts: html's scroll-padding-top
  card.focus({ preventScroll: true });              // J, K and F go on from here
  render();
}

function fold(store, card, page) {
  const folded = store.nav.folded;
  const open = folded.has(card.id);
  if (open) folded.delete(card.id); else folded.add(card.id);
  page.render();
  // a card folded while its top was above the screen would leave the reader far below it
  if (card.getBoundingClientRect().top < seenCovered) card.scrollIntoView({ block: "start" });
  if (open) page.opened(card.id);
}

// The card holding the focus (gone to, or a control of it used), if any.
const focusedCard = () => (document.activeElement && document.activeElement.closest
  ? document.activeElement.closest("#column-panels > .card") : null);

// The card the keys act on: the one holding the focus, else the first one reaching below the pinned parts.
function currentCard() {
  const all = cards();
  return focusedCard() ?? all.find((c) => c.getBoundingClientRect().bottom > (seenCovered ?? 0) + 8) ?? all[0];
}

// Keys typed into a field are the field's.
const typing = (t) => t && t.closest && t.closest("input, textarea, select, [contenteditable]");

// J and K go to the next and the previous card, F folds or opens the current one (listed in #keys-help).
function onKey(store, page, e) {
  if (e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
  const key = e.key.toLowerCase();
  if (key !== "j" && key !== "k" && key !== "f") return;
  e.preventDefault();
  const card = currentCard();
  if (key === "f") { fold(store, card, page); return; }
  const all = cards(), at = all.indexOf(card);
  go(store, all[Math.min(all.length - 1, Math.max(0, at + (key === "j" ? 1 : -1)))], page.render);
}

// ---- the page's parts, made once ---------------------------------------------------------------------------------
// Each card's title becomes its fold button (a disclosure: aria-expanded), with the one line it shows folded below it.
function foldable(store, card, page) {
  const h2 = card.querySelector(":scope > h2");
  const button = document.createElement("button");
  button.type = "button";
  button.className = "fold";
  button.setAttribute("data-testid", "fold");
  button.title = "fold or open this card (F)";
  const mark = document.createElement("span");
  mark.className = "fold-mark";
  mark.setAttribute("aria-hidden", "true");
  button.append(mark, ...h2.childNodes);
  h2.replaceChildren(button);
  button.addEventListener("click", () => fold(store, card, page));
  const line = document.createElement("p");
  line.className = "fold-line muted";
  line.setAttribute("data-testid", "fold-line");
  h2.after(line);
  card.tabIndex = -1;
}

function navigator(store, page) {
  const groups = Object.entries(GROUPS).map(([group, title]) => {
    const list = document.createElement("div");
    list.className = "nav-group";
    list.dataset.group = group;
    const name = document.createElement("span");
    name.className = "nav-group-title";
    name.textContent = title;
    list.append(name, ...cards().filter((c) => c.dataset.group === group).map((card) => {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "nav-card";
      b.dataset.card = card.id;
      b.setAttribute("data-testid", "nav-card");
      b.textContent = card.dataset.short;
      b.addEventListener("click", () => go(store, card, page.render));
      return b;
    }));
    return list;
  });
  $("navigator").replaceChildren(...groups);
}

// page: {render, changed (what is on screen or open changed: ask for what now computes), opened(id) (a card was
// opened: ask for what it needs)}.
export function wireNavigator(store, page) {
  for (const card of cards()) foldable(store, card, page);
  navigator(store, page);
  document.addEventListener("keydown", (e) => onKey(store, page, e));
  const again = () => watch(store, page.changed);
  new ResizeObserver(again).observe($("column-chat"));
  new ResizeObserver(again).observe($("navigator"));
  window.addEventListener("resize", again);
  again();
}

// ---- rendering ----------------------------------------------------------------------------------------------------
// lines: id -> (store) => a card's current result in one line, shown while it is folded.
export function renderNavigator(store, lines) {
  for (const card of cards()) {
    const open = isOpen(store, card.id);
    card.classList.toggle("folded", !open);
    card.querySelector(":scope > h2 > .fold").setAttribute("aria-expanded", String(open));
    const line = card.querySelector(":scope > .fold-line");
    line.textContent = open ? "" : (lines[card.id] ? lines[card.id](store) : "") || "folded";
  }
  // the current card framed: the one holding the focus, while it is on screen (scrolled away, it is not current)
  const focused = focusedCard(), current = focused && store.nav.onScreen[focused.id] ? focused.id : null;
  for (const b of document.querySelectorAll("#navigator .nav-card")) {
    const id = b.dataset.card;
    b.classList.toggle("folded", !isOpen(store, id));
    b.classList.toggle("on-screen", !!store.nav.onScreen[id]);
    if (id === current) b.setAttribute("aria-current", "true"); else b.removeAttribute("aria-current");
  }
}
