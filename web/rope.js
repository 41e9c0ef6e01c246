// The RoPE demo card. Two parts:
// 1. The relative-position identity, on random vectors: rotate q at position m and k at n, and the same pair at
//    m + s, n + s; q·k is the same for every shift s, and changes when m − n does. All of it computed here.
// 2. A real head: the worker (lab/worker/rope.py, lab/instruments/probes.py rope_inputs) hands back one layer's q at the
//    selected position and its k at every earlier one, before RoPE, plus the engine's own attention probabilities of
//    that query. This card rotates them with both pairings and shows both score rows next to the engine's: the
//    model's pairing reproduces the engine's row (a check mark, within MATCH_TOL), the other one does not.
// Its state is store.rope (freshRope): main.js hands the worker's "rope" messages and "probe-rope" errors to
// ropeAnswer and ropeFailed; its `card` (web/cards.js) runs dropRope whenever the conversation is dropped (Forget, new
// chat, a new model: the q and k it holds come from the conversation), and renderRope on every render.
import { BLUE, el, fillSelect, noRopeStep, rgba, selectedPos, shown } from "/web/panels.js";
import { drawHeatmap, drawLines, heatmapSize, linesHeight, MONO, sheet, textWidth } from "/web/pictures.js";

const $ = (id) => document.getElementById(id);
const range = (n) => Array.from({ length: n }, (_, i) => i);

// llama.cpp's two rope modes. A llama GGUF pairs adjacent dims: HF's llama checkpoints rotate halves, and
// convert_hf_to_gguf.py permutes the rows of Q and K so the file's heads pair (2i, 2i+1), rope mode 0 ("normal").
// Qwen2, Gemma 3 (and phi3, gemma2, qwen3) keep halves: mode 2, NeoX (llama_model_rope_type in llama.cpp).
export const PAIRINGS = {
  adjacent: { name: "adjacent pairs", pairs: "(x₂ᵢ, x₂ᵢ₊₁)", who: "llama.cpp rope mode 0, llama GGUFs" },
  neox: { name: "halves (NeoX)", pairs: "(xᵢ, xᵢ₊d/2)", who: "llama.cpp rope mode 2, Qwen2 and Gemma 3" },
};
const other = (pairing) => (pairing === "neox" ? "adjacent" : "neox");

// The page redoes the engine's scores in float64 from the engine's own f32 q and k; the engine runs f32 (its own
// cos/sin within 5.4e-7, f32 dot products and softmax, SwiftShader's exp), and the K of cached positions came from
// the chat's steps, not this replay. The error grows with the scores: measured 2.3e-7 for SmolLM2 in Chromium, up to
// 3.3e-5 natively for Qwen2.5's layer 0, whose scores reach 950. The wrong pairing moves a layer's rows by 0.05 to
// 0.95 at most over its heads (single heads sometimes by 1e-3 only; tests/engine/test_rope_probe.py prints them).
export const MATCH_TOL = 1e-4;
const IDENTITY_RTOL = 1e-9;      // float64: |q·k(m+s, n+s) − q·k(m, n)| / (|q||k|), angles up to 1e4 rad lose ~1e-12
const SHIFTS = [0, 1, 10, 100, 1000, 10000];
const KEYS_SHOWN = 48;           // key columns drawn; earlier keys are summed into one column (as the attention panel)

// ---- the math: the card computes with these; nothing here knows the page -------------------------------------------
// θᵢ = scale · base^(−2i/n_rot) / factorᵢ, i < n_rot/2 (lab/ops/rope.py frequencies, in float64 as there).
export function thetas(nRot, base, scale = 1, factors = null) {
  return Float64Array.from({ length: nRot / 2 }, (_, i) => (scale * base ** (-2 * i / nRot)) / (factors ? factors[i] : 1));
}

// The two dims pair i rotates.
export function pairOf(pairing, i, half) {
  return pairing === "neox" ? [i, i + half] : [2 * i, 2 * i + 1];
}

