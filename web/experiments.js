// The Experiments card: change the model's insides and watch what follows. Four experiments on the loaded model, one
// a tab: ablation (a head or a block removed), activation patching (one activation carried from a clean run into a
// corrupted one), steering (a direction added to the residual while generating) and direct logit attribution (the
// logit split into what each block wrote). lab/instruments/experiments.py runs them; the worker's side is
// lab/worker/experiments.py. This card sends the inputs, says how long a sweep will take before it starts (and asks
// first when that is long), shows the progress with Stop, and draws the results.
// It follows the page's selection: a token clicked in the context fills the target (#ID), the attention panel's
// layer and head fill the ablation's layers and heads and the steering layer; a cell of the ablation heatmap or a
// head's bar picks that layer and head for the panels in return.
// Everything that comes from the user (prompts, tokens, replies) is set as text (textContent), never parsed as HTML.
// Its state is store.experiments (freshExperiments): main.js hands the worker's messages to the update functions
// below; its `card` (web/cards.js, at the end) says what a model's life does to it, and draws it with renderExperiments.
import { BLUE, GREEN, node as el, RED, rgba, shown, top5Table, withTestid as testid } from "/web/panels.js";
import { drawHeatmap, drawLines, heatmapSize, linesHeight, MONO, sheet, textWidth } from "/web/pictures.js";

const $ = (id) => document.getElementById(id);
const KINDS = ["ablate", "patch", "steer", "attribute"];
const SITES = { resid: "residual", attn: "attention output", mlp: "MLP hidden" };
const TITLES = { ablate: "Ablation", patch: "Activation patching", steer: "Steering", attribute: "Direct logit attribution" };
const TOKENS_DEBOUNCE_MS = 250;      // the patching prompts are tokenized this long after the last key
const NUMBERS_UP_TO = 24;            // heatmaps of at most this many columns write each cell's value in it
const DARK = 0.6;                    // a cell's text turns white on shades more opaque than this

// ---- the card's state: store.experiments --------------------------------------------------------------------------
// What a new run of any kind empties.
const NO_RUN = {
  plan: null,         // "experiment-plan": {kind, runs, seconds_per_run, estimate_s, ask, ask_s, fit_layers, fit_runs}
  progress: null,     // the last "experiment-progress": {done, total, seconds, eta_s}
  replies: null,      // steering, while it streams: {steered: text, plain: text}
  error: null,
};

export function freshExperiments() {
  return {
    tab: "ablate",
    seq: 0,             // the newest run asked for; messages of older ones are dropped
    busy: null,         // the kind that runs, or null
    sent: null,         // the inputs of the newest run, kept with its result (the export says what made it)
    ...NO_RUN,
    results: { ablate: null, patch: null, steer: null, attribute: null },   // each kind's last "experiment-result"
    tokens: { clean: null, corrupt: null },    // the patching prompts' pieces ("experiment-tokens")
    tokSeq: 0,
    expanded: new Set(),        // attribution: the layers whose heads are shown
    wiped: null,        // the experiments' buffers in the last Forget report: {buffers, before, after, labels}
    seen: null,         // the selection last followed: {pos, layer, head}
  };
}

const mine = (s, m) => m.seq === s.seq;

export function experimentPlan(s, m) {
  if (!mine(s, m)) return;
  s.plan = m;
  if (m.ask) s.busy = null;         // nothing runs until the user says so
}

export function experimentProgress(s, m) {
  if (mine(s, m)) s.progress = m;
}

export function experimentToken(s, m) {
  if (mine(s, m) && s.replies) s.replies[m.which] += m.piece;
}

export function experimentResult(s, m) {
  if (!mine(s, m)) return;
  s.busy = null;
  s.results[m.kind] = { ...m.result, pieces: m.pieces, inputs: s.sent };
  s.replies = null;
  if (m.kind === "attribute") s.expanded = new Set();
}

export function experimentTokens(s, m) {
  if (m.seq === s.tokSeq) s.tokens = m.tokens;
}

export function experimentFailed(s, m) {
  if (m.seq != null && m.seq !== s.seq) return;
  s.busy = null;
  s.error = m.message;
}

// Forget's report: the experiments' own buffers, as read back before and after the wipe.
const OWN = ["experiment.", "intervene."];
export function experimentsForgotten(s, report) {
  const items = report.items.filter((i) => OWN.some((p) => i.label.startsWith(p)));
  const sum = (key) => items.reduce((a, i) => a + i[key], 0);
  s.wiped = items.length
    ? { buffers: items.length, before: sum("before"), after: sum("after"), labels: items.map((i) => i.label) } : null;
}

