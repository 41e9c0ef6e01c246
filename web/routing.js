// The Router card: in a mixture of experts, which experts each token of the conversation went to at each routed layer
// and with what weight (a tokens x experts heatmap, a layer slider), the load on each expert over the conversation,
// and the router's entropy by layer; a click on an expert runs the conversation again with that expert left out of
// the layer's weighted sum and shows the next tokens with and without it. The worker reads the engine's own choices
// (lab/instruments/routing.py, through lab/worker/routing.py) and ablates through the experiments' "expert" site
// (lab/instruments/experiments.py `expert_ablation`); this card asks, and draws.
// A dense model has no router: the card says so and asks for nothing. A folded card, or one off screen, asks for
// nothing either (web/navigator.js computes); it reads the conversation when it comes on screen and after each turn.
// Token pieces are the model's and the user's text: set as text (textContent), never parsed as HTML.
// Its state is store.router (freshRouter): main.js hands the worker's messages to the update functions below; its
// `card` (web/cards.js, at the end) says what a model's life does to it, and draws it with renderRouter.
import { computes } from "/web/navigator.js";
import { BLUE, GREEN, node as el, rgba, shown, top5Table, withTestid as testid } from "/web/panels.js";
import { drawBars, drawHeatmap, drawLines, heatmapSize, linesHeight, sheet, textWidth, MONO } from "/web/pictures.js";

const $ = (id) => document.getElementById(id);
const NUMBERS_UP_TO = 16;     // experts a row writes its weights in (more: shades alone, the value on hover)
const DARK = 0.6;             // a cell's text turns white on shades more opaque than this
const ABLATION_NEW = 8;       // greedy tokens after the conversation, with and without the expert
// The buffers Forget's report names for this card: the engine's router rows (lab/engine/blocks/moe.py) and the
// experiments' runs the ablation used.
const ROWS = ["router logits", "chosen experts", "expert weights"];
const RUNS = ["experiment.", "intervene."];

// ---- the card's state: store.router -------------------------------------------------------------------------------
export function freshRouter() {
  return {
    seq: 0,             // the newest request; answers to older ones are dropped
    busy: null,         // "read" | "ablate" while the worker works for this card
    data: null,         // the "router" message: the conversation's routing
    layer: 0,           // the slider: an index into data.layers
    pending: null,      // {layer, expert} of the ablation asked for
    ablation: null,     // the "router-ablation" message
    error: null,
    failedAt: null,     // the conversation length a reading failed at (not asked again for it)
    wiped: null,        // this card's buffers in the last Forget report: {buffers, before, after, labels}
  };
}

const NOTHING = { busy: null, data: null, pending: null, ablation: null, error: null, failedAt: null };
const experts = (store) => (store.loaded ? store.loaded.experts : null);

export function routerData(s, m) {
  if (m.seq !== s.seq) return;
  s.busy = null;
  s.data = m;
  s.layer = Math.min(s.layer, m.layers.length - 1);
  s.error = null;
}

export function routerAblation(s, m) {
  if (m.seq !== s.seq) return;
  s.busy = null;
  s.pending = null;
  s.ablation = m;
}

export function routerFailed(s, m, contextLength) {
  if (m.seq != null && m.seq !== s.seq) return;
  if (s.busy === "read") s.failedAt = contextLength;
  s.busy = null;
  s.pending = null;
  s.error = m.message;
}

// Forget's report: the router's rows and the ablation's runs, as read back before and after the wipe.
export function routerForgotten(s, report) {
  const ours = (label) => ROWS.some((p) => label.startsWith(p)) || RUNS.some((p) => label.startsWith(p));
  const items = report.items.filter((i) => ours(i.label));
  const sum = (key) => items.reduce((a, i) => a + i[key], 0);
  s.wiped = items.length
    ? { buffers: items.length, before: sum("before"), after: sum("after"), labels: items.map((i) => i.label) } : null;
}