// x rotated to position pos: pair i turns by pos·θᵢ; dims past 2·θ.length pass through.
export function rotate(x, pos, th, pairing) {
  const out = Float64Array.from(x);
  const half = th.length;
  for (let i = 0; i < half; i++) {
    const [a, b] = pairOf(pairing, i, half);
    const c = Math.cos(pos * th[i]), s = Math.sin(pos * th[i]);
    out[a] = x[a] * c - x[b] * s;
    out[b] = x[a] * s + x[b] * c;
  }
  return out;
}

export function dot(a, b) {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}

// softmax over keys 0 .. pos of scale · q·k (soft-capped; keys outside a sliding window masked), q at pos, key j at j.
export function scoreRow(q, keys, pos, th, pairing, { scale, softcap = 0, window = 0 }) {
  const qr = rotate(q, pos, th, pairing);
  const s = keys.map((k, j) => {
    if (window && pos - j >= window) return -Infinity;
    const v = scale * dot(qr, rotate(k, j, th, pairing));
    return softcap ? softcap * Math.tanh(v / softcap) : v;
  });
  const max = Math.max(...s);
  const e = s.map((v) => Math.exp(v - max));
  const sum = e.reduce((a, b) => a + b, 0);
  return Float64Array.from(e, (v) => v / sum);
}

// Deterministic "random" q and k (a seeded generator, normal values): the same numbers on every render.
function normals(n, seed) {
  let t = seed >>> 0;
  const uniform = () => {
    t = (t + 0x6d2b79f5) >>> 0;
    let r = Math.imul(t ^ (t >>> 15), 1 | t);
    r = (r + Math.imul(r ^ (r >>> 7), 61 | r)) ^ r;
    return ((r ^ (r >>> 14)) >>> 0) / 4294967296;
  };
  return Float64Array.from({ length: n }, () => Math.sqrt(-2 * Math.log(1 - uniform())) * Math.cos(2 * Math.PI * uniform()));
}

// Part 1: q·k at (m + s, n + s) for every shift, and at positions whose distance differs.
export function identity({ m, n, d, base, pairing, seed }) {
  const th = thetas(d, base);
  const q = normals(d, seed), k = normals(d, seed + 1);
  const at = (a, b) => dot(rotate(q, a, th, pairing), rotate(k, b, th, pairing));
  const norm = Math.sqrt(dot(q, q) * dot(k, k));
  const shifts = SHIFTS.map((s) => ({ s, m: m + s, n: n + s, dot: at(m + s, n + s) }));
  const contrast = [[m + 1, n], [m, n + 1], [m + 10, n]].map(([a, b]) => ({ m: a, n: b, dot: at(a, b) }));
  const maxDev = Math.max(...shifts.map((r) => Math.abs(r.dot - shifts[0].dot)));
  const delta = m - n;
  const lo = Math.min(-64, delta - 8), hi = Math.max(64, delta + 8);
  const step = Math.max(1, Math.ceil((hi - lo) / 256));
  const curve = [];
  for (let x = lo; x <= hi; x += step) curve.push([x, at(n + x, n)]);
  return { q, k, th, norm, plain: dot(q, k), shifts, contrast, maxDev, ok: maxDev <= IDENTITY_RTOL * norm, delta, curve };
}

// Part 2: for one head of the worker's "rope" message, the engine's row and the rows of both pairings.
export function realHead(data, head) {
  const D = data.head_dim, P = data.pos + 1;
  const g = Math.floor(head / (data.n_head / data.n_head_kv));        // GQA: the K head this query head reads
  const q = data.q.subarray(head * D, (head + 1) * D);
  const keys = range(P).map((j) => data.k.subarray((j * data.n_head_kv + g) * D, (j * data.n_head_kv + g + 1) * D));
  const th = thetas(data.n_rot, data.freq_base, data.freq_scale, data.factors);
  const engine = data.probs.subarray(head * P, (head + 1) * P);
  const rows = {};
  for (const pairing of Object.keys(PAIRINGS)) {
    const p = scoreRow(q, keys, data.pos, th, pairing, data);
    let diff = 0;
    for (let j = 0; j < P; j++) diff = Math.max(diff, Math.abs(p[j] - engine[j]));
    rows[pairing] = { p, diff };
  }
  const model = data.neox ? "neox" : "adjacent";
  return { head, kvHead: g, engine, rows, model, ok: rows[model].diff <= MATCH_TOL };
}

