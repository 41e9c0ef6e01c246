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

// A card's facts as a definition list: rows of [term, text, data-testid, data-value] (web/training.js,
// web/tokenizer.js).
export function factList(dl, rows) {
  dl.replaceChildren(...rows.flatMap(([k, v, testid, value]) =>
    [el("dt", { textContent: k }), el("dd", { textContent: v, testid, data: { value } })]));
}

// A token's text made visible: spaces and newlines would otherwise vanish in labels.
export function shown(piece) {
  return (piece ?? "").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/ /g, "·") || "∅";
}


// Two next-token top-5 lists side by side, [id, log p] each (the experiments' before / after an intervention, the
// Router card's with / without an expert): `heads` names the two columns, `text(id)` a token's text, `mark(id)` a
// cell's class (or null), `id` the table's testid and `rowId` each row's (with the two ids in its data).
export function top5Table({ before, after, heads, text, id, rowId = null, mark = () => null }) {
  const t = withTestid(node("table", "exp-top5"), id);
  const head = node("tr");
  head.append(node("th", null, "#"), node("th", null, heads[0]), node("th", null, "log p"), node("th", null, heads[1]),
    node("th", null, "log p"));
  t.append(head);
  for (let i = 0; i < 5; i++) {
    const tr = node("tr");
    const [b, bp] = before[i] || [null, null], [a, ap] = (after || [])[i] || [null, null];
    if (rowId) Object.assign(withTestid(tr, rowId).dataset, { before: b ?? "", after: a ?? "" });
    tr.append(node("td", "muted", String(i + 1)), node("td", mark(b), b == null ? "" : text(b)),
      node("td", null, bp == null ? "" : bp.toFixed(3)), node("td", mark(a), a == null ? "" : text(a)),
      node("td", null, ap == null ? "" : ap.toFixed(3)));
    t.append(tr);
  }
  return t;
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
    nbs,
    ...(e.per_layer ? perLayer(e.per_layer, e.weight_bytes) : []));
}