// New chat, Forget, another model, a lost GPU: what the card read of the conversation goes.
export function dropRouter(s) {
  s.seq++;
  Object.assign(s, NOTHING, { wiped: null });
}

// ---- requests -----------------------------------------------------------------------------------------------------
// The conversation's routing, when the card computes (open, on screen) and lacks it for this conversation.
export function askRouting(store, worker) {
  const s = store.router, n = store.context.length;
  if (!experts(store) || !computes(store, "router") || store.generating || store.dropTurn || s.busy || !n) return;
  if ((s.data && s.data.tokens.length === n) || s.failedAt === n) return;
  s.busy = "read";
  s.error = null;
  worker.postMessage({ type: "router", seq: ++s.seq });
}

function ablate(store, worker, rerender, expert) {
  const s = store.router;
  if (!s.data || s.busy || store.generating) return;
  const layer = s.data.layers[s.layer];
  s.busy = "ablate";
  s.pending = { layer, expert };
  s.error = null;
  worker.postMessage({ type: "router-ablate", layer, expert, max_new: ABLATION_NEW, seq: ++s.seq });
  rerender();
}

export function wireRouter(store, worker, rerender) {
  $("router-layer").addEventListener("input", (e) => { store.router.layer = Number(e.target.value); rerender(); });
  // an expert's column head, or any of its cells: that expert of the shown layer ablated
  $("router-map").addEventListener("click", (e) => {
    const at = e.target.closest("[data-expert]");
    if (at) ablate(store, worker, rerender, Number(at.dataset.expert));
  });
  // a layer's entropy bar: that layer on the slider
  $("router-entropy").addEventListener("click", (e) => {
    const row = e.target.closest("[data-index]");
    if (row) { store.router.layer = Number(row.dataset.index); rerender(); }
  });
}

// ---- rendering ----------------------------------------------------------------------------------------------------
// One routed layer's rows, from the message's flat arrays: per token its k (expert, weight) picks and its entropy.
function layerOf(d, li) {
  const t = d.tokens.length, k = d.k;
  const picks = Array.from({ length: t }, (_, j) => Array.from({ length: k }, (_, s) => {
    const q = (li * t + j) * k + s;
    return [d.experts[q], d.weights[q]];
  }));
  const entropy = Array.from({ length: t }, (_, j) => d.entropy[li * t + j]);
  return { layer: d.layers[li], picks, entropy, load: d.load[li], share: d.share[li], mean: d.mean_entropy[li] };
}

const weightOf = (picks, e) => { for (const [x, w] of picks) if (x === e) return w; return null; };
const bits = (x) => `${x.toFixed(2)} bits`;

function legend(d) {
  const box = testid(el("div", "exp-legend router-legend"), "router-legend");
  const bar = el("span", "exp-legend-bar");
  bar.style.background = `linear-gradient(to right, #fff, ${rgba(BLUE, 1)})`;
  const load = el("span", "exp-legend-bar");
  load.style.background = `linear-gradient(to right, #fff, ${rgba(GREEN, 1)})`;
  const weights = el("span", "router-key");
  weights.append("a cell: the expert's weight at the token, 0 ", bar, " 1 (blank: not chosen)");
  const loads = el("span", "router-key");
  loads.append("load: the tokens that chose the expert, 0 ", load, ` the most (${(d.tokens.length * d.k / d.n_expert)
    .toFixed(1)} each if balanced)`);
  box.append(weights, loads, el("span", "router-key", `H: the router's entropy at the token, bits (${bits(
    Math.log2(d.n_expert))}: every expert alike)`));
  return box;
}

// A shade over white: the cells that stay at the top while the rows scroll under them must hide them.
const opaque = (colour, a) => `linear-gradient(${rgba(colour, a)}, ${rgba(colour, a)}), #fff`;