// ---- the card's state: store.rope -----------------------------------------------------------------------------------
// The inputs' defaults as the page was served (server/templates/index.html is their one home).
const served = (id) => Number($(id).defaultValue);

export function freshRope() {
  return {
    m: served("rope-m"), n: served("rope-n"), seed: 1,   // part 1: the two positions, the seed of the random q, k
    d: null, base: null, pairing: null,   // null: the loaded model's (else the inputs' defaults, adjacent)
    layer: 0, head: 0,                    // part 2: the user's choice (ropeChoice bounds it by the loaded model)
    seq: 0,                               // requests sent; an answer to an older one (or conversation) is dropped
    busy: false,
    data: null,                           // the worker's "rope" message: q, k, probs of one layer at one position
  };
}

// What part 1 computes with: the user's numbers, else the loaded model's.
function ropeSettings(store) {
  const s = store.rope, r = store.loaded && store.loaded.rope;
  return { m: s.m, n: s.n, seed: s.seed, d: s.d ?? (r ? r.head_dim : served("rope-d")),
           base: s.base ?? (r ? r.base : served("rope-base")),
           pairing: s.pairing ?? (r ? (r.neox ? "neox" : "adjacent") : "adjacent") };
}

// The layers the loaded model does not rotate (smollm3's NoPE layers; lab/worker/router.py "loaded").
function noRope(store) {
  return (store.loaded && store.loaded.rope.no_rope) || [];
}

// The layer and head part 2 shows: the user's choice, within the loaded model's.
function ropeChoice(store) {
  const s = store.rope, l = store.loaded;
  if (!l) return { layer: s.layer, head: s.head };
  return { layer: Math.min(s.layer, l.kv.n_layer - 1), head: Math.min(s.head, l.n_head - 1) };
}

// The worker's "rope" message: kept when it answers the newest request about the conversation shown now.
export function ropeAnswer(s, m, contextLength) {
  if (m.seq !== s.seq) return;
  s.busy = false;
  s.data = m.n === contextLength ? m : null;
}

// A "probe-rope" error (main.js shows its message).
export function ropeFailed(s) {
  s.busy = false;
}

// The conversation was dropped (Forget, new chat, a new model): the q and k held came from it.
export function dropRope(s) {
  s.data = null;
  s.busy = false;
  s.seq++;               // an answer still on its way belongs to the dropped conversation
}

// ---- events -----------------------------------------------------------------------------------------------------------
const canFetch = (store) => store.loaded && !store.generating && !store.rope.busy && selectedPos(store) != null;

function fetchHead(store, worker, rerender) {
  if (!canFetch(store)) return;
  const s = store.rope;
  s.busy = true;
  worker.postMessage({ type: "probe-rope", pos: selectedPos(store), layer: ropeChoice(store).layer, seq: ++s.seq });
  rerender();
}

export function wireRope(store, worker, rerender) {
  const set = (key, v) => { store.rope[key] = v; rerender(); };
  const onNumber = (id, key, ok) => $(id).addEventListener("change", (e) => {
    const v = Number(e.target.value);
    if (ok(v)) store.rope[key] = v;
    rerender();
  });
  // positions up to 1e6: with the shifts, angles stay under ~1e6 rad, where float64 keeps the identity to ~1e-10
  onNumber("rope-m", "m", (v) => Number.isInteger(v) && v >= 0 && v <= 1e6);
  onNumber("rope-n", "n", (v) => Number.isInteger(v) && v >= 0 && v <= 1e6);
  onNumber("rope-d", "d", (v) => Number.isInteger(v) && v >= 2 && v <= 1024 && v % 2 === 0);
  onNumber("rope-base", "base", (v) => v > 1);
  $("rope-pairing").addEventListener("change", (e) => set("pairing", e.target.value));
  $("rope-reseed").addEventListener("click", () => set("seed", store.rope.seed + 2));
  $("rope-layer").addEventListener("change", (e) => set("layer", Number(e.target.value)));
  $("rope-head").addEventListener("change", (e) => set("head", Number(e.target.value)));
  $("rope-fetch").addEventListener("click", () => fetchHead(store, worker, rerender));
}