// Forget, a new model, a lost GPU: what runs is stopped and its remaining messages dropped; the results go (they are
// the user's prompts run through that model), and with Forget (`typed`) the prompts typed into the card too.
export function dropExperiments(s, worker, typed = false) {
  if (s.busy) worker.postMessage({ type: "stop" });
  s.seq++;
  s.tokSeq++;
  Object.assign(s, NO_RUN, { busy: null, results: { ablate: null, patch: null, steer: null, attribute: null },
                             tokens: { clean: null, corrupt: null }, expanded: new Set() });
  if (typed) {
    for (const e of document.querySelectorAll("#experiments input[type=text], #experiments textarea")) {
      e.value = e.defaultValue;
    }
  }
}

// ---- events -------------------------------------------------------------------------------------------------------
const idle = (store) => store.loaded && !store.generating && !store.experiments.busy;
const value = (id) => $(id).value;

// The inputs of the tab's experiment, as lab/worker/experiments.py reads them (token fields keep their spaces).
function inputs(kind) {
  if (kind === "ablate") {
    return { prompt: value("exp-ab-prompt"), target: value("exp-ab-target"), what: value("exp-ab-what"),
             layers: value("exp-ab-layers"), heads: value("exp-ab-heads"), mode: value("exp-ab-mode") };
  }
  if (kind === "patch") {
    return { clean: value("exp-pa-clean"), corrupt: value("exp-pa-corrupt"), target: value("exp-pa-target"),
             foil: value("exp-pa-foil"), site: value("exp-pa-site"), layers: value("exp-pa-layers") };
  }
  if (kind === "steer") {
    return { plus: value("exp-st-plus"), minus: value("exp-st-minus"), layer: value("exp-st-layer"),
             scale: value("exp-st-scale"), prompt: value("exp-st-prompt"), chat: $("exp-st-chat").checked,
             max_new: Number(value("exp-st-n")) };
  }
  return { prompt: value("exp-at-prompt"), target: value("exp-at-target") };
}

// The patching prompts' token counts differ: the run is refused before it starts, and the card says why.
function lengthProblem(s) {
  const { clean, corrupt } = s.tokens;
  if (!clean || !corrupt || !clean.length || !corrupt.length || clean.length === corrupt.length) return null;
  return `the clean prompt is ${clean.length} tokens and the corrupted one ${corrupt.length}: patching carries each `
    + "position to the same position, so the lengths must match; reword one (the tokens are shown under each)";
}

// confirm: the user said go after the plan asked (the plan's own kind runs, whichever tab is shown)
function start(store, worker, rerender, sampling, confirm = false) {
  const s = store.experiments;
  if (confirm && s.plan) s.tab = s.plan.kind;
  const kind = s.tab;
  if (!idle(store) || (kind === "patch" && lengthProblem(s))) return;
  const body = { kind, ...inputs(kind) };
  if (kind === "steer") body.settings = sampling().settings;
  Object.assign(s, NO_RUN, { busy: kind, sent: body, replies: kind === "steer" ? { steered: "", plain: "" } : null });
  worker.postMessage({ type: "experiment", ...body, confirm, seq: ++s.seq });
  rerender();
}

function stop(store, worker) {
  if (store.experiments.busy) worker.postMessage({ type: "stop" });
}

let tokenTimer = null;
function tokenize(store, worker) {
  clearTimeout(tokenTimer);
  tokenTimer = setTimeout(() => {
    if (!store.loaded) return;
    const s = store.experiments;
    worker.postMessage({ type: "experiment-tokens", texts: { clean: value("exp-pa-clean"), corrupt: value("exp-pa-corrupt") },
                         seq: ++s.tokSeq });
  }, TOKENS_DEBOUNCE_MS);
}

// actions.selectHead(layer, head): the panels' layer and head (main.js's store.attn), chosen from this card.
export function wireExperiments(store, worker, rerender, sampling, actions) {
  for (const b of document.querySelectorAll("#experiments [data-tab]")) {
    b.addEventListener("click", () => { store.experiments.tab = b.dataset.tab; rerender(); });
  }
  $("exp-run").addEventListener("click", () => start(store, worker, rerender, sampling));
  $("exp-stop").addEventListener("click", () => stop(store, worker));
  $("exp-anyway").addEventListener("click", () => start(store, worker, rerender, sampling, true));
  $("exp-limit").addEventListener("click", () => {
    const p = store.experiments.plan;
    if (!p || !p.fit_layers) return;
    $(p.kind === "ablate" ? "exp-ab-layers" : "exp-pa-layers").value = ranges(p.fit_layers);
    start(store, worker, rerender, sampling, true);
  });
  for (const id of ["exp-pa-clean", "exp-pa-corrupt"]) $(id).addEventListener("input", () => tokenize(store, worker));
  $("exp-result").addEventListener("click", (e) => {
    const cell = e.target.closest("[data-select-layer]");
    if (cell) {
      actions.selectHead(Number(cell.dataset.selectLayer), Number(cell.dataset.selectHead ?? store.attn.head));
      return;
    }
    const row = e.target.closest("[data-expand]");
    if (!row) return;
    const x = store.experiments.expanded, l = Number(row.dataset.expand);
    if (x.has(l)) x.delete(l); else x.add(l);
    rerender();
  });
}