// The heatmap: a corner, the experts (buttons: a click ablates), the entropy column; the load row; a row a token. The
// first two rows stay at the top of the card's scrolled box.
function heatmap(d, L) {
  const E = d.n_expert, numbers = E <= NUMBERS_UP_TO;
  const g = testid(el("div", `exp-grid router-grid${numbers ? " numbers" : ""}`), "router-heatmap");
  g.style.gridTemplateColumns = `max-content repeat(${E}, var(--exp-cell)) max-content`;
  g.dataset.rows = L.picks.length;
  g.dataset.cols = E;
  g.dataset.layer = L.layer;
  g.append(el("div", "corner router-head", "token ↓ expert →"));
  for (let e = 0; e < E; e++) {
    const b = testid(el("button", "router-expert router-head", String(e)), "router-expert");
    b.type = "button";
    b.dataset.expert = e;
    b.title = `expert ${e}: run the conversation again without it at layer ${L.layer}`;
    g.append(b);
  }
  g.append(el("div", "corner router-h router-head", "H"));
  const most = Math.max(1, ...L.load);
  g.append(el("div", "qlabel router-load-label router-loadrow", "load"));
  L.load.forEach((n, e) => {
    const c = testid(el("div", "exp-cell router-load router-loadrow", String(n)), "router-load");
    Object.assign(c.dataset, { expert: e, value: n, share: L.share[e] });
    c.style.background = opaque(GREEN, n / most);
    if (n / most > DARK) c.classList.add("dark");
    c.title = `expert ${e}: chosen by ${n} of ${L.picks.length} tokens, weights summing to ${L.share[e].toFixed(3)}`;
    g.append(c);
  });
  const mean = el("div", "router-h router-loadrow", L.mean.toFixed(2));
  mean.title = "the mean entropy over the tokens, bits";
  g.append(mean);
  L.picks.forEach((picks, j) => {
    const label = el("div", "qlabel", shown(d.tokens[j]));
    label.title = `#${j} ${shown(d.tokens[j])}`;
    g.append(label);
    for (let e = 0; e < E; e++) {
      const w = weightOf(picks, e);
      const c = testid(el("div", "exp-cell"), "router-cell");
      Object.assign(c.dataset, { pos: j, expert: e });
      if (w != null) {
        c.dataset.weight = w;
        c.style.background = rgba(BLUE, w);
        if (numbers) { c.textContent = w.toFixed(2); if (w > DARK) c.classList.add("dark"); }
      }
      c.title = `#${j} ${shown(d.tokens[j])}, expert ${e}: ${w == null ? "not chosen" : `weight ${w.toFixed(4)}`}; `
        + "click: without it";
      g.append(c);
    }
    const h = testid(el("div", "router-h", L.entropy[j].toFixed(2)), "router-token-entropy");
    h.dataset.value = L.entropy[j];
    g.append(h);
  });
  return g;
}

function entropyBars(d, chosen) {
  const max = Math.log2(d.n_expert);
  const box = testid(el("div", "exp-bars router-entropy-bars"), "router-entropy-bars");
  d.layers.forEach((layer, i) => {
    const row = testid(el("div", `router-entropy-row${i === chosen ? " chosen" : ""}`), "router-entropy-row");
    Object.assign(row.dataset, { index: i, layer, value: d.mean_entropy[i] });
    row.title = `layer ${layer}: the router's entropy, averaged over the tokens; click: this layer`;
    const track = el("span", "exp-track router-track");
    const bar = el("span", "exp-bar");
    bar.style.left = "0";
    bar.style.width = `${(100 * d.mean_entropy[i] / max).toFixed(2)}%`;
    bar.style.background = rgba(BLUE, 0.85);
    track.append(bar);
    row.append(el("span", "exp-bar-label", `L${layer}`), track, el("span", "exp-bar-value", bits(d.mean_entropy[i])));
    box.append(row);
  });
  return [box, el("p", "muted hint", `mean over the ${d.tokens.length} tokens; the full bar is ${bits(max)}, `
    + `log₂ ${d.n_expert}: every expert alike to the router. Click a layer to show it.`)];
}

