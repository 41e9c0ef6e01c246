// The page: one store, a worker that does all the work, and panels that only render.
// Nothing the user types or loads is stored (no localStorage, IndexedDB, cookies or URL state).

const store = {
  boot: "starting", gpu: null, selftest: null, error: null,
  model: null, loading: null, loaded: null,             // header summary, progress, load stats
  messages: [],                                          // [{role, content}] of the conversation
  context: [],                                           // [{id, piece}] tokens the model has seen or made
  generating: false, timings: null,
};
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

function renderModel() {
  const err = $("load-error");
  err.hidden = !store.error;
  err.textContent = store.error || "";
  const busy = !!store.loading;
  $("progress").hidden = !busy;
  $("model-file").disabled = busy || !store.gpu;
  $("load-default").disabled = busy || !store.gpu || $("load-default").textContent.startsWith("No default");
  if (busy) {
    const p = store.loading;
    $("load-bar").value = p.total ? p.done / p.total : 0;
    const eta = p.eta_s == null ? "" : `, ${p.eta_s.toFixed(1)} s left`;
    $("load-text").textContent = p.total
      ? `${(p.done / 1e6).toFixed(1)} / ${(p.total / 1e6).toFixed(1)} MB, ${p.mb_s.toFixed(1)} MB/s${eta}`
      : "reading the header…";
  }
  if (!store.model) { $("model-info").replaceChildren(); return; }
  const m = store.model;
  const quant = Object.entries(m.type_bytes || {})
    .map(([t, b]) => `${t} ${fmtBytes(b)} (${m.type_counts[t]} tensors)`).join(", ");
  const rows = [
    ["file", m.file_name], ["architecture", m.architecture], ["name", m.name], ["layers", m.layers],
    ["embedding", m.embedding_size], ["heads", m.heads], ["KV heads", m.kv_heads], ["vocabulary", m.vocab_size],
    ["tokenizer", `${m.tokenizer_model ?? "—"} / ${m.tokenizer_pre ?? "—"}`], ["context", m.context_length],
    ["tensors", m.tensor_count], ["quant types", quant], ["file size", fmtBytes(m.file_size)],
    ["header read", `${fmtBytes(m.prefix_bytes)} in ${m.parse_ms} ms`],
  ];
  if (store.loaded) {
    const l = store.loaded;
    rows.push(["status", "loaded"], ["weights on GPU", fmtBytes(l.weight_bytes)],
      ["upload", `${l.upload_s.toFixed(2)} s, ${l.upload_mb_s} MB/s`], ["KV cache", `${l.n_ctx} tokens, ${fmtBytes(l.kv_bytes_per_token)} per token`],
      ["dispatches / token", l.dispatches_per_token]);
  }
  renderFacts($("model-info"), rows);
}

function renderGpu() {
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
}

function messageEl(msg) {
  const el = document.createElement("div");
  el.className = `message ${msg.role}`;
  el.setAttribute("data-testid", "message");
  el.dataset.role = msg.role;
  el.textContent = msg.content;
  return el;
}

function renderChat() {
  const box = $("messages");
  box.replaceChildren(...store.messages.map(messageEl));
  box.scrollTop = box.scrollHeight;
  const ready = !!store.loaded && !store.generating;
  $("prompt").disabled = !store.loaded;
  $("prompt").placeholder = store.loaded ? "Ask something" : "load a model first";
  $("send").disabled = !ready;
  $("stop").disabled = !store.generating;
  renderTokens();
  const t = store.timings;
  $("timings").textContent = t
    ? `first token ${(t.ttft_s * 1000).toFixed(0)} ms · prefill ${t.prefill_tok_s.toFixed(1)} tok/s · decode ${t.decode_tok_s.toFixed(1)} tok/s · ${t.ids.length} tokens (${t.stop})`
    : "";
  $("reuse").textContent = t ? `prefilled ${t.prefilled}, reused ${t.reused}` : "";
}

function tokenEl(tok, index) {
  const s = document.createElement("span");
  s.className = "tok";
  s.setAttribute("data-testid", "token");
  s.dataset.index = index;
  s.dataset.id = tok.id;
  s.textContent = tok.piece;
  s.title = `#${index} id ${tok.id}`;
  return s;
}

