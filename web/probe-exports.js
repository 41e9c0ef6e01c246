// What the four probe cards export (web/export.js): data() is exactly what the card shows (the same numbers as
// its cells' data-* attributes, at full precision), draw() its picture. Both read the store; neither computes
// anything about the model.
import {
  attnChoice, attnShade, attnValue, BLUE, GREEN, KV_K, KV_V, kvColumns, RED, selectedEmbedding, selectedPos, shown,
} from "/web/panels.js";
import { barsHeight, drawBars, drawHeatmap, drawLines, heatmapSize, linesHeight, sheet, textWidth, MONO } from "/web/pictures.js";

const range = (n) => Array.from({ length: n }, (_, i) => i);
const piece = (store, pos) => (store.context[pos] ? store.context[pos].piece : null);
const model = (store) => (store.model ? store.model.file_name : null);

// ---- embedding inspector ----------------------------------------------------------------------------------------
function embeddingData(store) {
  const e = selectedEmbedding(store);
  if (!e) return null;
  return { panel: "embedding", model: model(store), position: e.index, id: e.id, piece: e.piece, norm: e.norm,
           values: Array.from(e.values), neighbours: e.neighbours.map((n) => ({ id: n.id, piece: n.piece, cos: n.cos })),
           cost: { ms: e.ms, macs: e.macs, weight_bytes: e.weight_bytes },
           // gemma4: the row of per_layer_token_embd as stored, [n_layer][width], and each slice's L2 norm
           ...(e.per_layer ? { per_layer: {
             n_layer: e.per_layer.n_layer, width: e.per_layer.width, norms: Array.from(e.per_layer.norms),
             values: range(e.per_layer.n_layer).map((il) => Array.from(
               e.per_layer.values.subarray(il * e.per_layer.width, (il + 1) * e.per_layer.width))) } } : {}) };
}

const STRIP_ROW = 192;         // embedding values per row of the picture

function drawEmbedding(canvas, store) {
  const d = embeddingData(store);
  let scale = 0;
  for (const v of d.values) scale = Math.max(scale, Math.abs(v));
  const rows = Math.ceil(d.values.length / STRIP_ROW);
  const at = (r, c) => d.values[r * STRIP_ROW + c];
  const strip = {
    cols: range(STRIP_ROW).map(() => ""), rows: range(rows).map((r) => `dim ${r * STRIP_ROW}`), cellW: 4, cellH: 18,
    colour: (r, c) => (at(r, c) >= 0 ? RED : BLUE),
    alpha: (r, c) => (at(r, c) === undefined ? null : Math.min(1, Math.abs(at(r, c)) / (scale || 1))),
  };
  const size = heatmapSize(strip);
  const lines = d.neighbours.map((n, i) => `${String(i + 1).padStart(2)}. ${shown(n.piece).padEnd(16)} ${n.cos.toFixed(4)}  #${n.id}`);
  const pl = d.per_layer ? perLayerPicture(d.per_layer) : null;
  const below = size.height + 12 + linesHeight(lines.length + 1);
  const ctx = sheet(canvas, Math.max(size.width, textWidth(lines, MONO), pl ? pl.size.width : 0),
    below + (pl ? 12 + linesHeight(1) + pl.size.height : 0),
    `Embedding of ${shown(d.piece)} (id ${d.id}, position ${d.position})`,
    [`L2 norm ${d.norm.toFixed(4)} · ${d.values.length} values, red positive, blue negative, full colour at |v| = ${scale.toFixed(4)}`]);
  drawHeatmap(ctx, 0, strip);
  drawLines(ctx, size.height + 12, ["Nearest tokens by cosine over the whole embedding table:", ...lines]);
  if (pl) {
    drawLines(ctx, below + 12, [pl.title]);
    drawHeatmap(ctx, below + 12 + linesHeight(1), pl.spec);
  }
}

const PER_LAYER_WIDTH = 512;   // picture pixels across one layer's slice