const piece = (a, id) => shown(a.pieces[String(id)]);

// The two greedy continuations, token by token; in the one without the expert, the tokens from the first that differs
// on are marked.
function continuation(a, ids, which, title) {
  const row = testid(el("div", "router-cont"), `router-greedy-${which}`);
  row.dataset.ids = ids.join(",");
  row.append(el("span", "router-cont-title", title));
  const from = which === "after" && a.first_change != null ? a.first_change : Infinity;
  ids.forEach((id, i) => row.append(el("span", `tok${i >= from ? " router-changed" : ""}`, piece(a, id))));
  return row;
}

function renderAblation(s) {
  const box = $("router-ablation");
  const a = s.ablation;
  box.dataset.state = s.busy === "ablate" ? "running" : a ? "done" : "";
  if (s.busy === "ablate" && s.pending) {
    box.replaceChildren(el("p", "muted", `expert ${s.pending.expert} of layer ${s.pending.layer} left out: running the `
      + "conversation again with and without it…"));
    return;
  }
  if (!a) {
    box.replaceChildren(el("p", "muted hint", s.data ? "Click an expert (a column) to run the conversation again "
      + "without it at the shown layer." : ""));
    return;
  }
  if (box.shows === a) return;
  box.shows = a;
  Object.assign(box.dataset, { layer: a.layer, expert: a.expert, kl: a.kl_bits, firstChange: a.first_change ?? "" });
  const chosen = s.data && s.data.layers.indexOf(a.layer) >= 0
    ? layerOf(s.data, s.data.layers.indexOf(a.layer)).load[a.expert] : null;
  const summary = testid(el("p", "exp-summary",
    `Expert ${a.expert} of layer ${a.layer} left out of the weighted sum at every position (its weight zeroed where a `
    + "token chose it; the other chosen experts keep their own weights, not renormalised)"
    + (chosen != null ? `; ${chosen} of the ${a.tokens} tokens had chosen it` : "")
    + `. The next token's distribution moved by KL ${a.kl_bits.toFixed(4)} bits; `
    + (a.first_change == null ? `the ${a.greedy_before.length} greedy tokens are the same.`
      : `the greedy continuation changes from token ${a.first_change + 1} on.`) + ` (${a.seconds.toFixed(1)} s)`),
    "router-ablation-summary");
  box.replaceChildren(summary, el("h3", null, "The next token, with and without it"), top5Table({ before: a.top5_before, after: a.top5_after, heads: ["with it", "without"],
    text: (id) => piece(a, id), id: "router-top5", rowId: "router-top5-row" }),
    el("h3", null, "The greedy continuation of the conversation"),
    continuation(a, a.greedy_before, "before", "with it:"),
    continuation(a, a.greedy_after, "after", `without expert ${a.expert}:`));
}

function status(store) {
  const s = store.router;
  if (!store.loaded) return { state: "idle", text: "load a model first" };
  if (!experts(store)) return { state: "none", text: "" };
  if (s.busy === "read") return { state: "running", text: "reading the router's choices over the conversation…" };
  if (s.error) return { state: "error", text: s.error };
  if (!s.data) {
    return { state: "idle", text: store.context.length ? "" : "chat first: the card reads the conversation" };
  }
  const stale = s.data.tokens.length !== store.context.length;
  return { state: "done", text: `${s.data.tokens.length} tokens read in ${s.data.seconds.toFixed(2)} s`
    + (stale ? " (the conversation has changed since: it is read again once the card is on screen)" : "") };
}