// The model was loaded: the steering layer starts in the middle, where directions like sentiment are usually
// readable. The patching prompts' tokens are asked for when the card is open (its `opened` hook), not by a folded card.
export function experimentsLoaded(store) {
  const n = store.loaded.kv.n_layer;
  $("exp-st-layer").max = String(n - 1);
  $("exp-st-layer").value = String(Math.floor(n / 2));
}

// [0, 1, 2, 3, 7] -> "0-3, 7"
function ranges(xs) {
  const out = [];
  for (let i = 0; i < xs.length; i++) {
    let j = i;
    while (j + 1 < xs.length && xs[j + 1] === xs[j] + 1) j++;
    out.push(j > i ? `${xs[i]}-${xs[j]}` : String(xs[i]));
    i = j;
  }
  return out.join(", ");
}

// ---- following the page's selection --------------------------------------------------------------------------------
// Inputs change only when the selection does (not on every render), so what the user typed stays until they click.
function follow(store) {
  const s = store.experiments;
  const now = { pos: store.selected, layer: store.attn.layer, head: store.attn.head };
  const was = s.seen;
  s.seen = now;
  if (!was || !store.loaded) return;
  if (now.pos !== was.pos && now.pos != null && store.context[now.pos]) {
    for (const id of ["exp-ab-target", "exp-pa-target", "exp-at-target"]) $(id).value = `#${store.context[now.pos].id}`;
  }
  if (now.layer !== was.layer || now.head !== was.head) {
    $("exp-ab-layers").value = String(now.layer);
    if (value("exp-ab-what") === "heads") $("exp-ab-heads").value = String(now.head);
    $("exp-st-layer").value = String(now.layer);
  }
}

// ---- rendering ----------------------------------------------------------------------------------------------------
const secs = (x) => (x < 1 ? `${(x * 1000).toFixed(0)} ms` : x < 10 ? `${x.toFixed(1)} s`
  : x < 120 ? `${x.toFixed(0)} s` : `${(x / 60).toFixed(1)} min`);
const signed = (x, d = 3) => (x >= 0 ? "+" : "−") + Math.abs(x).toFixed(d);
const piece = (r, id) => shown(r.pieces[String(id)]);

// A diverging shade: red for positive, blue for negative, full at |v| = scale.
const shade = (v, scale) => ({ colour: v >= 0 ? RED : BLUE, alpha: Math.min(1, Math.abs(v) / (scale || 1)) });

function legend(scale, neg, pos) {
  const box = testid(el("div", "exp-legend"), "exp-legend");
  box.dataset.scale = scale;
  const bar = el("span", "exp-legend-bar");
  bar.style.background = `linear-gradient(to right, ${rgba(BLUE, 1)}, #fff, ${rgba(RED, 1)})`;
  box.append(el("span", null, `${signed(-scale, 2)} ${neg}`), bar, el("span", null, `${signed(scale, 2)} ${pos}`));
  return box;
}

// The heatmap: a corner, column labels, then per row a label and its cells. cell(r, c) -> {value, title, data}.
function grid({ corner, cols, rows, cell, scale, vertical, select }) {
  const numbers = cols.length <= NUMBERS_UP_TO;
  const g = testid(el("div", `exp-grid${vertical ? " vertical" : ""}${numbers ? " numbers" : ""}`), "exp-heatmap");
  g.style.gridTemplateColumns = `max-content repeat(${cols.length}, var(--exp-cell))`;
  g.dataset.rows = rows.length;
  g.dataset.cols = cols.length;
  g.append(el("div", "corner", corner), ...cols.map((c) => el("div", "klabel", c)));
  rows.forEach((label, r) => {
    g.append(el("div", "qlabel", label));
    for (let c = 0; c < cols.length; c++) {
      const { value: v, title, data } = cell(r, c);
      const e = testid(el("div", "exp-cell"), "exp-cell");
      Object.assign(e.dataset, data);
      e.title = title;
      if (v == null) e.classList.add("masked");
      else {
        e.dataset.value = v;
        const { colour, alpha } = shade(v, scale);
        e.style.background = rgba(colour, alpha);
        if (numbers) {
          e.textContent = v.toFixed(2);
          if (alpha > DARK) e.classList.add("dark");
        }
      }
      if (select) Object.assign(e.dataset, select(r, c));
      g.append(e);
    }
  });
  return g;
}

