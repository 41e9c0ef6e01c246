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

// What a panel's last request cost: wall-clock time, and the work lab/probes.py says it did (on a CPU device the
// multiply-adds set the time, on a GPU the weight bytes read).
function cost(testid, ms, macs, bytes) {
  const work = macs ? `: ${si(macs, "")} multiply-adds over ${si(bytes, "B")} of weights` : "";
  return el("span", { class: "cost", testid, data: { ms, macs: macs || 0, bytes: bytes || 0 },
                      textContent: `${ms} ms${work}` });
}

// ---- embedding inspector ---------------------------------------------------------------------------------
// Diverging colour for an embedding value, scaled by the row's largest magnitude.
function diverging(v, scale) {
  const a = Math.min(1, Math.abs(v) / (scale || 1));
  return v >= 0 ? `rgba(201, 42, 42, ${a})` : `rgba(59, 91, 219, ${a})`;
}

export function renderEmbedding(store) {
  const body = $("embedding-body");
  const e = store.embedding;
  if (!e) {
    body.replaceChildren(el("p", { class: "muted", textContent: store.busy.embedding ? "computing…" : "Click a token in the context to inspect it." }));
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
// The position the residual panel shows: the clicked token, else the last one.
export function selectedPos(store) {
  if (store.selected != null && store.selected < store.context.length) return store.selected;
  return store.context.length ? store.context.length - 1 : null;
}

export function renderResidual(store) {
  const body = $("residual-body");
  const pos = selectedPos(store);
  const norms = pos == null ? null : store.probe.residual.get(pos);
  if (!norms) {
    const why = store.context.length ? (store.busy.inspect ? "computing…" : "waiting for the model") : "No conversation yet.";
    body.replaceChildren(el("p", { class: "muted", textContent: why }));
    return;
  }
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
function attnValue(a, layer, head, qi, c) {
  const w = a.end - a.start;
  return a.data[((layer * a.n_head + head) * w + qi) * (w + 1) + c];
}

function fillSelect(select, n, prefix, value) {
  if (select.options.length !== n) {
    select.replaceChildren(...Array.from({ length: n }, (_, i) => el("option", { value: i, textContent: `${prefix} ${i}` })));
  }
  select.value = String(value);
}

function headThumb(a, layer, head, selected, act) {
  const w = a.end - a.start;
  const c = el("canvas", { class: `thumb${selected ? " selected" : ""}`, width: w, height: w, title: `head ${head}`,
                           testid: "attention-thumb", data: { head } });
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(w, w);
  for (let qi = 0; qi < w; qi++) {
    for (let k = 0; k < w; k++) {
      const v = Math.sqrt(attnValue(a, layer, head, qi, k + 1));
      const o = 4 * (qi * w + k);
      img.data[o] = 255 - 196 * v; img.data[o + 1] = 255 - 164 * v; img.data[o + 2] = 255 - 36 * v; img.data[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  c.addEventListener("click", () => act.selectHead(head));
  return el("figure", {}, [c, el("figcaption", { textContent: `h${head}` })]);
}

export function renderAttention(store, act) {
  const body = $("attention-body");
  const a = store.probe.attention;
  if (!a) {
    const why = store.context.length ? (store.busy.inspect ? "computing…" : "waiting for the model") : "No conversation yet.";
    body.replaceChildren(el("p", { class: "muted", textContent: why }));
    return;
  }
  const layer = Math.min(store.attn.layer, a.n_layer - 1);
  const head = Math.min(store.attn.head, a.n_head - 1);
  fillSelect($("attention-layer"), a.n_layer, "layer", layer);
  fillSelect($("attention-head"), a.n_head, "head", head);
  const w = a.end - a.start;
  const label = (p) => shown(store.context[p] ? store.context[p].piece : "?");
  const grid = el("div", { class: "heatmap" });
  grid.style.gridTemplateColumns = `max-content repeat(${w + 1}, 1fr)`;
  grid.append(el("div", { class: "corner", textContent: "query ↓ key →" }),
    el("div", { class: "klabel", textContent: a.start ? `< ${a.start}` : "" , title: "attention on keys before the window" }));
  for (let k = 0; k < w; k++) grid.append(el("div", { class: "klabel", textContent: label(a.start + k), title: `key ${a.start + k}` }));
  for (let qi = 0; qi < w; qi++) {
    const q = a.start + qi;
    grid.append(el("div", { class: "qlabel", textContent: `${q} ${label(q)}` }));
    for (let c = 0; c <= w; c++) {
      const v = attnValue(a, layer, head, qi, c);
      const k = c === 0 ? "earlier" : a.start + c - 1;
      const masked = c > 0 && k > q;
      const cell = el("div", {
        class: `cell${masked ? " masked" : ""}`, testid: "attention-cell", data: { q, k, value: v },
        title: c === 0 ? `${q} ${label(q)} → keys before ${a.start}: ${fmt(v)}` : `${q} ${label(q)} → ${k} ${label(k)}: ${fmt(v)}`,
      });
      if (!masked) cell.style.background = `rgba(59, 91, 219, ${Math.sqrt(v)})`;
      grid.append(cell);
    }
  }
  const thumbs = el("div", { class: "thumbs" },
    Array.from({ length: a.n_head }, (_, h) => headThumb(a, layer, h, h === head, act)));
  body.replaceChildren(
    el("p", { class: "muted" }, [
      `layer ${layer}, head ${head}: positions ${a.start}..${a.end - 1} of ${a.n}; shade ∝ √p; `,
      cost("attention-cost", a.ms.pass)]),
    grid, el("h3", { textContent: `All heads of layer ${layer} (click one)` }), thumbs);
}

// ---- logit lens ------------------------------------------------------------------------------------------------
export function renderLens(store) {
  const body = $("lens-body");
  const lens = store.probe.lens;
  if (!lens) {
    const why = store.context.length ? (store.busy.inspect ? "computing…" : "waiting for the model") : "No conversation yet.";
    body.replaceChildren(el("p", { class: "muted", textContent: why }));
    return;
  }
  const cols = lens.end - lens.lens_start;
  const piece = (id) => shown(lens.pieces[String(id)]);
  const grid = el("div", { class: "lens" });
  grid.style.gridTemplateColumns = `max-content repeat(${cols}, minmax(4.5em, 1fr))`;
  grid.append(el("div", { class: "corner", textContent: "layer ↓ input →" }));
  for (let c = 0; c < cols; c++) {
    const p = lens.lens_start + c;
    grid.append(el("div", { class: "klabel", textContent: shown(store.context[p] ? store.context[p].piece : "?"), title: `position ${p}` }));
  }
  for (let layer = lens.lens.length - 1; layer >= 0; layer--) {
    grid.append(el("div", { class: "qlabel", textContent: `L${layer}` }));
    for (let c = 0; c < cols; c++) {
      const top = lens.lens[layer][c];
      const [id, p] = top[0];
      const cell = el("div", {
        class: "lcell", testid: "logit-lens-cell", data: { layer, pos: lens.lens_start + c, id, p },
        textContent: piece(id), title: top.map(([i, q]) => `${piece(i)}  ${fmt(q, 3)}`).join("\n"),
      });
      cell.style.background = `rgba(43, 138, 62, ${p})`;
      if (p > 0.6) cell.classList.add("dark");
      grid.append(cell);
    }
  }
  body.replaceChildren(el("p", { class: "muted" }, [
    `top-1 next token after each layer, shaded by its probability; top-5 on hover; pass ${lens.ms.pass} ms, lens `,
    cost("lens-cost", lens.ms.lens, lens.macs, lens.bytes)]), grid);
}

// ---- KV cache --------------------------------------------------------------------------------------------------
const fmtBytes = (n) => si(n, "B");

export function renderKv(store) {
  const body = $("kv-body");
  const kv = store.loaded && store.loaded.kv;
  if (!kv) { body.replaceChildren(el("p", { class: "muted", textContent: "load a model first" })); return; }
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