export function renderRouter(store) {
  const s = store.router, ex = experts(store), d = s.data;
  const none = $("router-none");
  none.hidden = !store.loaded || !!ex;
  none.textContent = "This model has no router: every layer's feed-forward is dense, one FFN for every token. Load a "
    + "mixture-of-experts file (a Mixtral-style llama, qwen3moe, lfm2moe) to see one.";
  $("router-what").textContent = ex ? `${ex.n_expert} experts, ${ex.k} a token, at ${ex.layers.length} routed layer`
    + `${ex.layers.length > 1 ? "s" : ""} (${ex.layers.join(", ")}); gating ${ex.gating}.` : "";
  $("router-controls").hidden = !d;
  const st = status(store), line = $("router-status");
  line.dataset.state = st.state;
  line.textContent = st.text;
  const slider = $("router-layer");
  if (d) {
    slider.max = String(d.layers.length - 1);
    slider.value = String(s.layer);
    slider.disabled = !!s.busy;
    $("router-layer-name").textContent = `layer ${d.layers[s.layer]} (${s.layer + 1} of ${d.layers.length} routed)`;
  }
  const map = $("router-map");
  const key = d ? `${d.seq}:${s.layer}` : "";
  if (map.shows !== key) {            // rebuilt when what it shows changes, not on every render
    map.shows = key;
    map.replaceChildren(...(d ? [legend(d), heatmap(d, layerOf(d, s.layer))] : []));
  }
  // the experts clickable while nothing runs; the one ablated last (at the layer shown) marked
  const a = s.ablation, shownLayer = d ? d.layers[s.layer] : null;
  for (const b of map.querySelectorAll(".router-expert")) {
    b.disabled = !!s.busy || store.generating;
    b.classList.toggle("ablated", !!a && a.layer === shownLayer && Number(b.dataset.expert) === a.expert);
  }
  const ent = $("router-entropy");
  const ekey = d ? `${d.seq}:${s.layer}` : "";
  if (ent.shows !== ekey) { ent.shows = ekey; ent.replaceChildren(...(d ? entropyBars(d, s.layer) : [])); }
  $("router-entropy-title").hidden = !d;
  $("router-ablation-title").hidden = !d && !s.ablation;
  renderAblation(s);
  const w = s.wiped, wl = $("router-wiped");
  wl.hidden = !w;
  wl.dataset.before = w ? w.before : "";
  wl.dataset.after = w ? w.after : "";
  wl.dataset.state = !w ? "" : w.after ? "failed" : "wiped";
  wl.textContent = !w ? "" : w.after
    ? `Forget did NOT wipe the router's buffers: ${w.after} non-zero words remain`
    : `Forget wiped the router's rows and the ablation's runs: ${w.before.toLocaleString("en")} non-zero words in `
      + `${w.buffers} buffers (${w.labels.join(", ")}) read back as zero.`;
}

// ---- folded (web/navigator.js): the card in one line ---------------------------------------------------------------
export function routerLine(store) {
  const s = store.router, ex = experts(store), d = s.data;
  if (!store.loaded) return "no model";
  if (!ex) return "this model has no router: every feed-forward is dense (not a mixture of experts)";
  if (s.busy) return "reading…";
  if (!d) return `${ex.n_expert} experts, ${ex.k} a token; no conversation read yet`;
  const L = layerOf(d, s.layer);
  const busiest = L.load.indexOf(Math.max(...L.load));
  return `layer ${L.layer}: expert ${busiest} the busiest (${L.load[busiest]} of ${d.tokens.length} tokens); `
    + `entropy ${bits(L.mean)} of ${bits(Math.log2(d.n_expert))}`;
}

