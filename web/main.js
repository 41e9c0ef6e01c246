// The page: one store, a worker that does all the work, and panels that only render.
// Nothing the user types or loads is stored (no localStorage, IndexedDB, cookies or URL state).

const store = { boot: "starting", gpu: null, selftest: null, model: null, error: null };
const worker = new Worker("/web/worker.js", { type: "module" });
const $ = (id) => document.getElementById(id);

function fmtBytes(n) {
  if (n == null) return "—";
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function renderFacts(el, rows) {
  el.replaceChildren(...rows.flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v == null ? "—" : String(v);
    dd.dataset.key = k;
    return [dt, dd];
  }));
}

function render() {
  $("boot").textContent = store.boot;
  if (store.gpu) {
    const g = store.gpu;
    renderFacts($("gpu-info"), [
      ["adapter", g.name], ["backend", g.backend], ["features", g.features.join(", ") || "none"],
      ["max binding", fmtBytes(g.limits.max_storage_buffer_binding_size)],
      ["max buffer", fmtBytes(g.limits.max_buffer_size)],
    ]);
  }
  const st = $("gpu-selftest");
  if (store.selftest) {
    const r = store.selftest;
    st.dataset.state = r.ok ? "pass" : "fail";
    st.textContent = `${r.ok ? "pass" : "FAIL"}: ${r.kernel} on ${r.n} values, max relative error ${r.max_rel_err.toExponential(2)}`
      + ` (got ${r.sample.got.toFixed(6)}, expected ${r.sample.expected.toFixed(6)})`;
  }
  const err = $("load-error");
  err.hidden = !store.error;
  err.textContent = store.error || "";
  if (store.model) {
    const m = store.model;
    const quant = Object.entries(m.type_bytes || {})
      .map(([t, b]) => `${t} ${fmtBytes(b)} (${m.type_counts[t]} tensors)`).join(", ");
    renderFacts($("model-info"), [
      ["file", m.file_name], ["architecture", m.architecture], ["name", m.name], ["layers", m.layers],
      ["embedding", m.embedding_size], ["heads", m.heads], ["KV heads", m.kv_heads], ["vocabulary", m.vocab_size],
      ["tokenizer", `${m.tokenizer_model ?? "—"} / ${m.tokenizer_pre ?? "—"}`], ["context", m.context_length],
      ["tensors", m.tensor_count], ["quant types", quant], ["file size", fmtBytes(m.file_size)],
      ["header read", `${fmtBytes(m.prefix_bytes)} in ${m.parse_ms} ms`],
    ]);
  } else {
    $("model-info").replaceChildren();
  }
}

worker.onmessage = (e) => {
  const m = e.data;
  switch (m.type) {
    case "status": store.boot = m.text; break;
    case "booted": store.boot = `ready: Python ${m.python} booted in ${(m.ms / 1000).toFixed(1)} s`; break;
    case "gpu": store.gpu = m.info; break;
    case "selftest": store.selftest = m.result; break;
    case "model-info": store.model = m.summary; store.error = null; break;
    case "error":
      if (m.where === "inspect") { store.error = m.message; store.model = null; }
      else if (m.where === "init") { store.error = m.message; store.boot = "no GPU: the lab cannot run here"; }
      else { store.error = `${m.where}: ${m.message}`; }
      break;
  }
  render();
};
worker.onerror = (e) => { store.error = `worker: ${e.message}`; render(); };

function inspect(file) {
  if (!file) return;
  store.error = null;
  worker.postMessage({ type: "inspect", file });
}

$("model-file").addEventListener("change", (e) => inspect(e.target.files[0]));
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  inspect(e.dataTransfer.files[0]);
});

worker.postMessage({ type: "init" });
render();