// Ablation's layers (rows) and units (columns: heads, or the one block) as the sweep made them.
function ablationAxes(r) {
  const layers = [...new Set(r.rows.map((x) => x.layer))];
  const heads = r.rows[0] && r.rows[0].head != null ? [...new Set(r.rows.map((x) => x.head))] : [null];
  const at = new Map(r.rows.map((x) => [`${x.layer} ${x.head}`, x]));
  return { layers, heads, at };
}

function renderAblation(r) {
  const { layers, heads, at } = ablationAxes(r);
  let scale = 0;
  for (const x of r.rows) scale = Math.max(scale, Math.abs(x.delta));
  const block = heads[0] == null;
  const out = [el("p", "exp-summary",
    `log p(${piece(r, r.target_id)}) = ${r.base_logprob.toFixed(3)} without ablation; ${r.rows.length} `
    + `${block ? `${r.what} block${r.rows.length > 1 ? "s" : ""}` : `head${r.rows.length > 1 ? "s" : ""}`} `
    + `${r.mode}-ablated one at a time, in ${secs(r.seconds)}`
    + (r.stopped ? "; stopped: the cells not run are grey" : ""))];
  out[0].dataset.base = r.base_logprob;
  out.push(legend(scale, "the target loses", "the target gains"));
  out.push(grid({
    corner: block ? "layer" : "layer ↓ head →", cols: heads.map((h) => (h == null ? r.what : String(h))),
    rows: layers.map((l) => `L${l}`), scale,
    cell: (ri, c) => {
      const x = at.get(`${layers[ri]} ${heads[c]}`);
      return { value: x ? x.delta : null, data: { layer: layers[ri], head: heads[c] ?? "" },
               title: x ? `layer ${x.layer}${x.head == null ? "" : ` head ${x.head}`}: log p ${x.logprob.toFixed(3)} `
                 + `(${signed(x.delta)}); click: this head in the panels` : "not run" };
    },
    select: block ? null : (ri, c) => ({ selectLayer: layers[ri], selectHead: heads[c] }),
  }));
  if (r.top5_after) out.push(el("h3", null, "Top 5 next tokens before and after"),
    top5Table({ before: r.top5_before, after: r.top5_after, heads: ["before", "after"], text: (id) => piece(r, id),
      id: "exp-top5", mark: (id) => (id != null && id === r.target_id ? "exp-target" : null) }));
  else out.push(el("p", "muted hint", "Run one head or one block (a layer and a head) to see the top 5 before and after."));
  return out;
}

function renderPatching(r) {
  let clamp = 0;
  for (const row of r.recovery) for (const v of row) if (v != null) clamp = Math.max(clamp, Math.abs(v));
  const scale = Math.max(1, clamp);
  const head = el("p", "exp-summary",
    `logit(${piece(r, r.target_id)}) − logit(${piece(r, r.foil_id)}): clean ${signed(r.clean_diff, 2)}, corrupted `
    + `${signed(r.corrupt_diff, 2)}; the ${SITES[r.site]} patched at each (layer, position): ${r.runs} cells in `
    + `${secs(r.seconds)}`
    + (r.stopped ? "; stopped: the cells not run are grey" : ""));
  const out = [head];
  if (r.sanity) {
    // the built-in check: the last layer's residual patched at every position is the clean run, so its difference
    // must be the clean one exactly
    const ok = testid(el("p", r.sanity.exact ? "exp-sanity good" : "exp-sanity bad",
      `check: the last layer's residual patched at every position gives ${signed(r.sanity.diff, 4)}, the clean run's `
      + `${signed(r.sanity.clean_diff, 4)}: ${r.sanity.exact ? "exactly equal" : "NOT equal"}`), "exp-sanity");
    ok.dataset.exact = r.sanity.exact;
    out.push(ok);
  }
  return [...out, legend(scale, "away from the clean answer", "the clean answer restored (1 = all of it)"),
    grid({
      corner: "layer ↓", cols: r.positions.map(shown), rows: r.layers.map((l) => `L${l}`), scale, vertical: true,
      cell: (ri, c) => {
        const v = r.recovery[ri][c];
        return { value: v, data: { layer: r.layers[ri], pos: c },
                 title: v == null ? "not run" : `layer ${r.layers[ri]}, position ${c} ${shown(r.positions[c])}: `
                   + `recovery ${v.toFixed(3)}` };
      },
    })];
}