// ---- rendering --------------------------------------------------------------------------------------------------------
const num = (x, digits = 6) => (x === 0 ? "0" : Math.abs(x) < 1e-3 || Math.abs(x) >= 1e5 ? x.toExponential(2) : x.toFixed(digits));

// An input shows the store's value unless the user is typing in it.
function showValue(input, value) {
  if (document.activeElement !== input) input.value = String(value);
}

export function renderRope(store) {
  const s = ropeSettings(store);
  showValue($("rope-m"), s.m);
  showValue($("rope-n"), s.n);
  showValue($("rope-d"), s.d);
  showValue($("rope-base"), s.base);
  $("rope-pairing").value = s.pairing;
  renderIdentity(identity(s), s);
  renderRealControls(store);
  renderReal(store, s.pairing);
}

function renderIdentity(r, s) {
  const row = (x, testid, label) => el("tr", { testid, data: { m: x.m, n: x.n, delta: x.m - x.n, dot: x.dot } }, [
    el("td", { textContent: label }), el("td", { textContent: x.m }), el("td", { textContent: x.n }),
    el("td", { textContent: x.m - x.n }), el("td", { class: "num", textContent: x.dot.toFixed(12) })]);
  const table = el("table", { class: "rope-table" }, [
    el("tr", {}, ["", "m", "n", "m − n", "q·k after rotation"].map((h) => el("th", { textContent: h }))),
    ...r.shifts.map((x) => row(x, "rope-shift-row", `shift s = ${x.s}`)),
    ...r.contrast.map((x) => row(x, "rope-contrast-row", "another distance")),
  ]);
  const half = s.d / 2;
  const shownTheta = [...new Set([0, 1, Math.floor(half / 2), half - 1])].filter((i) => i < half);
  const check = el("p", {
    testid: "rope-identity-check", class: r.ok ? "good" : "bad",
    data: { ok: r.ok, maxdev: r.maxDev, norm: r.norm },
    textContent: `${r.ok ? "✓" : "✗"} q·k depends only on m − n: over shifts up to ${SHIFTS.at(-1)} it moves by `
      + `${num(r.maxDev)} (|q||k| = ${r.norm.toFixed(2)}; float64 rounding, bound ${IDENTITY_RTOL}·|q||k|); `
      + `a different m − n changes it by ${num(Math.min(...r.contrast.map((x) => Math.abs(x.dot - r.shifts[0].dot))), 4)} `
      + "or more.",
  });
  // the vectors themselves, for a test to redo the rotation on its own
  Object.assign($("rope-identity").dataset,
                { q: r.q.join(","), k: r.k.join(","), d: s.d, base: s.base, pairing: s.pairing });
  $("rope-identity").replaceChildren(
    el("p", {}, [
      `θᵢ = base^(−2i/d) for i = 0 … ${half - 1}: `,
      ...shownTheta.map((i, j) => el("span", { class: "rope-theta",
        textContent: `${j ? ", " : ""}θ${i} = ${num(r.th[i])} (a turn every ${num(2 * Math.PI / r.th[i], 1)} positions)` })),
      `. Pair i of a vector at position p turns by p·θᵢ; ${PAIRINGS[s.pairing].name} pairs ${PAIRINGS[s.pairing].pairs}. `
      + `Per pair, (R(m)q)·(R(n)k) = |qᵢ||kᵢ| cos((m − n)θᵢ + φᵢ): only m − n is left. `
      + `Random q, k of ${s.d} values (unrotated q·k = ${r.plain.toFixed(6)}):`]),
    table, check, curveCanvas(r));
}

