// The lab's panels: each renders one part of the store into its card. They compute nothing about the model;
// the numbers come from the worker (lab/instruments/probes.py, lab/instruments/forget.py). Event wiring stays in main.js, which passes
// the few callbacks a panel's own elements need (`act`).

const $ = (id) => document.getElementById(id);

export function el(tag, props = {}, children = []) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "testid") e.setAttribute("data-testid", v);
    else if (k === "data") Object.assign(e.dataset, v);
    else if (k === "class") e.className = v;
    else e[k] = v;
  }
  e.append(...children);
  return e;
}

// The cards' small building blocks (web/retrieval.js, web/experiments.js): an element with a class and its text (set
// as text, never as HTML: it may come from the user's files or the model), and an element given its data-testid.
export const node = (tag, className, text) => {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text != null) e.textContent = text;
  return e;
};
export const withTestid = (e, id) => { e.setAttribute("data-testid", id); return e; };

// A token's text made visible: spaces and newlines would otherwise vanish in labels.
export function shown(piece) {
  return (piece ?? "").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/ /g, "·") || "∅";
}

const fmt = (x, d = 4) => (Number.isFinite(x) ? x.toFixed(d) : String(x));

// A count with a decimal prefix: si(1.36e8, "B") is "136.0 MB".
function si(n, unit) {
  const prefixes = ["", "K", "M", "G", "T"];
  let i = 0;
  while (n >= 1000 && i < prefixes.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${prefixes[i]}${unit}`.trimEnd();
}

export const fmtBytes = (n) => (n == null ? "—" : si(n, "B"));

// What an empty panel says: "computing…" while its request is out, else why it has nothing to show.
function placeholder(body, busy, why) {
  body.replaceChildren(el("p", { class: "muted", textContent: busy ? "computing…" : why }));
}

// The placeholder of a panel fed by the probes' inspection of the conversation.
function probePlaceholder(body, store) {
  const n = store.context.length;
  placeholder(body, n > 0 && store.busy.inspect > 0, n ? "waiting for the model" : "No conversation yet.");
}

// A <select> holding `values` (rebuilt only when they change), showing `value`.
export function fillSelect(select, values, label, value) {
  const key = values.join(" ");
  if (select.dataset.values !== key) {
    select.dataset.values = key;
    select.replaceChildren(...values.map((v) => el("option", { value: v, textContent: label(v) })));
  }
  select.value = String(value);
}

const range = (n) => Array.from({ length: n }, (_, i) => i);

// What a panel's last request cost: wall-clock time, and the work lab/instruments/probes.py says it did (on a CPU device the
// multiply-adds set the time, on a GPU the weight bytes read).
function cost(testid, ms, macs, bytes) {
  const work = macs ? `: ${si(macs, "")} multiply-adds over ${si(bytes, "B")} of weights` : "";
  return el("span", { class: "cost", testid, data: { ms, macs: macs || 0, bytes: bytes || 0 },
                      textContent: `${ms} ms${work}` });
}

// ---- colours and the heatmap primitive ----------------------------------------------------------------------
// Shades are one colour at an opacity in [0, 1] over the white card.
export const RED = [201, 42, 42];   // positive embedding values
export const BLUE = [59, 91, 219];  // negative embedding values; attention (the page's --accent)
export const GREEN = [43, 138, 62]; // logit-lens probability (the page's --good)
const WHITE = 255;
const DARK_TEXT_ABOVE = 0.6;        // a cell's text turns white on shades more opaque than this

// One colour at opacity a, as CSS: rgba(BLUE, 0.5). The canvas pictures (web/pictures.js) and the cards use it too.
export const rgba = ([r, g, b], a) => `rgba(${r}, ${g}, ${b}, ${a})`;

// The grid of the attention and logit-lens panels: a corner, a label per column, then per row a label and a
// cell per column. cols, rows: [{textContent, title}]; cell(r, c) -> the cell's element props and `alpha`, its
// shade of `colour` (null: no value there, drawn as masked). `variant` names the panel's look in style.css.
// mark: {row, col}, the row or column of the selected token, outlined (classes sel, sel-row, sel-col).
function heatmap({ variant, colour, corner, cols, rows, cell, mark = {} }) {
  const grid = el("div", { class: `heatmap ${variant}` });
  grid.style.gridTemplateColumns = `max-content repeat(${cols.length}, var(--column))`;
  grid.append(el("div", { class: "corner", textContent: corner }),
    ...cols.map((c, i) => el("div", { class: i === mark.col ? "klabel sel" : "klabel", ...c })));
  rows.forEach((row, r) => {
    grid.append(el("div", { class: r === mark.row ? "qlabel sel" : "qlabel", ...row }));
    for (let c = 0; c < cols.length; c++) {
      const { alpha, ...props } = cell(r, c);
      const shaded = alpha != null;
      const sel = r === mark.row ? " sel-row" : c === mark.col ? " sel-col" : "";
      const e = el("div", { class: (!shaded ? "cell masked" : alpha > DARK_TEXT_ABOVE ? "cell dark" : "cell") + sel, ...props });
      if (shaded) e.style.background = rgba(colour, alpha);
      grid.append(e);
    }
  });
  return grid;
}

// The same shading as a canvas of one pixel per cell (rows x cols), for thumbnails.
function heatmapPixels(rows, cols, colour, alpha, props) {
  const canvas = el("canvas", { width: cols, height: rows, ...props });
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols, rows);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const a = alpha(r, c), o = 4 * (r * cols + c);
      for (let ch = 0; ch < 3; ch++) img.data[o + ch] = WHITE - (WHITE - colour[ch]) * a;
      img.data[o + 3] = WHITE;
    }
  }
  ctx.putImageData(img, 0, 0);
  return canvas;
}

// ---- embedding inspector ---------------------------------------------------------------------------------
// Diverging colour for an embedding value, scaled by the row's largest magnitude.
function diverging(v, scale) {
  return rgba(v >= 0 ? RED : BLUE, Math.min(1, Math.abs(v) / (scale || 1)));
}

// The embedding the worker sent, if it is the selected token's (a reply for an earlier selection is not shown).
export function selectedEmbedding(store) {
  const e = store.embedding, pos = selectedPos(store);
  return e && e.index === pos && store.context[pos] && store.context[pos].id === e.id ? e : null;
}

export function renderEmbedding(store) {
  const body = $("embedding-body");
  const e = selectedEmbedding(store);
  if (!e) {
    const n = store.context.length;
    placeholder(body, n > 0 && store.busy.embedding, !n ? "No conversation yet." : store.generating ? "after the reply" : "waiting for the model");
    return;
  }
  const values = e.values;
  let scale = 0;
  for (const v of values) scale = Math.max(scale, Math.abs(v));
  const strip = el("div", { class: "strip", testid: "embedding-values", data: { count: values.length } },
    Array.from(values, (v, i) => {
      const s = el("span", { class: "sv", title: `dim ${i}: ${fmt(v, 5)}`, data: { dim: i, value: v } });
      s.style.background = diverging(v, scale);
      return s;
    }));
  const nbs = el("ol", { class: "neighbours" }, e.neighbours.map((n) => el("li", {
    testid: "neighbour", data: { id: n.id, cos: n.cos },
  }, [el("code", { textContent: shown(n.piece) }), ` ${fmt(n.cos)} `, el("small", { textContent: `#${n.id}` })])));
  body.replaceChildren(
    el("p", {}, [`position ${e.index} · id `, el("b", { testid: "embedding-id", textContent: String(e.id) }), " · ",
      el("code", { testid: "embedding-text", textContent: shown(e.piece) }),
      ` · L2 norm `, el("b", { testid: "embedding-norm", textContent: fmt(e.norm) }),
      el("small", { class: "muted" }, [` · ${values.length} values · neighbours `,
        cost("embedding-cost", e.ms, e.macs, e.weight_bytes)])]),
    strip,
    el("p", { class: "scale muted", textContent: `blue negative, red positive, full colour at |v| = ${fmt(scale)}` }),
    el("h3", { textContent: "Nearest tokens by cosine over the whole embedding table" }),
    nbs);
}

// ---- residual stream -------------------------------------------------------------------------------------
// The selected position, the one every panel follows: the token the user chose (store.selected, the only place
// the choice lives), else the newest one.
export function selectedPos(store) {
  if (store.selected != null && store.selected < store.context.length) return store.selected;
  return store.context.length ? store.context.length - 1 : null;
}

export function renderResidual(store) {
  const body = $("residual-body");
  const pos = selectedPos(store);
  const norms = pos == null ? null : store.probe.residual.get(pos);
  if (!norms) { probePlaceholder(body, store); return; }
  let max = 0;
  for (const v of norms) max = Math.max(max, v);
  const rows = Array.from(norms, (v, slot) => {
    const bar = el("div", { class: "bar" });
    bar.style.width = `${(100 * v) / (max || 1)}%`;
    return el("div", { class: "bar-row", testid: "residual-bar", data: { layer: slot - 1, value: v },
                      title: `${slot ? `after layer ${slot - 1}` : "embedding"}: ${fmt(v, 3)}` },
      [el("span", { class: "bar-label", textContent: slot ? `L${slot - 1}` : "embd" }), el("div", { class: "bar-track" }, [bar]),
       el("span", { class: "bar-value", textContent: fmt(v, 2) })]);
  });
  const tok = store.context[pos];
  body.replaceChildren(el("p", {}, [`position ${pos} `, el("code", { textContent: shown(tok && tok.piece) }),
    el("small", { class: "muted", textContent: ` · largest ${fmt(max, 2)}` })]),
    el("div", { class: "bars" }, rows));
}

// ---- attention ---------------------------------------------------------------------------------------------
// p of query start + qi on column c: c = 0 is its mass on keys before the window, c = 1 + k the key start + k.
export function attnValue(a, layer, head, qi, c) {
  const w = a.end - a.start;
  return a.data[((layer * a.n_head + head) * w + qi) * (w + 1) + c];
}

// Attention is shaded by √p, so that small weights stay visible.
export const attnShade = (p) => Math.sqrt(p);

function headThumb(a, layer, head, selected, act) {
  const w = a.end - a.start;
  const c = heatmapPixels(w, w, BLUE, (qi, k) => attnShade(attnValue(a, layer, head, qi, k + 1)),
    { class: `thumb${selected ? " selected" : ""}`, title: `head ${head}`, testid: "attention-thumb", data: { head } });
  c.addEventListener("click", () => act.selectHead(head));
  return el("figure", {}, [c, el("figcaption", { textContent: `h${head}` })]);
}

// "4th" for NoPE layers 3, 7, 11, ...: the step between them, as an ordinal.
export function noRopeStep(noRope) {
  const n = noRope.length > 1 ? noRope[1] - noRope[0] : noRope[0] + 1;
  return n === 2 ? "2nd" : n === 3 ? "3rd" : `${n}th`;
}

// The layer and head the attention panel shows: the user's choice, within what the inspection holds.
export function attnChoice(store) {
  const a = store.probe.attention;
  return { layer: Math.min(store.attn.layer, a.n_layer - 1), head: Math.min(store.attn.head, a.n_head - 1) };
}

export function renderAttention(store, act) {
  const body = $("attention-body");
  const a = store.probe.attention;
  if (!a) { probePlaceholder(body, store); return; }
  const { layer, head } = attnChoice(store);
  const noRope = (store.loaded && store.loaded.rope.no_rope) || [];
  fillSelect($("attention-layer"), range(a.n_layer), (i) => `layer ${i}${noRope.includes(i) ? " (no RoPE)" : ""}`, layer);
  fillSelect($("attention-head"), range(a.n_head), (i) => `head ${i}`, head);
  const w = a.end - a.start;
  const label = (p) => shown(store.context[p] ? store.context[p].piece : "?");
  const sel = selectedPos(store);
  const grid = heatmap({
    variant: "attention", colour: BLUE, corner: "query ↓ key →", mark: { row: sel - a.start },
    cols: [{ textContent: a.start ? `< ${a.start}` : "", title: "attention on keys before the window" },
           ...range(w).map((k) => ({ textContent: label(a.start + k), title: `key ${a.start + k}` }))],
    rows: range(w).map((qi) => ({ textContent: `${a.start + qi} ${label(a.start + qi)}` })),
    cell: (qi, c) => {
      const q = a.start + qi;
      const v = attnValue(a, layer, head, qi, c);
      const k = c === 0 ? "earlier" : a.start + c - 1;
      const masked = c > 0 && k > q;
      return { testid: "attention-cell", data: { q, k, value: v }, alpha: masked ? null : attnShade(v),
               title: c === 0 ? `${q} ${label(q)} → keys before ${a.start}: ${fmt(v)}` : `${q} ${label(q)} → ${k} ${label(k)}: ${fmt(v)}` };
    },
  });
  const thumbs = el("div", { class: "thumbs" }, range(a.n_head).map((h) => headThumb(a, layer, h, h === head, act)));
  const where = sel >= a.start ? "" : ` The selected position ${sel} is before the window.`;
  body.replaceChildren(
    el("p", { class: "muted" }, [
      `layer ${layer}, head ${head}: positions ${a.start}..${a.end - 1} of ${a.n}; shade ∝ √p; `,
      cost("attention-cost", a.ms.pass), where]),
    ...(noRope.includes(layer) ? [el("p", { class: "muted", testid: "attention-no-rope", textContent:
      `Layer ${layer} has no rotary position embedding (NoPE: this model leaves every ${noRopeStep(noRope)} layer ` +
      "unrotated): its scores compare what q and k hold, not where they sit; position reaches it only through what " +
      "earlier layers wrote into the residual stream." })] : []),
    grid, el("h3", { textContent: `All heads of layer ${layer} (click one)` }), thumbs);
}

// ---- logit lens ------------------------------------------------------------------------------------------------
// The position counts offered: powers of two below `max`, then `max`, the most one inspection covers.
function lensChoices(max) {
  const choices = [];
  for (let n = 1; n < max; n *= 2) choices.push(n);
  return choices.concat(max);
}

// The logit-lens positions to ask for: the chosen count, at most what the loaded model's probes cover
// (the worker's `loaded` stats, from lab/instruments/probes.py); no choice yet means all of them.
export function lensPositions(store) {
  const max = store.loaded.probe.lens_positions;
  return Math.min(store.lens.positions ?? max, max);
}

export function renderLens(store) {
  if (store.loaded) fillSelect($("lens-positions"), lensChoices(store.loaded.probe.lens_positions), String, lensPositions(store));
  const body = $("lens-body");
  const lens = store.probe.lens;
  if (!lens) { probePlaceholder(body, store); return; }
  const cols = lens.end - lens.lens_start;
  const piece = (id) => shown(lens.pieces[String(id)]);
  const layers = range(lens.lens.length).reverse();        // the last layer on top
  const sel = selectedPos(store);
  const grid = heatmap({
    variant: "lens", colour: GREEN, corner: "layer ↓ input →", mark: { col: sel - lens.lens_start },
    cols: range(cols).map((c) => {
      const p = lens.lens_start + c;
      return { textContent: shown(store.context[p] ? store.context[p].piece : "?"), title: `position ${p}` };
    }),
    rows: layers.map((layer) => ({ textContent: `L${layer}` })),
    cell: (r, c) => {
      const layer = layers[r];
      const top = lens.lens[layer][c];
      const [id, p] = top[0];
      return { testid: "logit-lens-cell", data: { layer, pos: lens.lens_start + c, id, p }, alpha: p,
               textContent: piece(id), title: top.map(([i, q]) => `${piece(i)}  ${fmt(q, 3)}`).join("\n") };
    },
  });
  const k = lens.lens[0][0].length;                        // candidates per cell (lab/instruments/probes.py LENS_K)
  const where = sel >= lens.lens_start ? "" : ` The selected position ${sel} is left of these columns: choose more positions.`;
  body.replaceChildren(el("p", { class: "muted" }, [
    `top-1 next token after each layer, shaded by its probability; top-${k} on hover; pass ${lens.ms.pass} ms, lens `,
    cost("lens-cost", lens.ms.lens, lens.macs, lens.bytes), where]), grid);
}

// ---- KV cache --------------------------------------------------------------------------------------------------
// The cache as a picture: a row per layer, a column per position, each cell shaded by the L2 norm of that layer's
// cached K row (top half, blue) and V row (bottom half, green), read from the GPU (lab/instruments/kvview.py). Shades are
// √(x / max) of the picture's largest |K| or |V|, so small rows stay visible and a zero row is white.
export const KV_K = BLUE, KV_V = GREEN;
const KV_MAX_COLS = 256;            // positions drawn (the last ones): 30 layers x 256 cells is about the DOM's comfort
let kvDrawn = { key: null };        // what the grid was last built from: a render for another reason reuses it

// [{pos, norms: Float32Array [n_layer, 2]}] to draw: the live columns, or Forget's read-back picture.
// The KV picture's columns [{pos, norms: [‖k‖, ‖v‖] per layer}]: the live read, or Forget's read-back.
export function kvColumns(store) {
  const after = store.kv.after;
  if (!after) return store.kv.columns.map((norms, pos) => ({ pos, norms }));
  const w = 2 * after.n_layer;
  return range(after.end - after.start).map((j) => ({ pos: after.start + j, norms: after.norms.subarray(j * w, (j + 1) * w) }));
}

function kvGrid(store, kv, cols, n_layer) {
  let maxK = 0, maxV = 0;
  for (const c of cols) for (let il = 0; il < n_layer; il++) { maxK = Math.max(maxK, c.norms[2 * il]); maxV = Math.max(maxV, c.norms[2 * il + 1]); }
  const sel = store.kv.after ? null : selectedPos(store);
  const used = store.kv.used;
  const piece = (p) => (store.context[p] ? shown(store.context[p].piece) : "");
  const grid = el("div", { class: "kv-grid", testid: "kv-heatmap",
                                     data: { columns: cols.length, maxK, maxV, ms: store.kv.ms ?? "" } });
  grid.style.gridTemplateColumns = `max-content repeat(${cols.length}, var(--kv-column))`;
  grid.append(el("div", { class: "corner", textContent: "layer ↓ position →" }),
    ...cols.map((c) => el("div", { class: c.pos === sel ? "klabel selected" : "klabel", textContent: piece(c.pos) || String(c.pos),
                                   title: `position ${c.pos}` })));
  for (let il = 0; il < n_layer; il++) {
    const win = kv.window[il];
    grid.append(el("div", { class: "qlabel kv-layer", testid: "kv-layer", textContent: `L${il}`,
      data: { layer: il, used, attended: win ? Math.min(used, win) : used },
      title: `layer ${il}: ${used} of ${kv.n_ctx} rows written${win ? `, attention sees the last ${win}` : ""}` }));
    for (const c of cols) {
      const k = c.norms[2 * il], v = c.norms[2 * il + 1];
      const cell = el("div", { class: c.pos === sel ? "kvc selected" : "kvc", testid: "kv-cell", data: { layer: il, pos: c.pos, k, v },
        title: `layer ${il} · position ${c.pos}${piece(c.pos) ? ` ${piece(c.pos)}` : ""}\n‖k‖ = ${fmt(k)}\n‖v‖ = ${fmt(v)}` });
      const a = (x, max) => (x > 0 ? Math.sqrt(x / max) : 0);
      cell.style.background = `linear-gradient(${rgba(KV_K, a(k, maxK))} 50%, ${rgba(KV_V, a(v, maxV))} 50%)`;
      grid.append(cell);
    }
  }
  const legend = el("p", { class: "scale muted" }, !(maxK || maxV) ? [cols.length ? "every cell is zero: nothing to shade" : ""] : [
    el("span", { class: "swatch", style: `background: ${rgba(KV_K, 1)}` }), ` ‖k‖ (top), full at ${fmt(maxK, 2)} · `,
    el("span", { class: "swatch", style: `background: ${rgba(KV_V, 1)}` }), ` ‖v‖ (bottom), full at ${fmt(maxV, 2)} · shade √(x / max), white = 0`]);
  return [grid, legend];
}

// What Forget's read-back of the caches showed, beside the picture it drew (the "forget" message's kv).
function kvForgetLine(a) {
  const counts = `${a.checked} K and V buffers read back after the wipe: ${a.before.toLocaleString("en")} non-zero words `
    + `before, ${a.after.toLocaleString("en")} after.`;
  if (!a.after) return el("p", { class: "kv-forget", testid: "kv-forget", data: { state: "wiped", before: a.before, after: a.after } },
    [el("b", { textContent: "Wiped: every cell read back as zero. " }), counts]);
  return el("p", { class: "kv-forget bad", testid: "kv-forget", data: { state: "failed", before: a.before, after: a.after, lit: a.lit.join("|") } },
    [el("b", { textContent: `NOT wiped: ${a.lit_cells} cells still hold data, in ${a.lit.join(", ")}. ` }), counts]);
}

export function renderKv(store) {
  const body = $("kv-body");
  const kv = store.loaded && store.loaded.kv;
  if (!kv) { kvDrawn = { key: null }; placeholder(body, false, "load a model first"); return; }
  const used = store.kv.used, after = store.kv.after;
  const key = [store.kv, store.kv.rev, after, selectedPos(store), store.context.length, used, store.loaded, store.busy.forget];
  if (kvDrawn.key && key.every((x, i) => x === kvDrawn.key[i])) return;
  kvDrawn = { key };
  let cols = kvColumns(store);
  const n = cols.length;
  if (n > KV_MAX_COLS) cols = cols.slice(n - KV_MAX_COLS);
  const parts = [
    el("p", {}, ["bytes per token = 2 (K and V) × ", el("b", { textContent: kv.n_layer }), " layers × ",
      el("b", { textContent: kv.n_head_kv }), " KV heads × ", el("b", { textContent: kv.head_dim }), " head size × ",
      el("b", { textContent: kv.bytes_per_value }), " bytes = ",
      el("b", { testid: "kv-bytes-per-token", textContent: kv.bytes_per_token.toLocaleString("en") }), " B"]),
    el("p", { testid: "kv-used", data: { used, capacity: kv.n_ctx } },
      [`used ${used} of ${kv.n_ctx} tokens (the context limit made at load): ${fmtBytes(used * kv.bytes_per_token)} `
       + `of ${fmtBytes(kv.n_ctx * kv.bytes_per_token)}`]),
  ];
  if (after) parts.push(kvForgetLine(after));
  else if (store.busy.forget) parts.push(el("p", { class: "muted", textContent: "wiping, then reading the caches back…" }));
  if (cols.length) {
    const what = after ? "read back from the GPU after Forget" : `read from the GPU${store.kv.ms != null ? ` (last read ${store.kv.ms} ms)` : ""}`;
    parts.push(el("p", { class: "muted", textContent: `positions ${cols[0].pos}..${cols.at(-1).pos}${n > cols.length ? ` (the last ${cols.length} of ${n})` : ""}, ${what}; hover a cell for its numbers` }),
      ...kvGrid(store, kv, cols, kv.n_layer));
  } else {
    // no position yet: the layer rows alone, so the picture's shape is there before it fills
    parts.push(...kvGrid(store, kv, [], kv.n_layer));
  }
  body.replaceChildren(...parts);
}

// ---- forget ------------------------------------------------------------------------------------------------------
export function renderForget(store) {
  const r = store.forget;
  $("forget").disabled = store.busy.forget || !store.gpu;
  $("forget-buffers").textContent = r ? String(r.buffers) : "—";
  $("forget-before").textContent = r ? String(r.before) : "—";
  $("forget-after").textContent = r ? String(r.after) : "—";
  const status = $("forget-status");
  status.dataset.state = r ? r.status : "";
  if (store.busy.forget) status.textContent = "wiping and reading back…";
  else if (!r) status.textContent = "";
  else if (r.status === "wiped") {
    status.textContent = `Wiped: ${r.before.toLocaleString("en")} non-zero words in ${r.buffers} conversation buffers `
      + `(${fmtBytes(r.bytes)}) were cleared, and every buffer read back as zero (${r.ms} ms).`;
  } else if (r.status === "nothing") {
    status.textContent = `Nothing to wipe: all ${r.buffers} conversation buffers already read back as zero.`;
  } else {
    status.textContent = `NOT wiped: ${r.after} non-zero words remain in `
      + r.items.filter((i) => i.after).map((i) => i.label).join(", ");
  }
}