// gemma4's per-layer row as a heatmap of one row a layer, each labelled with its layer and its slice's L2 norm.
function perLayerPicture(p) {
  let scale = 0;
  for (const row of p.values) for (const v of row) scale = Math.max(scale, Math.abs(v));
  const spec = {
    cols: range(p.width).map(() => ""), rows: p.norms.map((n, il) => `L${il} ${n.toFixed(3)}`),
    cellW: Math.max(2, Math.floor(PER_LAYER_WIDTH / p.width)), cellH: 12,
    colour: (r, c) => (p.values[r][c] >= 0 ? RED : BLUE), alpha: (r, c) => Math.min(1, Math.abs(p.values[r][c]) / (scale || 1)),
  };
  return { spec, size: heatmapSize(spec), title: `Per-layer embedding (per_layer_token_embd as stored): ${p.n_layer} `
    + `layers x ${p.width} dims (row label: layer, slice L2 norm), full colour at |v| = ${scale.toFixed(4)}` };
}

// ---- residual stream --------------------------------------------------------------------------------------------
function residualData(store) {
  const pos = selectedPos(store);
  const norms = pos == null ? null : store.probe.residual.get(pos);
  if (!norms) return null;
  return { panel: "residual", model: model(store), position: pos, id: store.context[pos].id, piece: piece(store, pos),
           norms: Array.from(norms, (value, slot) => ({ layer: slot - 1, value })) };   // layer -1: the embedding
}

function drawResidual(canvas, store) {
  const d = residualData(store);
  const labels = d.norms.map((n) => (n.layer < 0 ? "embd" : `L${n.layer}`));
  const values = d.norms.map((n) => n.value);
  const ctx = sheet(canvas, 560, barsHeight(labels.length),
    `Residual stream at position ${d.position} ${shown(d.piece)}`, ["‖h_l‖₂ after the embedding and after each layer"]);
  drawBars(ctx, 0, labels, values, 560, BLUE);
}

// ---- attention --------------------------------------------------------------------------------------------------
function attentionData(store) {
  const a = store.probe.attention;
  if (!a) return null;
  const { layer, head } = attnChoice(store);
  const w = a.end - a.start;
  const matrix = (h) => range(w).map((qi) => range(w + 1).map((c) => attnValue(a, layer, h, qi, c)));
  return { panel: "attention", model: model(store), layer, head, start: a.start, end: a.end, n: a.n,
           selected: selectedPos(store), positions: range(w).map((i) => a.start + i),
           pieces: range(w).map((i) => piece(store, a.start + i)),
           // p[q - start][0]: the query's mass on keys before the window; p[q - start][1 + k - start]: key k
           columns: ["earlier", ...range(w).map((i) => a.start + i)],
           p: matrix(head), heads: range(a.n_head).map(matrix), ms: a.ms };
}

function drawAttention(canvas, store) {
  const d = attentionData(store);
  const label = (p) => shown(piece(store, p));
  const spec = {
    cols: [d.start ? `< ${d.start}` : "", ...d.positions.map(label)], rows: d.positions.map((p) => `${p} ${label(p)}`),
    cellW: 14, cellH: 14, colour: BLUE, vertical: true, mark: { row: d.selected - d.start },
    alpha: (qi, c) => (c > 0 && c - 1 > qi ? null : attnShade(d.p[qi][c])),
  };
  const size = heatmapSize(spec);
  const ctx = sheet(canvas, size.width, size.height, `Attention, layer ${d.layer}, head ${d.head}`,
    [`query ↓ key →, positions ${d.start}..${d.end - 1} of ${d.n}; shade ∝ √p; selected query ${d.selected} outlined`]);
  drawHeatmap(ctx, 0, spec);
}

// ---- logit lens -------------------------------------------------------------------------------------------------
function lensData(store) {
  const lens = store.probe.lens;
  if (!lens) return null;
  const positions = range(lens.end - lens.lens_start).map((c) => lens.lens_start + c);
  const cells = [];
  lens.lens.forEach((perPos, layer) => perPos.forEach((top, c) => cells.push({
    layer, pos: positions[c], top: top.map(([id, p]) => ({ id, piece: lens.pieces[String(id)], p })),
  })));
  return { panel: "logit-lens", model: model(store), selected: selectedPos(store), positions,
           pieces: positions.map((p) => piece(store, p)), n_layer: lens.lens.length, cells, ms: lens.ms,
           cost: { macs: lens.macs, weight_bytes: lens.bytes } };
}