// One diverging bar: the value from the middle, right when positive, left when negative; full at |v| = scale.
function bar(v, scale, colour) {
  const track = el("span", "exp-track");
  const b = el("span", "exp-bar");
  const w = (50 * Math.min(1, Math.abs(v) / (scale || 1))).toFixed(2);
  b.style.width = `${w}%`;
  b.style.left = v >= 0 ? "50%" : `${50 - w}%`;
  b.style.background = rgba(colour, 0.85);
  track.append(b);
  return track;
}

function barRow(label, parts, scale, props = {}) {
  const row = testid(el("div", "exp-bar-row"), props.testid || "exp-attr-row");
  Object.assign(row.dataset, props.data || {});
  row.append(el("span", "exp-bar-label", label));
  for (const [v, colour, what] of parts) {
    const cell = el("span", "exp-bar-cell");
    cell.title = `${what} ${signed(v, 4)}`;
    cell.append(bar(v, scale, colour), el("span", "exp-bar-value", signed(v, 2)));
    row.append(cell);
  }
  return row;
}

function renderAttribution(r) {
  let scale = Math.abs(r.embedding);
  for (const x of r.rows) scale = Math.max(scale, Math.abs(x.attn), Math.abs(x.mlp));
  const total = r.embedding + r.rows.reduce((a, x) => a + x.attn + x.mlp, 0) + r.remainder;
  const sum = testid(el("p", "exp-summary",
    `logit(${piece(r, r.target_id)}) = ${r.logit.toFixed(3)} = embedding ${signed(r.embedding, 2)} + attention `
    + `${signed(r.rows.reduce((a, x) => a + x.attn, 0), 2)} + MLP ${signed(r.rows.reduce((a, x) => a + x.mlp, 0), 2)} `
    + `+ remainder ${signed(r.remainder, 4)}`), "exp-attr-sum");
  Object.assign(sum.dataset, { logit: r.logit, total });
  const key = el("p", "muted hint");
  const sw = (c) => { const s = el("span", "swatch"); s.style.background = rgba(c, 0.85); return s; };
  key.append(sw(BLUE), " attention  ", sw(GREEN), " MLP  ", sw(RED), " embedding, remainder · bars from the middle: "
    + "right adds to the logit, left takes away · click a layer for its heads");
  const header = el("div", "exp-bar-row exp-bar-head");
  header.append(el("span", null, ""), el("span", null, "attention"), el("span", null, "MLP"));
  const rows = [barRow("embedding", [[r.embedding, RED, "embedding"]], scale, { data: { layer: -1 } })];
  for (const x of r.rows) {
    const open = r.expandedSet.has(x.layer);
    const row = barRow(`${open ? "▾" : "▸"} L${x.layer}`, [[x.attn, BLUE, "attention"], [x.mlp, GREEN, "MLP"]], scale,
      { data: { layer: x.layer, attn: x.attn, mlp: x.mlp, expand: x.layer } });
    rows.push(row);
    if (open) {
      x.heads.forEach((v, h) => rows.push(barRow(`   head ${h}`, [[v, BLUE, `layer ${x.layer} head ${h}`]], scale,
        { testid: "exp-attr-head", data: { layer: x.layer, head: h, value: v, selectLayer: x.layer, selectHead: h } })));
    }
  }
  rows.push(barRow("remainder", [[r.remainder, RED, "remainder"]], scale, { data: { layer: "remainder" } }));
  const bars = testid(el("div", "exp-bars"), "exp-attr-bars");
  bars.append(header, ...rows);
  return [sum, key, bars];
}

function renderSteering(s) {
  const r = s.results.steer, live = s.busy === "steer" ? s.replies : null;
  const text = (w) => (live ? live[w] : r && r[w] ? r[w].text : "");
  const box = testid(el("div", "exp-replies"), "exp-replies");
  box.dataset.state = live ? "streaming" : r ? "done" : "";
  const side = (which, title) => {
    const a = testid(el("article"), `exp-reply-${which}`);
    const meta = r && r[which] ? `${r[which].ids.length} tokens (${r[which].stop})` : "";
    a.append(el("h3", null, title), testid(el("div", "exp-reply", text(which)), `exp-${which}-text`), el("p", "muted", meta));
    return a;
  };
  const layer = r ? r.layer : value("exp-st-layer"), scale = r ? r.scale : value("exp-st-scale");
  box.append(side("steered", `Steered: + ${scale} × v after layer ${layer}`), side("plain", "Unsteered, the same seed"));
  const out = [];
  if (r) {
    out.push(el("p", "exp-summary", `v = mean residual after layer ${r.layer} over ${r.n_plus} "plus" prompt(s) − the `
      + `same over ${r.n_minus} "minus" prompt(s): ‖v‖ = ${r.vector_norm.toFixed(3)}; seed ${r.seed}`));
  }
  out.push(box);
  return out;
}

