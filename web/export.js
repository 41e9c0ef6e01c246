// Export: a card's data as JSON and its picture as PNG, made in the page and handed to the browser as a download
// (a Blob behind an object URL, revoked soon after; nothing goes over the network, nothing is stored).
//
// A card registers once, with one line (main.js does it for every card):
//
//   registerExport("kv", { data: () => kvData(store), draw: (canvas) => drawKv(canvas, store) });
//
// - "kv" is the card's element id; its buttons ("export-json", "export-png") are put after its first <h2>.
// - data() returns what the card shows now as plain JSON-able values, or null while it shows nothing (the buttons
//   are then disabled: refreshExports() checks after each render).
// - draw(canvas) sizes the canvas and paints the card's picture (web/pictures.js has a heatmap, bars and text).
// - ready() (optional) says cheaply whether data() would return something; default: data() != null.
// - name (optional) is the files' stem, default the id: llm-lab-<name>.json, llm-lab-<name>.png.

const cards = new Map();     // card id -> {ready, json, png}
const urls = new Set();      // object URLs not yet revoked (Forget revokes them at once: revokeExports)
const KEEP_URL_MS = 10_000;  // long enough for the download to take the Blob; the URL is then dropped

export function registerExport(id, { data, draw, ready = () => data() != null, name = id }) {
  const card = document.getElementById(id);
  const json = button("export-json", "JSON", `${name}: the numbers this card shows, as JSON`);
  const png = button("export-png", "PNG", `${name}: this card's picture, as PNG`);
  json.addEventListener("click", () => {
    const d = data();
    if (d != null) save(new Blob([JSON.stringify(d, null, 1)], { type: "application/json" }), `llm-lab-${name}.json`);
  });
  png.addEventListener("click", () => {
    if (data() == null) return;
    const canvas = document.createElement("canvas");
    draw(canvas);
    canvas.toBlob((blob) => save(blob, `llm-lab-${name}.png`), "image/png");
  });
  const box = document.createElement("div");
  box.className = "exports";
  box.append(json, png);
  const h2 = card.querySelector("h2");
  if (h2) h2.after(box); else card.prepend(box);
  cards.set(id, { ready, json, png });
}

// Enables each card's buttons when it has something to export.
export function refreshExports() {
  for (const { ready, json, png } of cards.values()) json.disabled = png.disabled = !ready();
}

export function revokeExports() {
  for (const url of urls) URL.revokeObjectURL(url);
  urls.clear();
}

function button(testid, text, title) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.title = title;
  b.setAttribute("data-testid", testid);
  return b;
}

function save(blob, fileName) {
  const url = URL.createObjectURL(blob);
  urls.add(url);
  const a = document.createElement("a");
  a.href = url;
  a.download = fileName;
  a.click();
  setTimeout(() => { URL.revokeObjectURL(url); urls.delete(url); }, KEEP_URL_MS);
}
