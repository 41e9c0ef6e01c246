// Canvas pictures of the cards, for their PNG export (web/export.js). The shading is drawn again from the data, not
// captured from the page: the page's Content-Security-Policy allows no data: or blob: image, which painting the DOM
// into a canvas would need.
import { rgba } from "/web/panels.js";

const SCALE = 2;                                   // canvas pixels per CSS pixel: text stays crisp in the PNG
const PAD = 14;                                    // margin around the picture
const TITLE = "bold 14px system-ui, sans-serif";
export const TEXT = "12px system-ui, sans-serif";
export const MONO = "11px ui-monospace, monospace";
const INK = "#1d2330", MUTED = "#5d6679", MASKED = "#f1f3f5", SEL = "#e8590c";
const LINE = 16;                                   // height of a line of text

const scratch = document.createElement("canvas").getContext("2d");

export function textWidth(texts, font) {
  scratch.font = font;
  let w = 0;
  for (const t of texts) w = Math.max(w, scratch.measureText(t).width);
  return Math.ceil(w);
}

// Sizes the canvas for `width` x `height` CSS pixels of content below a title and lines of notes, paints it white,
// writes them, and returns a context whose origin is the content's top-left corner.
export function sheet(canvas, width, height, title, notes = []) {
  const head = LINE + 6 + notes.length * LINE + 8;
  const w = Math.max(width, textWidth([title], TITLE), textWidth(notes, TEXT)) + 2 * PAD;
  canvas.width = Math.ceil(w * SCALE);
  canvas.height = Math.ceil((head + height + 2 * PAD) * SCALE);
  const ctx = canvas.getContext("2d");
  ctx.scale(SCALE, SCALE);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, w, head + height + 2 * PAD);
  ctx.textBaseline = "top";
  ctx.fillStyle = INK;
  ctx.font = TITLE;
  ctx.fillText(title, PAD, PAD);
  ctx.fillStyle = MUTED;
  ctx.font = TEXT;
  notes.forEach((n, i) => ctx.fillText(n, PAD, PAD + LINE + 6 + i * LINE));
  ctx.translate(PAD, PAD + head);
  return ctx;
}

// Lines of text; returns their height.
export function drawLines(ctx, y, lines, font = MONO) {
  ctx.font = font;
  ctx.fillStyle = INK;
  lines.forEach((t, i) => ctx.fillText(t, 0, y + i * LINE));
  return lines.length * LINE;
}
export const linesHeight = (n) => n * LINE;

// ---- the heatmap: column labels on top (vertical when `vertical`), row labels on the left, a cell per (row,
// column) shaded `colour` (an [r, g, b], or a function of (r, c) giving one) at alpha(r, c) (null: masked), optional
// text(r, c) in it, mark.row / mark.col outlined.
function heatmapGeometry(spec) {
  const left = textWidth(spec.rows, MONO) + 8;
  const top = spec.vertical ? Math.min(textWidth(spec.cols, MONO), 90) + 8 : LINE + 4;
  return { left, top, width: left + spec.cols.length * spec.cellW, height: top + spec.rows.length * spec.cellH };
}

export const heatmapSize = (spec) => heatmapGeometry(spec);

export function drawHeatmap(ctx, y0, spec) {
  const { cols, rows, cellW, cellH, colour, alpha, text, vertical, mark = {} } = spec;
  const g = heatmapGeometry(spec);
  ctx.save();
  ctx.translate(0, y0);
  ctx.font = MONO;
  ctx.textBaseline = "middle";
  cols.forEach((label, c) => {
    ctx.fillStyle = c === mark.col ? SEL : INK;
    const x = g.left + c * cellW + cellW / 2;
    if (vertical) {
      ctx.save();
      ctx.translate(x, g.top - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(label, 0, 0, g.top - 8);
      ctx.restore();
    } else {
      ctx.textAlign = "center";
      ctx.fillText(label, x, g.top / 2, cellW - 2);
    }
  });
  rows.forEach((label, r) => {
    const y = g.top + r * cellH;
    ctx.textAlign = "right";
    ctx.fillStyle = r === mark.row ? SEL : INK;
    ctx.fillText(label, g.left - 6, y + cellH / 2);
    for (let c = 0; c < cols.length; c++) {
      const x = g.left + c * cellW;
      const a = alpha(r, c);
      ctx.fillStyle = a == null ? MASKED : rgba(typeof colour === "function" ? colour(r, c) : colour, a);
      ctx.fillRect(x, y, cellW - 1, cellH - 1);
      if (text) {
        ctx.fillStyle = a != null && a > 0.6 ? "#fff" : INK;
        ctx.textAlign = "center";
        ctx.fillText(text(r, c), x + cellW / 2, y + cellH / 2, cellW - 4);
      }
    }
  });
  ctx.strokeStyle = SEL;
  ctx.lineWidth = 2;
  if (mark.row != null && mark.row >= 0 && mark.row < rows.length) {
    ctx.strokeRect(g.left - 1, g.top + mark.row * cellH - 1, cols.length * cellW + 1, cellH + 1);
  }
  if (mark.col != null && mark.col >= 0 && mark.col < cols.length) {
    ctx.strokeRect(g.left + mark.col * cellW - 1, g.top - 1, cellW + 1, rows.length * cellH + 1);
  }
  ctx.restore();
  return g.height;
}

// ---- horizontal bars: a label, a bar of length value / max, the value ------------------------------------------
export const barsHeight = (n) => n * (LINE - 2);

// `full`: the value a full bar stands for (default: the largest value).
export function drawBars(ctx, y0, labels, values, width, colour, digits = 2, full = null) {
  const max = full ?? Math.max(...values, 1e-30);
  const texts = values.map((v) => v.toFixed(digits));
  const left = textWidth(labels, MONO) + 8, right = textWidth(texts, MONO) + 8;
  const h = LINE - 2;
  ctx.save();
  ctx.translate(0, y0);
  ctx.font = MONO;
  ctx.textBaseline = "middle";
  labels.forEach((label, i) => {
    const y = i * h;
    ctx.fillStyle = INK;
    ctx.textAlign = "right";
    ctx.fillText(label, left - 6, y + h / 2);
    ctx.fillStyle = MASKED;
    ctx.fillRect(left, y + 2, width - left - right, h - 4);
    ctx.fillStyle = rgba(colour, 1);
    ctx.fillRect(left, y + 2, ((width - left - right) * values[i]) / max, h - 4);
    ctx.fillStyle = INK;
    ctx.fillText(texts[i], width - 2, y + h / 2);
  });
  ctx.restore();
  return labels.length * h;
}