// gemma4's per-layer embedding of the token: its row of per_layer_token_embd as one row a layer (cells shaded as the
// main strip, scaled by this row's largest magnitude), each slice's L2 norm beside it, and where it enters the model.
function perLayer(p, mainBytes) {
  const { values, norms, n_layer: L, width: P } = p;
  let scale = 0;
  for (const v of values) scale = Math.max(scale, Math.abs(v));
  const grid = el("div", { class: "per-layer", testid: "embedding-per-layer", data: { layers: L, width: P } }, [
    el("span", { class: "muted", textContent: "layer" }),
    el("span", { class: "pl-axis muted" }, [el("span", { textContent: "dim 0" }), el("span", { textContent: `dim ${P - 1}` })]),
    el("span", { class: "pl-norm muted", textContent: "L2 norm" }),
  ]);
  for (let il = 0; il < L; il++) {
    const cells = el("div", { class: "pl-cells", testid: "per-layer-row", data: { layer: il } }, range(P).map((d) => {
      const v = values[il * P + d];
      const c = el("span", { title: `layer ${il}, dim ${d}: ${fmt(v, 5)}`, data: { layer: il, dim: d, value: v } });
      c.style.background = diverging(v, scale);
      return c;
    }));
    grid.append(el("span", { textContent: `L${il}` }), cells,
      el("span", { class: "pl-norm", testid: "per-layer-norm", data: { layer: il, value: norms[il] }, textContent: fmt(norms[il], 3) }));
  }
  return [
    el("h3", { textContent: `Per-layer embedding: ${L} slices of ${P}, one a layer` }),
    el("div", { class: "muted pl-note", testid: "embedding-per-layer-note" }, [
      el("p", { textContent: `This model also gives every token a row of per_layer_token_embd (${L} × ${P} values). `
        + `Shown as the table stores it: before the ×√${P} scale and before the mix with the main embedding's projection.` }),
      el("ul", {}, [
        el("li", { textContent: `Layer i's per-layer input: (slice i × √${P} + slice i of the main embedding through `
          + "per_layer_model_proj, RMS-normed by per_layer_proj_norm) × 1/√2, once a step." }),
        el("li", { textContent: "Layer i reads it after its feed-forward: GELU(inp_gate · h) × that input → proj → "
          + "post_norm, added to the residual stream." }),
      ]),
    ]),
    grid,
    el("p", { class: "scale muted", textContent: `blue negative, red positive, full colour at |v| = ${fmt(scale)} (this row's largest)` }),
    el("p", { class: "muted", testid: "per-layer-no-neighbours", textContent:
      `No nearest tokens over this table: a query would read all of it, ${si(p.table_bytes, "B")} `
      + `(${(p.table_bytes / mainBytes).toFixed(1)}× the main table's ${si(mainBytes, "B")}), for a cosine over a row `
      + "that no layer reads whole." }),
  ];
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

// The layers the attention panel offers: those with attention (a hybrid's conv and delta-net layers have none).
const attnLayers = (store) => store.loaded.kv.layers;

// The layer and head the attention panel shows: the user's choice, within what the inspection holds; a choice of a
// layer without attention moves to the first attention layer after it (or the last one).
export function attnChoice(store) {
  const a = store.probe.attention, layers = attnLayers(store);
  const layer = layers.find((il) => il >= store.attn.layer) ?? layers.at(-1);
  return { layer, head: Math.min(store.attn.head, a.n_head - 1) };
}

// Why a hybrid's attention panel lists only some layers: the others, by kind, and where their memory is shown.
function attnWhyNot(store) {
  const mem = store.loaded.memory;
  const others = mem.layers.map((k, il) => [il, k]).filter(([, k]) => k !== "attention");
  if (!others.length) return [];
  const names = { conv: "short-conv", delta: "gated delta-net" };
  const kinds = [...new Set(others.map(([, k]) => k))].map((k) => names[k]).join(" and ");
  return [el("p", { class: "muted", testid: "attention-why", textContent: `Only the attention layers are listed. Layers `
    + `${others.map(([il]) => il).join(", ")} are ${kinds} layers: no query meets the keys of earlier tokens there, so `
    + "there are no attention weights to show; what they keep instead is in the memory card." })];
}

export function renderAttention(store, act) {
  const body = $("attention-body");
  const a = store.probe.attention;
  if (!a) { probePlaceholder(body, store); return; }
  const { layer, head } = attnChoice(store);
  const noRope = (store.loaded && store.loaded.rope.no_rope) || [];
  fillSelect($("attention-layer"), attnLayers(store), (i) => `layer ${i}${noRope.includes(i) ? " (no RoPE)" : ""}`, layer);
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
    ...attnWhyNot(store),
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
  for (const c of cols) for (const il of kv.layers) { maxK = Math.max(maxK, c.norms[2 * il]); maxV = Math.max(maxV, c.norms[2 * il + 1]); }
  const sel = store.kv.after ? null : selectedPos(store);
  const used = store.kv.used;
  const piece = (p) => (store.context[p] ? shown(store.context[p].piece) : "");
  const grid = el("div", { class: "kv-grid", testid: "kv-heatmap",
                                     data: { columns: cols.length, maxK, maxV, ms: store.kv.ms ?? "" } });
  grid.style.gridTemplateColumns = `max-content repeat(${cols.length}, var(--kv-column))`;
  grid.append(el("div", { class: "corner", textContent: "layer ↓ position →" }),
    ...cols.map((c) => el("div", { class: c.pos === sel ? "klabel selected" : "klabel", textContent: piece(c.pos) || String(c.pos),
                                   title: `position ${c.pos}` })));
  for (const il of kv.layers) {          // a hybrid's layers without attention keep no K/V: no row (their memory is below)
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

export function renderKv(store, act) {
  const body = $("kv-body");
  const kv = store.loaded && store.loaded.kv;
  if (!kv) { kvDrawn = { key: null }; placeholder(body, false, "load a model first"); return; }
  const used = store.kv.used, after = store.kv.after;
  const key = [store.kv, store.kv.rev, after, selectedPos(store), store.context.length, used, store.loaded, store.busy.forget,
               store.memory, store.memory.rev];
  if (kvDrawn.key && key.every((x, i) => x === kvDrawn.key[i])) return;
  kvDrawn = { key };
  let cols = kvColumns(store);
  const n = cols.length;
  if (n > KV_MAX_COLS) cols = cols.slice(n - KV_MAX_COLS);
  const parts = [
    el("p", {}, ["bytes per token = 2 (K and V) × ", el("b", { textContent: kv.layers.length }),
      kv.layers.length < kv.n_layer ? ` attention layers (of ${kv.n_layer}) × ` : " layers × ",
      el("b", { textContent: kv.n_head_kv }), " KV heads × ", el("b", { textContent: kv.head_dim }), " head size × ",
      el("b", { textContent: kv.bytes_per_value }), ` bytes (${kv.kv_type}) = `,
      el("b", { testid: "kv-bytes-per-token", textContent: kv.bytes_per_token.toLocaleString("en") }), " B"]),
    el("p", { testid: "kv-used", data: { used, capacity: kv.n_ctx } },
      [`used ${used} of ${kv.n_ctx} tokens (the context limit made at load): ${fmtBytes(used * kv.bytes_per_token)} `
       + `of ${fmtBytes(kv.n_ctx * kv.bytes_per_token)}`]),
  ];
  if (after) parts.push(kvForgetLine(after));
  else if (store.busy.forget) parts.push(el("p", { class: "muted", textContent: "wiping, then reading the caches back…" }));
  if (cols.length) {
    const what = after ? "read back from the GPU after the wipe" : `read from the GPU${store.kv.ms != null ? ` (last read ${store.kv.ms} ms)` : ""}`;
    parts.push(el("p", { class: "muted", textContent: `positions ${cols[0].pos}..${cols.at(-1).pos}${n > cols.length ? ` (the last ${cols.length} of ${n})` : ""}, ${what}; hover a cell for its numbers` }),
      ...kvGrid(store, kv, cols, kv.n_layer));
  } else {
    // no position yet: the layer rows alone, so the picture's shape is there before it fills
    parts.push(...kvGrid(store, kv, [], kv.n_layer));
  }
  const mem = store.loaded.memory;
  if (mem && (mem.conv || mem.delta)) parts.push(...memoryParts(store, mem, act));
  body.replaceChildren(...parts);
}

// ---- a hybrid's states (the memory card's lower half) ---------------------------------------------------------
// What a layer without attention keeps, read from the GPU (lab/instruments/memory.py): a conv layer its last
// l_cache - 1 inputs, a delta-net layer a d_k x d_v matrix per value head. Both stay the same size whatever the length.
const NB = (n) => n.toLocaleString("en");

// Signed values as a canvas of one pixel per value (red positive, blue negative, full colour at ±max, shaded by
// √(|v| / max) as the KV heatmap is, so the many small values of a state stay visible next to its few large ones), for
// rows far wider than a grid of elements could hold (a conv row has n_embd channels, a head d_k x d_v values).
function signedPixels(values, rows, cols, max, props) {
  const canvas = el("canvas", { width: cols, height: rows, ...props });
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols, rows);
  for (let i = 0; i < rows * cols; i++) {
    const v = values[i], a = max > 0 ? Math.sqrt(Math.min(1, Math.abs(v) / max)) : 0, c = v >= 0 ? RED : BLUE;
    for (let ch = 0; ch < 3; ch++) img.data[4 * i + ch] = WHITE - (WHITE - c[ch]) * a;
    img.data[4 * i + 3] = WHITE;
  }
  ctx.putImageData(img, 0, 0);
  return canvas;
}

const maxAbs = (xs) => { let m = 0; for (const x of xs) m = Math.max(m, Math.abs(x)); return m; };
const l2 = (xs) => { let s = 0; for (const x of xs) s += x * x; return Math.sqrt(s); };

// The bytes each kind keeps, the arithmetic written out, and a line of both over the conversation so far: the KV
// cache's bytes rise with every token, the states' stay flat.
function memoryBytes(store, mem) {
  const kv = mem.kv, used = store.kv.used, bpv = mem.bytes_per_value;
  const state = (mem.conv ? mem.conv.bytes : 0) + (mem.delta ? mem.delta.bytes : 0);
  const lines = [el("p", {}, [`KV cache: ${NB(kv.bytes_per_token)} B per token (above) × ${used} tokens = `,
    el("b", { textContent: NB(used * kv.bytes_per_token) }), " B, growing with every token"])];
  if (mem.conv) {
    const c = mem.conv;
    lines.push(el("p", { testid: "memory-conv-bytes", data: { bytes: c.bytes } }, [`conv states: ${c.layers.length} layers × `
      + `${c.rows} inputs (l_cache − 1) × ${c.channels} channels × ${bpv} bytes = `, el("b", { textContent: NB(c.bytes) }),
      " B, whatever the length"]));
  }
  if (mem.delta) {
    const d = mem.delta;
    lines.push(el("p", { testid: "memory-delta-bytes", data: { bytes: d.bytes } }, [`delta-net states: ${d.layers.length} `
      + `layers × ${d.heads} heads × ${d.d_k} × ${d.d_v} × ${bpv} bytes = `, el("b", { textContent: NB(d.bytes) }),
      " B, whatever the length"]));
  }
  if (mem.snapshots) {
    const s = mem.snapshots;
    lines.push(el("p", { class: "muted", testid: "memory-snapshot-bytes", data: { bytes: s.count * s.bytes } }, [
      `and the engine's snapshots of them (below): ${s.count} copies × (${NB(mem.delta.bytes)} B of delta-net states + `
      + `${NB(s.ring_bytes)} B of whole conv rings) = `, el("b", { textContent: NB(s.count * s.bytes) }), " B, flat too"]));
  }
  const cross = Math.ceil(state / kv.bytes_per_token);
  const span = Math.max(used, 2 * cross, 8);
  const W = 400, H = 90, y = (b) => H - 4 - ((H - 8) * b) / Math.max(span * kv.bytes_per_token, state);
  const x = (t) => (W * t) / span;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("class", "memory-growth");
  svg.setAttribute("data-testid", "memory-growth");
  Object.assign(svg.dataset, { used, kvBytes: used * kv.bytes_per_token, stateBytes: state, cross });
  const line = (pts, cls) => {
    const l = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    l.setAttribute("points", pts.map(([t, b]) => `${x(t).toFixed(1)},${y(b).toFixed(1)}`).join(" "));
    l.setAttribute("class", cls);
    return l;
  };
  svg.append(line([[0, 0], [span, span * kv.bytes_per_token]], "kv-ideal"), line([[0, 0], [used, used * kv.bytes_per_token]], "kv-line"),
    line([[0, state], [span, state]], "state-line"));
  lines.push(svg, el("p", { class: "scale muted" }, [
    el("span", { class: "swatch", style: `background: ${rgba(KV_K, 1)}` }), ` KV bytes over the tokens (solid: the ${used} held now) · `,
    el("span", { class: "swatch", style: `background: ${rgba(RED, 1)}` }), ` state bytes, flat at ${fmtBytes(state)} · `
      + `past ${cross} tokens the KV cache outweighs the states`]));
  return lines;
}

// The conv rows a token at the conversation's end reads, one canvas a conv layer: rows = positions, columns = channels.
function convParts(store, mem, src, after) {
  const c = mem.conv;
  if (!src) {
    return [el("p", { class: "muted", textContent: store.kv.used ? "the conv states no longer hold this conversation's "
      + "last inputs (another run went through the model): the next turn runs from position 0" : "No conversation yet." })];
  }
  const n = src.end - src.start, w = c.channels, per = n * w;
  if (!n) return [el("p", { class: "muted", textContent: "The conv states hold no input yet." })];
  const max = maxAbs(src.values);
  const rows = src.layers.map((il, i) => {
    const vals = src.values.subarray(i * per, (i + 1) * per);
    const lit = after ? after.conv.lit_rows[i] : null;
    return el("div", { class: "state-row" }, [el("span", { class: "bar-label", textContent: `L${il}` }),
      signedPixels(vals, n, w, max, { class: "conv-state", testid: "conv-state", title: `layer ${il}: the inputs of positions `
        + `${src.start}..${src.end - 1}, ${w} channels (rows: positions)`,
        data: { layer: il, start: src.start, end: src.end, norm: l2(vals), max: maxAbs(vals), ...(lit != null ? { lit } : {}) } })]);
  });
  return [el("h3", { textContent: "Conv layers: the last inputs" }),
    el("p", { class: "explain", textContent: `A conv layer mixes each channel over its last ${c.rows + 1} inputs, so all it `
      + `keeps between tokens is the ${c.rows} inputs before the next one: positions ${src.start}..${src.end - 1} below, `
      + "a row each, red positive and blue negative. Nothing older survives; the KV cache above keeps every position." }),
    ...rows, el("p", { class: "scale muted", textContent: `full colour at |x| = ${fmt(max, 3)}, shade √(|x| / max) · `
      + (after ? "read back from the GPU after the wipe" : "read from the GPU's conv rings") })];
}

// A delta-net layer's memory: each layer's norm over the conversation (a strip, one cell per read), and the picked
// head's d_k x d_v matrix.
function deltaParts(store, mem, act, after) {
  const d = mem.delta, m = store.memory, pick = m.pick;
  const records = after ? [{ pos: 0, norms: after.delta.norms }] : m.records;
  const layerNorm = (norms, i) => l2(norms.subarray(i * d.heads, (i + 1) * d.heads));
  let max = 0;
  for (const r of records) for (let i = 0; i < d.layers.length; i++) max = Math.max(max, layerNorm(r.norms, i));
  const strips = d.layers.map((il, i) => el("div", { class: il === pick.layer ? "state-row picked" : "state-row" }, [
    el("button", { type: "button", class: "bar-label", testid: "delta-pick", data: { layer: il }, textContent: `L${il}`,
      title: `show layer ${il}'s state`, onclick: () => act.pickState(il, pick.head) }),
    el("div", { class: "strip delta-strip", testid: "delta-strip", data: { layer: il, count: records.length } }, records.map((r) => {
      const v = layerNorm(r.norms, i), h = r.norms[i * d.heads + Math.min(pick.head, d.heads - 1)];
      const s = el("span", { class: "sv", testid: "delta-norm", data: { layer: il, pos: r.pos, value: v, head: h },
        title: `layer ${il} after ${r.pos} positions: ‖S‖ = ${fmt(v, 3)} (head ${pick.head}: ${fmt(h, 3)})` });
      s.style.background = rgba(GREEN, max > 0 ? v / max : 0);
      return s;
    }))]));
  const head = after ? after.delta.head : m.head;
  const shown = head && head.layer === pick.layer && head.head === pick.head ? head : null;
  const select = el("select", { testid: "memory-head", onchange: (e) => act.pickState(pick.layer, Number(e.target.value)) },
    range(d.heads).map((h) => el("option", { value: h, textContent: `head ${h}`, selected: h === pick.head })));
  const picture = shown ? [signedPixels(shown.values, d.d_k, d.d_v, maxAbs(shown.values), { class: "delta-state", testid: "delta-state",
      data: { layer: shown.layer, head: shown.head, norm: l2(shown.values), max: maxAbs(shown.values) },
      title: `layer ${shown.layer}, head ${shown.head}: S [${d.d_k} × ${d.d_v}], rows k, columns v` }),
    el("p", { class: "scale muted", textContent: `rows: key index 0..${d.d_k - 1} · columns: value index 0..${d.d_v - 1} · `
      + `full colour at |s| = ${fmt(maxAbs(shown.values), 3)}, shade √(|s| / max) · ‖S‖ = ${fmt(l2(shown.values), 3)} · `
      + (after ? "read back from the GPU after the wipe" : "read from the GPU") })]
    : [el("p", { class: "muted", textContent: store.kv.used ? "reading the state…" : "No conversation yet." })];
  return [el("h3", { textContent: "Delta-net layers: a fixed matrix per head" }),
    el("p", { class: "explain", textContent: `A delta-net layer keeps no list of past tokens: each head holds one ${d.d_k} × ${d.d_v} `
      + "matrix S, and every token rewrites it (S ← decay · S + β k (v − S k)ᵀ: it fades what it held, then writes the new "
      + "value under the new key). Its size never changes; what changes is what it holds. A strip per layer: ‖S‖ over all "
      + "heads at each read, greener = larger. Click a layer, pick a head: its matrix below." }),
    ...strips, el("p", { class: "muted" }, [`layer ${pick.layer}, `, select]), ...picture,
    ...(mem.snapshots ? snapshotParts(store, mem, after) : [])];
}

// The engine's copies of every state (lab/engine/scratch.py SNAPSHOTS): where each stands, or after Forget what its
// read-back held.
function snapshotParts(store, mem, after) {
  const s = mem.snapshots, at = store.memory.snaps;
  const cells = range(s.count).map((slot) => {
    if (after) {
      const left = after.snaps ? after.snaps[slot] : 0;
      return el("span", { class: left ? "snap bad" : "snap", testid: "state-snapshot", data: { slot, after: left },
        textContent: left ? `copy ${slot}: ${NB(left)} words still set` : `copy ${slot}: zero` });
    }
    const pos = at ? at[slot] : null;
    return el("span", { class: pos == null ? "snap" : "snap held", testid: "state-snapshot", data: { slot, pos: pos ?? "" },
      textContent: pos == null ? `copy ${slot}: empty` : `copy ${slot}: after position ${pos - 1}` });
  });
  return [el("h3", { textContent: "Snapshots: copies of every state" }),
    el("p", { class: "explain", textContent: "A delta-net state cannot be stepped back: it is every token so far folded "
      + "into one matrix. Greedy decoding runs a few tokens ahead of what the chat keeps, so after each block the engine "
      + `copies every state aside (${s.count} copies, reused in turn); the next turn resumes from the latest copy at or `
      + "before its start and runs the few tokens after it again. They are conversation data: Forget wipes them too." }),
    el("p", { class: "snaps" }, cells)];
}

function memoryParts(store, mem, act) {
  const after = store.memory.after;
  const parts = [el("h3", { textContent: "What each kind of layer keeps" }),
    el("p", { class: "muted", testid: "memory-kinds", data: { kinds: mem.layers.join(" ") },
      textContent: mem.layers.map((k, il) => `L${il} ${k}`).join(" · ") }), ...memoryBytes(store, mem)];
  if (after) parts.push(memoryForgetLine(after));
  if (mem.conv) parts.push(...convParts(store, mem, after ? after.conv : store.memory.conv, after));
  if (mem.delta) parts.push(...deltaParts(store, mem, act, after));
  return parts;
}

// What Forget's read-back of the states showed (the "forget" message's memory).
function memoryForgetLine(a) {
  const counts = `${a.checked} state buffers${a.snaps ? " (snapshots included)" : ""} read back after the wipe: ${NB(a.before)} non-zero words before, ${NB(a.after)} after.`;
  if (!a.after) return el("p", { class: "kv-forget", testid: "memory-forget", data: { state: "wiped", before: a.before, after: a.after } },
    [el("b", { textContent: "States wiped: every value read back as zero. " }), counts]);
  return el("p", { class: "kv-forget bad", testid: "memory-forget", data: { state: "failed", before: a.before, after: a.after, lit: a.lit.join("|") } },
    [el("b", { textContent: `NOT wiped: ${a.lit.join(", ")} still hold data. ` }), counts]);
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

// New chat's wipe, or the tab's unload (main.js store.wiped): one line under the dock's buttons, with the numbers in
// data-* for tests.
export function renderWiped(store) {
  const line = $("wiped-status"), w = store.wiped, r = w && w.report;
  line.dataset.moment = w ? w.moment : "";
  line.dataset.state = r ? r.status : "";
  for (const k of ["buffers", "bytes", "before", "after"]) line.dataset[k] = r ? r[k] : "";
  if (store.busy.wiped) { line.textContent = "wiping and reading back…"; return; }
  if (!r) { line.textContent = ""; return; }
  const what = w.moment === "unload" ? "Unloaded" : "New chat";
  line.textContent = `${what}: ${r.buffers} conversation buffers (${fmtBytes(r.bytes)}) cleared and read back, `
    + `${r.after.toLocaleString("en")} non-zero words after`
    + (r.after ? ` (NOT wiped: ${r.items.filter((i) => i.after).map((i) => i.label).join(", ")})` : "")
    + (w.moment === "unload" ? `; the model's buffers destroyed.` : `; the retrieval index and an adapter kept.`);
}

// ---- folded (web/navigator.js): each built-in card's current result in one line ------------------------------------
// The cards web/cards.js registers give theirs as their `summary`; these have no module of their own.

// A probe card folded before it read the selected token: what opening it computes (nothing is, while it is folded).
function waiting(store, what) {
  const pos = selectedPos(store);
  return pos == null ? "No conversation yet." : `open it to compute ${what} #${pos} ${shown(store.context[pos].piece)}`;
}
function embeddingLine(store) {
  const e = selectedEmbedding(store);
  if (!e) return waiting(store, "the row of");
  const near = e.neighbours[0];
  return `position ${e.index} ${shown(e.piece)} · ‖e‖ ${fmt(e.norm)}`
    + (near ? ` · nearest ${shown(near.piece)} (cos ${fmt(near.cos, 3)})` : "");
}

function residualLine(store) {
  const pos = selectedPos(store), norms = pos == null ? null : store.probe.residual.get(pos);
  if (!norms) return waiting(store, "the residual at");
  let top = 0;
  norms.forEach((v, slot) => { if (v > norms[top]) top = slot; });
  const last = norms.length - 1;
  return `position ${pos} ${shown(store.context[pos].piece)} · ‖h‖ ${fmt(norms[0], 2)} at the embedding, `
    + `${fmt(norms[last], 2)} after layer ${last - 1}`
    + (top !== last ? ` · largest ${fmt(norms[top], 2)} ${top ? `after layer ${top - 1}` : "at the embedding"}` : "");
}

function attentionLine(store) {
  const a = store.probe.attention, sel = selectedPos(store);
  if (!a || sel == null || sel < a.start) return waiting(store, "the attention of");
  const { layer, head } = attnChoice(store);
  const p = (c) => attnValue(a, layer, head, sel - a.start, c);      // c: 1 + the key's place in the window
  let best = 1;
  for (let c = 2; c <= sel - a.start + 1; c++) if (p(c) > p(best)) best = c;
  const k = a.start + best - 1;
  return `layer ${layer} head ${head}: position ${sel} ${shown(store.context[sel].piece)} looks most at ${k} `
    + `${shown(store.context[k] ? store.context[k].piece : "?")} (p ${fmt(p(best), 3)})`;
}

function lensLine(store) {
  const lens = store.probe.lens, sel = selectedPos(store);
  if (!lens || sel == null || sel < lens.lens_start) return waiting(store, "the predictions after");
  const [id, p] = lens.lens.at(-1)[sel - lens.lens_start][0];
  return `after position ${sel} ${shown(store.context[sel].piece)}, the last layer predicts ${shown(lens.pieces[String(id)])} (p ${fmt(p, 3)})`;
}

function kvLine(store) {
  const kv = store.loaded && store.loaded.kv;
  if (!kv) return "load a model first";
  const used = store.kv.used;
  return `KV cache: ${used} of ${kv.n_ctx} tokens, ${fmtBytes(used * kv.bytes_per_token)} of ${fmtBytes(kv.n_ctx * kv.bytes_per_token)}`;
}

function forgetLine(store) {
  const r = store.forget;
  if (store.busy.forget) return "wiping and reading back…";
  if (!r) return "not run: the Forget button beside Send wipes and checks";
  return r.status === "wiped" ? `wiped ${r.buffers} buffers, every one read back as zero`
    : r.status === "nothing" ? `nothing to wipe in ${r.buffers} buffers` : `NOT wiped: ${r.after} non-zero words remain`;
}

function gpuLine(store) {
  if (!store.gpu) return "waiting for the worker…";
  const t = store.selftest;
  return `${store.gpu.name} (${store.gpu.backend}) · self-test ${!t ? "pending" : t.ok ? "pass" : "FAIL"}`;
}

export const LINES = {
  embedding: embeddingLine, residual: residualLine, attention: attentionLine, lens: lensLine, kv: kvLine,
  "forget-card": forgetLine, gpu: gpuLine,
};