function drawLens(canvas, store) {
  const d = lensData(store);
  const lens = store.probe.lens;
  const layers = range(d.n_layer).reverse();
  const spec = {
    cols: d.pieces.map(shown), rows: layers.map((l) => `L${l}`), cellW: 64, cellH: 16, colour: GREEN,
    mark: { col: d.selected - d.positions[0] },
    alpha: (r, c) => lens.lens[layers[r]][c][0][1],
    text: (r, c) => shown(lens.pieces[String(lens.lens[layers[r]][c][0][0])]),
  };
  const size = heatmapSize(spec);
  const ctx = sheet(canvas, size.width, size.height, "Logit lens: softmax(W_out · norm(h_l)), top-1 per layer",
    [`layer ↓ input →, shaded by probability; positions ${d.positions[0]}..${d.positions.at(-1)}; selected ${d.selected} outlined`]);
  drawHeatmap(ctx, 0, spec);
}

// ---- KV cache ---------------------------------------------------------------------------------------------------
// What the heatmap shows: ‖k‖ and ‖v‖ of every layer's cached row at every position held (or, after Forget, the
// norms of what was read back).
function kvData(store) {
  const kv = store.loaded && store.loaded.kv;
  const cols = kv ? kvColumns(store) : [];
  if (!cols.length) return null;
  const after = store.kv.after;
  return { panel: "kv-cache", model: model(store), source: after ? "read back after Forget" : "read from the GPU",
           n_layer: kv.n_layer, n_ctx: kv.n_ctx, bytes_per_token: kv.bytes_per_token, used: store.kv.used,
           positions: cols.map((c) => c.pos), pieces: cols.map((c) => piece(store, c.pos)),
           // k[layer][j], v[layer][j]: the L2 norm of that layer's K (V) row at positions[j]
           k: range(kv.n_layer).map((il) => cols.map((c) => c.norms[2 * il])),
           v: range(kv.n_layer).map((il) => cols.map((c) => c.norms[2 * il + 1])),
           forget: after ? { before: after.before, after: after.after, lit: after.lit } : null };
}

function drawKv(canvas, store) {
  const d = kvData(store);
  const label = (j) => shown(d.pieces[j]) || String(d.positions[j]);
  const spec = (m, colour) => {
    let max = 0;
    for (const row of m) for (const x of row) max = Math.max(max, x);
    return { cols: d.positions.map((_, j) => label(j)), rows: range(d.n_layer).map((il) => `L${il}`), cellW: 12, cellH: 10,
             colour, vertical: true, alpha: (il, j) => (m[il][j] > 0 ? Math.sqrt(m[il][j] / max) : 0), max };
  };
  const ks = spec(d.k, KV_K), vs = spec(d.v, KV_V);
  const size = heatmapSize(ks);
  const ctx = sheet(canvas, size.width, 2 * size.height + linesHeight(2),
    `KV cache: ‖k‖ and ‖v‖ per layer and position (${d.source})`,
    [`positions ${d.positions[0]}..${d.positions.at(-1)} of ${d.n_ctx}; ${d.bytes_per_token.toLocaleString("en")} B per token; `
     + `shade √(x / max): ‖k‖ full at ${ks.max.toFixed(2)}, ‖v‖ full at ${vs.max.toFixed(2)}, white = 0`]);
  let y = drawLines(ctx, 0, ["‖k‖"]);
  y += drawHeatmap(ctx, y, ks);
  y += drawLines(ctx, y, ["‖v‖"]);
  drawHeatmap(ctx, y, vs);
}

// One line per card (web/export.js registerExport): the id of its element, and its data, picture and readiness.
export function probeExports(store) {
  return [
    ["embedding", { data: () => embeddingData(store), draw: (c) => drawEmbedding(c, store), ready: () => !!selectedEmbedding(store) }],
    ["residual", { data: () => residualData(store), draw: (c) => drawResidual(c, store) }],
    ["attention", { data: () => attentionData(store), draw: (c) => drawAttention(c, store), ready: () => !!store.probe.attention }],
    ["kv", { name: "kv-cache", data: () => kvData(store), draw: (c) => drawKv(c, store) }],
    ["lens", { name: "logit-lens", data: () => lensData(store), draw: (c) => drawLens(c, store), ready: () => !!store.probe.lens }],
  ];
}