// ---- export: the routing and the last ablation as JSON, the shown layer's picture as PNG ---------------------------
export function routerJson(store) {
  const s = store.router, d = s.data;
  if (!d) return null;
  const layers = d.layers.map((_, i) => {
    const L = layerOf(d, i);
    return { layer: L.layer, experts: L.picks.map((p) => p.map(([e]) => e)),
             weights: L.picks.map((p) => p.map(([, w]) => w)), entropy_bits: L.entropy, load: L.load, share: L.share,
             mean_entropy_bits: L.mean };
  });
  return {
    card: "router", model: store.model ? store.model.file_name : null, n_expert: d.n_expert, k: d.k, gating: d.gating,
    entropy: "of the router's whole distribution over the experts at each token (softmax of the logits; sigmoid "
      + "gating: the sigmoids divided by their sum), in bits",
    tokens: d.tokens, layers, shown_layer: d.layers[s.layer],
    ablation: s.ablation ? (({ type, seq, pieces, ...rest }) => ({ ...rest, pieces }))(s.ablation) : null,
  };
}

export function drawRouter(canvas, store) {
  const s = store.router, d = s.data, L = layerOf(d, s.layer), E = d.n_expert;
  const cols = Array.from({ length: E }, (_, e) => String(e)).concat(["H"]);
  const values = L.picks.map((p) => Array.from({ length: E }, (_, e) => weightOf(p, e)));
  const spec = {
    cols, rows: d.tokens.map(shown), cellW: E <= NUMBERS_UP_TO ? 34 : 12, cellH: 15,
    colour: (r, c) => (c === E ? [255, 255, 255] : BLUE),
    alpha: (r, c) => (c === E ? 0 : values[r][c] ?? 0),
    text: E <= NUMBERS_UP_TO
      ? (r, c) => (c === E ? L.entropy[r].toFixed(2) : values[r][c] == null ? "" : values[r][c].toFixed(2)) : null,
  };
  const size = heatmapSize(spec);
  const bars = d.layers.map((l) => `L${l}`);
  const abl = s.ablation ? [
    `expert ${s.ablation.expert} of layer ${s.ablation.layer} left out (not renormalised): `
      + `KL ${s.ablation.kl_bits.toFixed(4)} bits`,
    `with it:    ${s.ablation.greedy_before.map((i) => piece(s.ablation, i)).join(" ")}`,
    `without it: ${s.ablation.greedy_after.map((i) => piece(s.ablation, i)).join(" ")}`] : [];
  const load = `load (the tokens that chose it), expert:tokens  ${L.load.map((n, e) => `${e}:${n}`).join("  ")}`;
  const full = Math.log2(E).toFixed(2);
  const caption = `the router's mean entropy by layer, bits (a full bar: ${full}, every expert alike)`;
  const W = Math.max(size.width, 420, textWidth([load, caption, ...abl], MONO));
  const H = size.height + 10 + linesHeight(2) + 10 + bars.length * 14 + 10 + linesHeight(abl.length);
  const ctx = sheet(canvas, W, H, `Router: layer ${L.layer}, ${d.tokens.length} tokens x ${E} experts (${d.k} a token)`,
    ["cell: the expert's weight at the token (blank: not chosen); H: the router's entropy at the token, bits",
     `entropy of the router's whole distribution over the ${E} experts; the bars below: its mean by layer, full at `
       + `${full} bits`]);
  let y = drawHeatmap(ctx, 0, spec) + 10;
  y += drawLines(ctx, y, [load, caption]) + 10;
  y += drawBars(ctx, y, bars, d.mean_entropy, W, BLUE, 2, Math.log2(E)) + 10;
  drawLines(ctx, y, abl);
}

// ---- its place in the page (web/cards.js) ---------------------------------------------------------------------------
export const card = {
  key: "router",
  fresh: freshRouter,
  render: renderRouter,
  wire: (store, worker, page) => wireRouter(store, worker, page.render),
  exports: (store, register) => register("router", { data: () => routerJson(store),
                                                     draw: (canvas) => drawRouter(canvas, store) }),
  loaded: (store) => dropRouter(store.router),
  opened: (store, worker) => askRouting(store, worker),
  changed: (store, worker) => askRouting(store, worker),
  summary: routerLine,
  cleared: (store) => dropRouter(store.router),
  forgotten: (store, report) => routerForgotten(store.router, report),
};