function curveCanvas(r) {
  const W = 560, H = 140, PAD = 24;
  const c = el("canvas", { width: W, height: H, testid: "rope-curve",
                          title: "q·k as a function of m − n (the marked point is yours)" });
  const ctx = c.getContext("2d");
  const xs = r.curve.map(([x]) => x), ys = r.curve.map(([, y]) => y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const X = (x) => PAD + ((x - x0) / (x1 - x0 || 1)) * (W - 2 * PAD);
  const Y = (y) => H - PAD - ((y - y0) / (y1 - y0 || 1)) * (H - 2 * PAD);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
  ctx.strokeStyle = "#c8ccd4"; ctx.beginPath(); ctx.moveTo(X(0), PAD / 2); ctx.lineTo(X(0), H - PAD); ctx.stroke();
  ctx.strokeStyle = rgba(BLUE, 1); ctx.beginPath();
  r.curve.forEach(([x, y], i) => (i ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
  ctx.stroke();
  ctx.fillStyle = "#e8590c"; ctx.beginPath(); ctx.arc(X(r.delta), Y(r.shifts[0].dot), 4, 0, 2 * Math.PI); ctx.fill();
  ctx.fillStyle = "#5d6679"; ctx.font = "11px system-ui, sans-serif";
  ctx.fillText(`m − n = ${x0}`, PAD, H - 6); ctx.fillText(String(x1), W - PAD - 20, H - 6);
  ctx.fillText("q·k vs m − n", PAD, 12);
  return c;
}

// Part 2's layer and head selects, and the fetch button.
function renderRealControls(store) {
  const loaded = store.loaded, pos = selectedPos(store);
  const { layer, head } = ropeChoice(store);
  if (loaded) {
    fillSelect($("rope-layer"), range(loaded.kv.n_layer), (i) => `layer ${i}${noRope(store).includes(i) ? " (no RoPE)" : ""}`, layer);
    fillSelect($("rope-head"), range(loaded.n_head), (i) => `head ${i}`, head);
  }
  const button = $("rope-fetch");
  button.disabled = !canFetch(store) || noRope(store).includes(layer);
  button.textContent = pos == null ? "Fetch q and k" : `Fetch layer ${layer}'s q at position ${pos} and k at 0 … ${pos}`;
}

// Part 2: why there is nothing to show yet, or the real head's rows (`pairing`: the one picked in part 1).
function renderReal(store, pairing) {
  const s = store.rope, pos = selectedPos(store);
  const layer = ropeChoice(store).layer;
  const why = !store.loaded ? "Load a model and chat: this part takes a real head's q and k."
    : noRope(store).includes(layer) ? `Layer ${layer} has no RoPE: this model leaves every ` +
      `${noRopeStep(noRope(store))} layer unrotated (NoPE), so its q and k carry no position signal and neither ` +
      "pairing applies. Pick a layer without “(no RoPE)” to see the rotation."
    : s.busy ? `computing… a prefill of ${pos + 1} positions through layers 0 … ${ropeChoice(store).layer}`
    : s.data ? null
    : pos == null ? "No conversation yet."
    : "Press Fetch: the worker reruns the conversation up to this layer's rope and reads q and k before it.";
  $("rope-real").replaceChildren(...(why ? [el("p", { class: "muted", textContent: why })] : realHeadView(store, pairing)));
}

function realHeadView(store, chosen) {
  const d = store.rope.data, { layer, head: picked } = ropeChoice(store);
  const head = Math.min(picked, d.n_head - 1);
  const r = realHead(d, head);
  const wrong = other(r.model);
  const label = (j) => shown(store.context[j] ? store.context[j].piece : "?");
  const stale = d.pos !== selectedPos(store) || d.layer !== layer || d.n !== store.context.length;
  const what = `layer ${d.layer}, head ${head} (reads K head ${r.kvHead}), query at position ${d.pos} «${label(d.pos)}»; `
    + `base ${d.freq_base}${d.window ? `, sliding window ${d.window}` : ""}; `
    + `p = softmax(${d.scale.toPrecision(4)} · q·k) over keys 0 … ${d.pos}, shade ∝ √p; `
    + `${d.ms} ms${stale ? " — shows an earlier choice: press Fetch for the current one" : ""}`;
  return [
    el("p", { class: "muted", testid: "rope-real-what", data: { layer: d.layer, pos: d.pos, head, kvhead: r.kvHead, stale },
              textContent: what }),
    scoreRows(d, r, chosen, label),
    engineCheck(r),
    el("p", { class: "muted", textContent: `With ${PAIRINGS[wrong].name} the same q and k give max |Δp| = ${num(r.rows[wrong].diff, 4)}: `
      + "the weights put each pair's two halves in the dims the model's pairing rotates together; the other pairing turns "
      + "dims that were never meant to turn together, so the angles no longer encode m − n the way training saw." }),
  ];
}

// The engine's row and the rows of both pairings (the picked one first), a cell per key shaded by √p.
function scoreRows(d, r, chosen, label) {
  const P = d.pos + 1, first = Math.max(0, P - KEYS_SHOWN);
  // columns: the keys before the last KEYS_SHOWN summed into one, then a column per key
  const cols = [...(first ? [{ key: "earlier", text: `< ${first}` }] : []),
                ...range(P - first).map((i) => ({ key: first + i, text: label(first + i) }))];
  const value = (p, c) => (c.key === "earlier" ? Array.prototype.slice.call(p, 0, first).reduce((a, b) => a + b, 0) : p[c.key]);
  const rowLabel = (name) => (name === "engine" ? "engine's attention"
    : [name === "neox" ? "halves" : "adjacent", ...(name === r.model ? ["model's"] : []), ...(name === chosen ? ["picked"] : [])].join(" · "));
  const rowTitle = (name) => (name === "engine" ? "the engine's own attention probabilities (its attention kernel's probe)"
    : `rotated here with ${PAIRINGS[name].name} ${PAIRINGS[name].pairs}`);
  const cell = (name, p, c) => {
    const v = value(p, c);
    const e = el("span", { class: "rope-cell", testid: "rope-real-cell", data: { row: name, key: c.key, p: v, selected: name === chosen },
                           title: `${c.key === "earlier" ? `keys before ${first}` : `key ${c.key} ${c.text}`}: p = ${v.toFixed(5)}` });
    e.style.background = rgba(BLUE, Math.sqrt(Math.max(0, v)));
    return e;
  };
  const line = (name, p, extra) => el("div", { class: "rope-row", testid: "rope-real-row", data: { row: name, ...extra } }, [
    el("span", { class: "rope-row-label", textContent: rowLabel(name), title: rowTitle(name) }),
    ...cols.map((c) => cell(name, p, c)),
    el("span", { class: "rope-row-diff", textContent: name === "engine" ? "" : `max |Δp| ${num(r.rows[name].diff)}` })]);
  const keysRow = el("div", { class: "rope-row rope-keys" }, [
    el("span", { class: "rope-row-label", textContent: "query ↓ key →" }),
    ...cols.map((c) => el("span", { class: "rope-cell rope-key", textContent: c.text, title: String(c.key) }))]);
  return el("div", { class: "rope-rows" }, [keysRow, line("engine", r.engine, {}),
    line(chosen, r.rows[chosen].p, { maxdiff: r.rows[chosen].diff, selected: true }),
    line(other(chosen), r.rows[other(chosen)].p, { maxdiff: r.rows[other(chosen)].diff, selected: false })]);
}

// The check mark: the model's own pairing reproduces the engine's row within MATCH_TOL.
function engineCheck(r) {
  const right = r.rows[r.model].diff;
  return el("p", {
    testid: "rope-engine-check", class: r.ok ? "good" : "bad",
    data: { ok: r.ok, maxdiff: right, wrongdiff: r.rows[other(r.model)].diff, tol: MATCH_TOL, pairing: r.model },
    textContent: r.ok
      ? `✓ Rotated here with ${PAIRINGS[r.model].name} (${PAIRINGS[r.model].who}), q and k give the engine's own row: `
        + `max |Δp| = ${num(right)} ≤ ${MATCH_TOL}.`
      : `✗ Rotated here with this model's pairing, the row differs from the engine's by ${num(right)} (> ${MATCH_TOL}).`,
  });
}

// ---- export (web/export.js): what the card shows, as numbers and as a picture ------------------------------------
export function ropeData(store) {
  const s = ropeSettings(store);
  const id = identity(s);
  const out = { panel: "rope", settings: s, theta: Array.from(id.th),
                identity: { shifts: id.shifts, contrast: id.contrast, max_deviation: id.maxDev, ok: id.ok } };
  const d = store.rope.data;
  if (d) {
    const r = realHead(d, Math.min(ropeChoice(store).head, d.n_head - 1));
    out.real_head = { layer: d.layer, head: r.head, kv_head: r.kvHead, pos: d.pos, freq_base: d.freq_base,
                      model_pairing: r.model, engine: Array.from(r.engine),
                      adjacent: Array.from(r.rows.adjacent.p), neox: Array.from(r.rows.neox.p),
                      max_diff: { adjacent: r.rows.adjacent.diff, neox: r.rows.neox.diff }, tolerance: MATCH_TOL,
                      matches: r.ok };
  }
  return out;
}

export function drawRope(canvas, store) {
  const out = ropeData(store);
  const pad = (v, w) => String(v).padStart(w);
  const lines = [...out.identity.shifts, ...out.identity.contrast]
    .map((x) => `m ${pad(x.m, 6)}  n ${pad(x.n, 6)}  m−n ${pad(x.m - x.n, 4)}  q·k ${x.dot.toFixed(12)}`);
  const h = out.real_head;
  const spec = h && {
    cols: range(h.pos + 1).map(String), rows: ["engine", "adjacent", "neox"], cellW: 14, cellH: 18, colour: BLUE,
    alpha: (r, c) => Math.sqrt(Math.max(0, [h.engine, h.adjacent, h.neox][r][c])), vertical: false,
    mark: { row: h.model_pairing === "neox" ? 2 : 1 },
  };
  const size = spec ? heatmapSize(spec) : { width: 0, height: 0 };
  const notes = [`θᵢ = base^(−2i/d); q·k depends only on m − n: ${out.identity.ok ? "yes" : "NO"} `
                 + `(max deviation ${num(out.identity.max_deviation)})`];
  if (h) {
    notes.push(`layer ${h.layer} head ${h.head}, query ${h.pos}: this model's pairing ${h.model_pairing}, `
               + `max |Δp| adjacent ${num(h.max_diff.adjacent)}, neox ${num(h.max_diff.neox)}`);
  }
  const ctx = sheet(canvas, Math.max(textWidth(lines, MONO), size.width),
    linesHeight(lines.length) + (spec ? 16 + size.height : 0),
    `RoPE: d = ${out.settings.d}, base ${out.settings.base}, ${PAIRINGS[out.settings.pairing].name}`, notes);
  drawLines(ctx, 0, lines);
  if (spec) drawHeatmap(ctx, linesHeight(lines.length) + 16, spec);
}

// ---- folded (web/navigator.js): the card in one line ----------------------------------------------------------------
// The settings, and the real head's check when one was fetched.
function ropeLine(store) {
  const s = ropeSettings(store), d = store.rope.data;
  const line = `base ${s.base}, ${PAIRINGS[s.pairing].name}, d ${s.d}`;
  if (!d) return line;
  const r = realHead(d, Math.min(ropeChoice(store).head, d.n_head - 1));
  return `${line} · layer ${d.layer} head ${r.head}: ${r.ok ? "✓" : "✗"} the engine's row, max |Δp| = ${num(r.rows[r.model].diff)}`;
}

// ---- its place in the page (web/cards.js): the q and k it holds go with the conversation ---------------------------
export const card = {
  key: "rope",
  fresh: freshRope,
  render: renderRope,
  wire: (store, worker, page) => wireRope(store, worker, page.render),
  exports: (store, register) => register("rope", { data: () => ropeData(store), draw: (canvas) => drawRope(canvas, store),
                                                   ready: () => true }),
  cleared: (store) => dropRope(store.rope),
  summary: ropeLine,
};