function renderTokens(s) {
  for (const which of ["clean", "corrupt"]) {
    const pieces = s.tokens[which], line = $(`exp-pa-${which}-tokens`);
    line.replaceChildren(...(pieces || []).map((p) => el("span", "tok", shown(p))));
    line.dataset.count = pieces ? pieces.length : "";
    $(`exp-pa-${which}-count`).textContent = pieces ? `${pieces.length} tokens` : "";
  }
  const problem = lengthProblem(s), line = $("exp-pa-lengths");
  line.hidden = !problem;
  line.textContent = problem || "";
}

// The plan line: the estimate before a sweep; when it asks, why and the ways on.
function renderPlan(s, here) {
  const p = here ? s.plan : null, line = $("exp-plan");
  $("exp-ask").hidden = !(p && p.ask);
  line.dataset.state = !p ? "" : p.ask ? "ask" : "running";
  if (!p) { line.textContent = ""; return; }
  Object.assign(line.dataset, { runs: p.runs, estimate: p.estimate_s, perRun: p.seconds_per_run });
  const est = `${p.runs} run${p.runs > 1 ? "s" : ""} × ${secs(p.seconds_per_run)} (one run, timed now) = about `
    + secs(p.estimate_s);
  if (!p.ask) {
    line.textContent = p.kind === "steer" ? `${est}, then the two replies token by token.` : `${est}.`;
    return;
  }
  line.textContent = `${est}: longer than ${secs(p.ask_s)}${p.slow ? " on this adapter (the GPU is emulated on the CPU)" : ""}`
    + ". Run it anyway, or limit the sweep" + (p.fit_layers ? ` to layers ${ranges(p.fit_layers)} (${p.fit_runs} runs, `
    + `about ${secs(p.fit_runs * p.seconds_per_run)})` : ": even one layer is longer; choose fewer heads") + ".";
  $("exp-limit").hidden = !p.fit_layers;
  $("exp-limit").textContent = p.fit_layers ? `Limit to layers ${ranges(p.fit_layers)}` : "";
}

function renderProgress(s, here) {
  const p = here ? s.progress : null, running = here && !!s.busy;
  $("exp-progress-row").hidden = !running && !p;
  $("exp-bar").value = p && p.total ? p.done / p.total : 0;
  const t = $("exp-progress-text");
  t.dataset.done = p ? p.done : "";
  t.dataset.total = p ? p.total : "";
  t.textContent = !p ? "starting…" : `${p.done} / ${p.total} runs of the sweep`
    + (p.done === p.total || !running ? ` in ${secs(p.seconds)}` : p.eta_s == null ? "" : `, about ${secs(p.eta_s)} left`);
}

function status(store) {
  const s = store.experiments;
  if (!store.loaded) return { state: "idle", text: "load a model first" };
  if (s.busy) return { state: "running", text: s.plan ? `${TITLES[s.busy]}: running…` : "timing one run…" };
  if (s.error) return { state: "error", text: s.error };
  if (s.plan && s.plan.ask) return { state: "ask", text: "waiting: run anyway, or limit the sweep" };
  const r = s.results[s.tab];
  return r ? { state: "done", text: `${TITLES[s.tab]}: done` } : { state: "idle", text: "" };
}

function renderWiped(s) {
  const w = s.wiped, line = $("exp-wiped");
  line.hidden = !w;
  line.dataset.before = w ? w.before : "";
  line.dataset.after = w ? w.after : "";
  line.dataset.state = !w ? "" : w.after ? "failed" : "wiped";
  line.textContent = !w ? "" : w.after
    ? `Forget did NOT wipe the experiments' buffers: ${w.after} non-zero words remain`
    : `Forget wiped the experiments' buffers: ${w.before.toLocaleString("en")} non-zero words in ${w.buffers} buffers `
      + `(${w.labels.join(", ")}) read back as zero.`;
}

function renderResult(s) {
  const box = $("exp-result"), r = s.results[s.tab], open = [...s.expanded].join();
  // rebuilt when what it shows changes, not on every render (steering's replies change with every token)
  if (s.tab !== "steer" && box.shows && box.shows.tab === s.tab && box.shows.r === r && box.shows.open === open) return;
  box.shows = { tab: s.tab, r, open };
  box.dataset.kind = s.tab;
  if (s.tab === "steer") { box.replaceChildren(...renderSteering(s)); return; }
  if (!r) { box.replaceChildren(); return; }
  if (s.tab === "ablate") box.replaceChildren(...renderAblation(r));
  else if (s.tab === "patch") box.replaceChildren(...renderPatching(r));
  else box.replaceChildren(...renderAttribution({ ...r, expandedSet: s.expanded }));
}

