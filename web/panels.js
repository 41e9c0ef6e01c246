// The lab's panels: each renders one part of the store into its card. They compute nothing about the model;
// the numbers come from the worker (lab/probes.py, lab/forget.py). Event wiring stays in main.js, which passes
// the few callbacks a panel's own elements need (`act`).

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, children = []) {
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
function fillSelect(select, values, label, value) {
  const key = values.join(" ");
  if (select.dataset.values !== key) {
    select.dataset.values = key;
    select.replaceChildren(...values.map((v) => el("option", { value: v, textContent: label(v) })));
  }
  select.value = String(value);
}

const range = (n) => Array.from({ length: n }, (_, i) => i);

// What a panel's last request cost: wall-clock time, and the work lab/probes.py says it did (on a CPU device the
// multiply-adds set the time, on a GPU the weight bytes read).
function cost(testid, ms, macs, bytes) {
  const work = macs ? `: ${si(macs, "")} multiply-adds over ${si(bytes, "B")} of weights` : "";
  return el("span", { class: "cost", testid, data: { ms, macs: macs || 0, bytes: bytes || 0 },
                      textContent: `${ms} ms${work}` });
}

// ---- colours and the heatmap primitive ----------------------------------------------------------------------
// Shades are one colour at an opacity in [0, 1] over the white card.
const RED = [201, 42, 42];          // positive embedding values
const BLUE = [59, 91, 219];         // negative embedding values; attention (the page's --accent)
const GREEN = [43, 138, 62];        // logit-lens probability (the page's --good)
const WHITE = 255;
const DARK_TEXT_ABOVE = 0.6;        // a cell's text turns white on shades more opaque than this

const rgba = ([r, g, b], a) => `rgba(${r}, ${g}, ${b}, ${a})`;

// The grid of the attention and logit-lens panels: a corner, a label per column, then per row a label and a
// cell per column. cols, rows: [{textContent, title}]; cell(r, c) -> the cell's element props and `alpha`, its
// shade of `colour` (null: no value there, drawn as masked). `variant` names the panel's look in style.css.
function heatmap({ variant, colour, corner, cols, rows, cell }) {
  const grid = el("div", { class: `heatmap ${variant}` });
  grid.style.gridTemplateColumns = `max-content repeat(${cols.length}, var(--column))`;
  grid.append(el("div", { class: "corner", textContent: corner }), ...cols.map((c) => el("div", { class: "klabel", ...c })));
  rows.forEach((row, r) => {
    grid.append(el("div", { class: "qlabel", ...row }));
    for (let c = 0; c < cols.length; c++) {
      const { alpha, ...props } = cell(r, c);
      const shaded = alpha != null;
      const e = el("div", { class: !shaded ? "cell masked" : alpha > DARK_TEXT_ABOVE ? "cell dark" : "cell", ...props });
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

export function renderEmbedding(store) {
  const body = $("embedding-body");
  const e = store.embedding;
  if (!e) { placeholder(body, store.busy.embedding, "Click a token in the context to inspect it."); return; }
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
// The position the residual panel shows: the clicked token, else the last one.
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
    el("small", { class: "muted", textContent: " · click a token to choose another position" })]),
    el("div", { class: "bars" }, rows));
}

// ---- attention ---------------------------------------------------------------------------------------------
// p of query start + qi on column c: c = 0 is its mass on keys before the window, c = 1 + k the key start + k.
function attnValue(a, layer, head, qi, c) {
  const w = a.end - a.start;
  return a.data[((layer * a.n_head + head) * w + qi) * (w + 1) + c];
}

// Attention is shaded by √p, so that small weights stay visible.
const attnShade = (p) => Math.sqrt(p);

function headThumb(a, layer, head, selected, act) {
  const w = a.end - a.start;
  const c = heatmapPixels(w, w, BLUE, (qi, k) => attnShade(attnValue(a, layer, head, qi, k + 1)),
    { class: `thumb${selected ? " selected" : ""}`, title: `head ${head}`, testid: "attention-thumb", data: { head } });
  c.addEventListener("click", () => act.selectHead(head));
  return el("figure", {}, [c, el("figcaption", { textContent: `h${head}` })]);
}

export function renderAttention(store, act) {
  const body = $("attention-body");
  const a = store.probe.attention;
  if (!a) { probePlaceholder(body, store); return; }
  const layer = Math.min(store.attn.layer, a.n_layer - 1);
  const head = Math.min(store.attn.head, a.n_head - 1);
  fillSelect($("attention-layer"), range(a.n_layer), (i) => `layer ${i}`, layer);
  fillSelect($("attention-head"), range(a.n_head), (i) => `head ${i}`, head);
  const w = a.end - a.start;
  const label = (p) => shown(store.context[p] ? store.context[p].piece : "?");
  const grid = heatmap({
    variant: "attention", colour: BLUE, corner: "query ↓ key →",
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
  body.replaceChildren(
    el("p", { class: "muted" }, [
      `layer ${layer}, head ${head}: positions ${a.start}..${a.end - 1} of ${a.n}; shade ∝ √p; `,
      cost("attention-cost", a.ms.pass)]),
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
// (the worker's `loaded` stats, from lab/probes.py); no choice yet means all of them.
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
  const grid = heatmap({
    variant: "lens", colour: GREEN, corner: "layer ↓ input →",
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
  const k = lens.lens[0][0].length;                        // candidates per cell (lab/probes.py LENS_K)
  body.replaceChildren(el("p", { class: "muted" }, [
    `top-1 next token after each layer, shaded by its probability; top-${k} on hover; pass ${lens.ms.pass} ms, lens `,
    cost("lens-cost", lens.ms.lens, lens.macs, lens.bytes)]), grid);
}

// ---- KV cache --------------------------------------------------------------------------------------------------
export function renderKv(store) {
  const body = $("kv-body");
  const kv = store.loaded && store.loaded.kv;
  if (!kv) { placeholder(body, false, "load a model first"); return; }
  const used = store.kv.used;
  const layers = kv.window.map((win, il) => {
    const held = win ? Math.min(used, win) : used;
    const bar = el("div", { class: "bar" });
    bar.style.height = `${(100 * used) / kv.n_ctx}%`;
    return el("div", { class: "kv-layer", testid: "kv-layer", data: { layer: il, used, attended: held },
                       title: `layer ${il}: ${used} of ${kv.n_ctx} rows written${win ? `, attention sees the last ${win}` : ""}` },
      [el("div", { class: "bar-track" }, [bar])]);
  });
  body.replaceChildren(
    el("p", {}, ["bytes per token = 2 (K and V) × ", el("b", { textContent: kv.n_layer }), " layers × ",
      el("b", { textContent: kv.n_head_kv }), " KV heads × ", el("b", { textContent: kv.head_dim }), " head size × ",
      el("b", { textContent: kv.bytes_per_value }), " bytes = ",
      el("b", { testid: "kv-bytes-per-token", textContent: kv.bytes_per_token.toLocaleString("en") }), " B"]),
    el("p", { testid: "kv-used", data: { used, capacity: kv.n_ctx } },
      [`used ${used} of ${kv.n_ctx} tokens: ${fmtBytes(used * kv.bytes_per_token)} of ${fmtBytes(kv.n_ctx * kv.bytes_per_token)}`]),
    el("div", { class: "kv-layers", title: "fill per layer" }, layers));
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