function renderTokens() {
  const strip = $("tokens");
  while (strip.children.length > store.context.length) strip.lastChild.remove();
  for (let i = strip.children.length; i < store.context.length; i++) strip.appendChild(tokenEl(store.context[i], i));
  $("context-count").textContent = store.context.length ? `(${store.context.length} tokens)` : "";
}

function render() {
  $("boot").textContent = store.boot;
  renderGpu();
  renderModel();
  renderChat();
}

worker.onmessage = (e) => {
  const m = e.data;
  switch (m.type) {
    case "status": store.boot = m.text; break;
    case "booted": store.boot = `ready: Python ${m.python} booted in ${(m.ms / 1000).toFixed(1)} s`; break;
    case "gpu": store.gpu = m.info; break;
    case "selftest": store.selftest = m.result; break;
    case "model-info": store.model = m.summary; store.error = null; break;
    case "load-progress": store.loading = m; store.lastProgress = m; break;
    case "loaded":
      store.loaded = m.stats; store.loading = null;
      if (store.lastProgress) store.loaded.wasm_heap_growth = store.lastProgress.wasm_heap_growth;
      break;
    case "prompt":
      store.context = m.ids.map((id, i) => ({ id, piece: m.pieces[i] }));
      store.messages.push({ role: "assistant", content: "" });
      break;
    case "token": {
      store.context.push({ id: m.id, piece: m.piece });
      store.messages[store.messages.length - 1].content += m.text;
      break;
    }
    case "done":
      store.generating = false;
      store.timings = m.result;
      store.messages[store.messages.length - 1].content = m.result.text;
      break;
    case "reset": break;
    case "error":
      if (m.where === "inspect" || m.where === "load") {
        store.error = m.message; store.loading = null; store.loaded = null;
        if (m.where === "inspect") store.model = null;
      } else if (m.where === "init") {
        store.error = m.message; store.boot = "no GPU: the lab cannot run here";
      } else if (m.where === "chat") {
        store.error = `chat: ${m.message}`; store.generating = false;
        if (store.messages.length && store.messages.at(-1).role === "assistant" && !store.messages.at(-1).content) store.messages.pop();
      } else {
        store.error = `${m.where}: ${m.message}`;
      }
      break;
  }
  render();
};
worker.onerror = (e) => { store.error = `worker: ${e.message}`; render(); };

function load(file) {
  if (!file) return;
  store.error = null; store.loaded = null; store.model = null;
  store.loading = { done: 0, total: 0 };
  newChat();
  worker.postMessage({ type: "load", file });
  render();
}

async function loadDefault() {
  store.error = null;
  store.loading = { done: 0, total: 0 };
  render();
  try {
    const r = await fetch("/models/default.gguf");
    if (!r.ok) throw new Error(`the default model could not be fetched (HTTP ${r.status})`);
    const name = r.headers.get("X-Model-Name") || "default.gguf";
    load(new File([await r.blob()], name));
  } catch (err) {
    store.loading = null; store.error = String(err.message || err); render();
  }
}

function settings() {
  const num = (id) => Number($(id).value);
  return { greedy: $("greedy").checked, temperature: num("temperature"), top_p: num("top-p"),
           top_k: num("top-k"), seed: num("seed") };
}

function send() {
  const text = $("prompt").value;
  if (!store.loaded || store.generating || !text.trim()) return;
  store.error = null;
  const system = $("system-prompt").value.trim();
  store.messages.push({ role: "user", content: text });
  const convo = (system ? [{ role: "system", content: system }] : []).concat(store.messages);
  store.generating = true;
  $("prompt").value = "";
  worker.postMessage({ type: "chat", messages: convo, settings: settings(), max_new: Number($("max-tokens").value) });
  render();
}

function newChat() {
  if (store.generating) worker.postMessage({ type: "stop" });
  store.messages = []; store.context = []; store.timings = null;
  $("tokens").replaceChildren();
  render();
}

$("model-file").addEventListener("change", (e) => load(e.target.files[0]));
$("load-default").addEventListener("click", loadDefault);
$("load-cancel").addEventListener("click", () => worker.postMessage({ type: "cancel-load" }));
$("send").addEventListener("click", send);
$("stop").addEventListener("click", () => worker.postMessage({ type: "stop" }));
$("new-chat").addEventListener("click", newChat);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
});
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  load(e.dataTransfer.files[0]);
});

worker.postMessage({ type: "init" });
render();