export function renderExperiments(store) {
  const s = store.experiments;
  follow(store);
  for (const b of document.querySelectorAll("#experiments [data-tab]")) {
    const on = b.dataset.tab === s.tab;
    b.setAttribute("aria-selected", String(on));
    b.classList.toggle("active", on);
  }
  for (const pane of document.querySelectorAll("#experiments [data-pane]")) pane.hidden = pane.dataset.pane !== s.tab;
  const blocked = s.tab === "patch" && lengthProblem(s);
  $("exp-run").disabled = !idle(store) || !!blocked;
  $("exp-run").textContent = `Run ${TITLES[s.tab].toLowerCase()}`;
  $("exp-stop").disabled = !s.busy;
  $("exp-anyway").disabled = $("exp-limit").disabled = !idle(store);
  const st = status(store), line = $("exp-status");
  line.dataset.state = st.state;
  line.textContent = st.text;
  renderTokens(s);
  const here = !!s.sent && s.sent.kind === s.tab;      // the plan and progress shown are of this tab's experiment
  renderPlan(s, here);
  renderProgress(s, here);
  renderResult(s);
  renderWiped(s);
}

// ---- folded: the last experiment's number in one line (web/navigator.js) ------------------------------------------
export function experimentsLine(store) {
  const s = store.experiments, kind = s.sent ? s.sent.kind : null, r = kind && s.results[kind];
  if (s.busy) return `${TITLES[s.busy]}: running…`;
  if (!r) return "no experiment run yet";
  if (kind === "ablate") {
    const top = r.rows.reduce((a, x) => (Math.abs(x.delta) > Math.abs(a.delta) ? x : a), r.rows[0]);
    return top ? `Ablation: largest Δ log p(${piece(r, r.target_id)}) ${signed(top.delta, 3)} at layer ${top.layer}`
      + (top.head != null ? ` head ${top.head}` : ` (${r.what})`) : "Ablation: no cell run";
  }
  if (kind === "patch") {
    let best = null;
    r.recovery.forEach((row, ri) => row.forEach((v, c) => {
      if (v != null && (!best || v > best.v)) best = { v, layer: r.layers[ri], pos: c };
    }));
    return best ? `Patching: most recovered ${best.v.toFixed(3)} at layer ${best.layer}, position ${best.pos} `
      + shown(r.positions[best.pos]) : "Patching: no cell run";
  }
  if (kind === "steer") return `Steering: + ${r.scale} × v after layer ${r.layer}, ‖v‖ = ${r.vector_norm.toFixed(3)}`;
  return `Attribution: logit(${piece(r, r.target_id)}) = ${r.logit.toFixed(3)}`;
}

// ---- export: the shown tab's result as JSON, its picture as PNG ------------------------------------------------------
export function experimentsData(store) {
  const s = store.experiments, r = s.results[s.tab];
  if (!r) return null;
  const { pieces, inputs: sent, ...result } = r;
  return { card: "experiments", experiment: s.tab, model: store.model ? store.model.file_name : null, inputs: sent,
           result, pieces };
}

function wrap(text, width) {
  const lines = [];
  for (const para of text.split("\n")) {
    let line = "";
    for (const word of para.split(" ")) {
      if (line && textWidth([`${line} ${word}`], MONO) > width) { lines.push(line); line = word; }
      else line = line ? `${line} ${word}` : word;
    }
    lines.push(line);
  }
  return lines;
}

export function drawExperiments(canvas, store) {
  const s = store.experiments, r = s.results[s.tab];
  if (s.tab === "ablate" || s.tab === "patch") {
    const abl = s.tab === "ablate";
    const axes = abl ? ablationAxes(r) : null;
    const values = abl ? axes.layers.map((l) => axes.heads.map((h) => axes.at.get(`${l} ${h}`)?.delta ?? null))
      : r.recovery;
    let scale = 0;
    for (const row of values) for (const v of row) if (v != null) scale = Math.max(scale, Math.abs(v));
    if (!abl) scale = Math.max(1, scale);
    const spec = {
      cols: abl ? axes.heads.map((h) => (h == null ? r.what : `h${h}`)) : r.positions.map(shown),
      rows: (abl ? axes.layers : r.layers).map((l) => `L${l}`), cellW: 40, cellH: 16,
      vertical: !abl, colour: (ri, c) => ((values[ri][c] ?? 0) >= 0 ? RED : BLUE),
      alpha: (ri, c) => (values[ri][c] == null ? null : Math.min(1, Math.abs(values[ri][c]) / (scale || 1))),
      text: values[0].length <= NUMBERS_UP_TO ? (ri, c) => (values[ri][c] == null ? "" : values[ri][c].toFixed(2)) : null,
    };
    const size = heatmapSize(spec);
    const title = abl ? `Ablation: Δ log p(${piece(r, r.target_id)}), ${r.mode} ablation`
      : `Activation patching (${r.site}): recovery of logit(${piece(r, r.target_id)}) − logit(${piece(r, r.foil_id)})`;
    const note = abl ? `base log p ${r.base_logprob.toFixed(3)}; red: the target gains, blue: it loses, full colour at `
      + `|Δ| = ${scale.toFixed(3)}; grey: not run` : `clean ${signed(r.clean_diff, 2)}, corrupted ${signed(r.corrupt_diff, 2)}; `
      + `red 1: the clean answer restored, white 0: no effect, blue: away; full colour at ${scale.toFixed(2)}`;
    const prompt = abl ? `prompt: ${r.prompt.map(shown).join(" ")}` : `corrupted: ${r.corrupt.map(shown).join(" ")}`;
    const ctx = sheet(canvas, size.width, size.height, title, [note, prompt]);
    drawHeatmap(ctx, 0, spec);
    return;
  }
  if (s.tab === "attribute") {
    const rows = [["embedding", r.embedding, null], ...r.rows.flatMap((x) => [[`L${x.layer} attn`, x.attn, BLUE],
      [`L${x.layer} mlp`, x.mlp, GREEN]]), ["remainder", r.remainder, null]];
    let scale = 0;
    for (const [, v] of rows) scale = Math.max(scale, Math.abs(v));
    const W = 560, h = 14, left = textWidth(rows.map((x) => x[0]), MONO) + 8, right = 60, mid = left + (W - left - right) / 2;
    const ctx = sheet(canvas, W, rows.length * h, `Direct logit attribution: logit(${piece(r, r.target_id)}) = ${r.logit.toFixed(3)}`,
      [`the shares of the embedding, each block and the remainder sum to the logit; full bar at |${scale.toFixed(2)}|`]);
    ctx.font = MONO;
    ctx.textBaseline = "middle";
    rows.forEach(([label, v, colour], i) => {
      const y = i * h, w = ((W - left - right) / 2) * (Math.abs(v) / (scale || 1));
      ctx.fillStyle = "#1d2330";
      ctx.textAlign = "right";
      ctx.fillText(label, left - 6, y + h / 2);
      ctx.fillStyle = rgba(colour || RED, 0.85);
      ctx.fillRect(v >= 0 ? mid : mid - w, y + 2, w, h - 4);
      ctx.fillStyle = "#1d2330";
      ctx.fillText(signed(v, 2), W, y + h / 2);
    });
    ctx.fillStyle = "#5d6679";
    ctx.fillRect(mid, 0, 1, rows.length * h);
    return;
  }
  const W = 360;
  const a = wrap(r.steered ? r.steered.text : "", W), b = wrap(r.plain ? r.plain.text : "", W);
  const n = Math.max(a.length, b.length) + 2;
  const ctx = sheet(canvas, 2 * W + 20, linesHeight(n), `Steering: + ${r.scale} × v after layer ${r.layer}`,
    [`‖v‖ = ${r.vector_norm.toFixed(3)} (${r.n_plus} plus, ${r.n_minus} minus prompts); both replies seed ${r.seed}`]);
  drawLines(ctx, 0, ["steered", "", ...a]);
  ctx.translate(W + 20, 0);
  drawLines(ctx, 0, ["unsteered", "", ...b]);
}

// ---- its place in the page (web/cards.js): a new chat, another file and a lost GPU drop the results (the worker's
// new chat wipes and closes the runs they were read from: docs/privacy.md); Forget drops them and the prompts typed,
// and its report says whether the card's buffers read back as zero.
export const card = {
  key: "experiments",
  fresh: freshExperiments,
  render: renderExperiments,
  wire: (store, worker, page) => wireExperiments(store, worker, page.render, page.sampling,
    { selectHead: page.selectHead }),
  exports: (store, register) => register("experiments", { data: () => experimentsData(store),
                                                          draw: (canvas) => drawExperiments(canvas, store) }),
  loaded: (store) => experimentsLoaded(store),
  opened: (store, worker) => tokenize(store, worker),
  summary: experimentsLine,
  cleared: (store, worker) => dropExperiments(store.experiments, worker),
  forgetting: (store, worker) => dropExperiments(store.experiments, worker, true),
  forgotten: (store, report) => experimentsForgotten(store.experiments, report),
};
