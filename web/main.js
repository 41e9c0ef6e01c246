// The page: one store, a worker that does all the work, and panels that only render (web/panels.js).
// Nothing the user types or loads is stored (no localStorage, IndexedDB, cookies or URL state).
import {
  fmtBytes, lensPositions, renderAttention, renderEmbedding, renderForget, renderKv, renderLens, renderResidual, selectedPos,
} from "/web/panels.js";

const store = {
  boot: "starting", gpu: null, selftest: null, error: null,
  model: null,                                           // the file's header summary ("model-info")
  loading: null,                                         // while loading: the last "load-progress"
  loadSeq: 0,                                            // the newest load asked of the worker (its messages carry it)
  loaded: null,                                          // the "loaded" stats, with the upload's wasm_heap_growth
  messages: [],                                          // [{role, content}] of the conversation
  context: [],                                           // [{id, piece}] tokens the model has seen or made
  generating: false, timings: null,
  dropTurn: false,                                       // the conversation was cleared mid-turn: ignore its tail
  // panels (opt-in: nothing is computed for a closed panel)
  panels: { embedding: false, attention: false, lens: false, residual: false },
  selected: null,                                        // context position clicked
  embedding: null,                                       // the worker's "embedding" message
  probe: freshProbe(),                                   // the worker's inspections of this conversation
  attn: { layer: 0, head: 0 },                           // the attention panel's choice
  lens: { positions: null },                             // logit-lens positions chosen; null: all (panels.js lensPositions)
  kv: { used: 0 },                                       // KV-cache rows the session holds
  forget: null,                                          // the last Forget report
  busy: { embedding: false, inspect: 0, forget: false },
};

function freshProbe() {
  return { attention: null, lens: null, residual: new Map() };  // residual: position -> Float32Array [n_layer + 1]
}
const worker = new Worker("/web/worker.js", { type: "module" });
const $ = (id) => document.getElementById(id);

// Tokens per second; slow devices (a CPU rasterizer) run under one, where a single decimal would read 0.0.
const rate = (x) => x.toFixed(x < 1 ? 2 : 1);

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
  $("model-file").disabled = !store.gpu;      // a pick during a load cancels it: the newest pick wins (load())
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
      ["dispatches / token", l.dispatches_per_token],
      ["wasm heap growth", l.wasm_heap_growth == null ? null : fmtBytes(l.wasm_heap_growth)]);
    $("model-info").dataset.wasmHeapGrowth = l.wasm_heap_growth ?? "";
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
  } else {   // before the first self-test, and again while a lost GPU is replaced
    st.dataset.state = "pending";
    st.textContent = "self-test pending";
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
    ? `first token ${(t.ttft_s * 1000).toFixed(0)} ms · prefill ${rate(t.prefill_tok_s)} tok/s · decode ${rate(t.decode_tok_s)} tok/s · ${t.ids.length} tokens (${t.stop})`
    : "";
  $("reuse").textContent = t ? `prefilled ${t.prefilled}, reused ${t.reused}` : "";
}

function tokenEl(tok, index) {
  const s = document.createElement("span");
  s.className = "tok";
  s.tabIndex = 0;
  s.setAttribute("data-testid", "token");
  s.dataset.index = index;
  s.dataset.id = tok.id;
  s.textContent = tok.piece;
  s.title = `#${index} id ${tok.id}`;
  return s;
}

// The strip follows store.context: a token's element depends only on its id and index, so the leading elements that
// still match are kept and the rest rebuilt (a new prompt replaces the context, a generated token extends it).
function renderTokens() {
  const strip = $("tokens");
  const ctx = store.context;
  let keep = 0;
  while (keep < strip.children.length && keep < ctx.length && Number(strip.children[keep].dataset.id) === ctx[keep].id) keep++;
  while (strip.children.length > keep) strip.lastChild.remove();
  for (let i = keep; i < ctx.length; i++) strip.appendChild(tokenEl(ctx[i], i));
  for (const s of strip.querySelectorAll(".tok.selected")) s.classList.remove("selected");
  if (store.selected != null && strip.children[store.selected]) strip.children[store.selected].classList.add("selected");
  $("context-count").textContent = store.context.length ? `(${store.context.length} tokens)` : "";
}

const panelActions = { selectHead: (h) => { store.attn.head = h; render(); } };

function render() {
  $("boot").textContent = store.boot;
  renderGpu();
  renderModel();
  renderChat();
  for (const d of document.querySelectorAll("details[data-panel]")) d.open = store.panels[d.dataset.panel];
  renderEmbedding(store);
  renderResidual(store);
  renderAttention(store, panelActions);
  renderLens(store);
  renderKv(store);
  renderForget(store);
}

// ---- panel requests: ask the worker for what the open panels need and the store lacks -------------------
function requestInspect() {
  const n = store.context.length;
  if (!store.loaded || store.generating || !n || store.busy.inspect || store.dropTurn) return;
  const p = store.probe;
  const lens = Math.min(lensPositions(store), n);
  const wantAttention = store.panels.attention && !p.attention;
  const wantLens = store.panels.lens && !(p.lens && p.lens.end - p.lens.lens_start >= lens);
  const pos = selectedPos(store);
  const wantResidual = store.panels.residual && pos != null && !p.residual.has(pos);
  const window = store.loaded.probe.window;
  const requests = [];
  if (wantAttention || wantLens) {
    const inWindow = pos != null && pos >= n - window;
    requests.push({ attention: wantAttention, lens: wantLens ? lens : 0, residual: wantResidual && inWindow });
    if (wantResidual && !inWindow) requests.push({ start: pos, end: pos + 1, residual: true });
  } else if (wantResidual) {
    requests.push({ start: pos, end: pos + 1, residual: true });
  }
  for (const r of requests) worker.postMessage({ type: "probe-inspect", ...r });
  store.busy.inspect = requests.length;
}

function onInspection(m) {
  const p = store.probe;
  if (m.attention) p.attention = { start: m.start, end: m.end, n: m.n, n_layer: m.n_layer, n_head: m.n_head, data: m.attention, ms: m.ms };
  if (m.lens) {
    p.lens = { lens_start: m.lens_start, end: m.end, lens: m.lens, pieces: m.pieces, ms: m.ms,
               macs: m.lens_macs, bytes: m.lens_bytes };
  }
  if (m.residual) {
    const w = m.end - m.start;
    for (let i = 0; i < w; i++) {
      p.residual.set(m.start + i, Float32Array.from({ length: m.n_layer + 1 }, (_, s) => m.residual[s * w + i]));
    }
  }
}

function selectToken(index) {
  const tok = store.context[index];
  if (!tok || !store.loaded) return;
  store.selected = index;
  store.panels.embedding = true;
  if (!(store.embedding && store.embedding.index === index && store.embedding.id === tok.id)) {
    store.embedding = null;
    store.busy.embedding = true;
    worker.postMessage({ type: "probe-embedding", id: tok.id, index });
  }
  requestInspect();
  render();
}

// Empties every trace of the conversation the page holds (DOM included, by re-rendering).
function clearConversation() {
  // A turn in flight is stopped; its remaining messages are dropped, and `generating` stays set until its
  // "done" arrives, so no new turn starts before the worker is free.
  if (store.generating) { worker.postMessage({ type: "stop" }); store.dropTurn = true; }
  store.messages = []; store.context = []; store.timings = null;
  store.selected = null; store.embedding = null; store.probe = freshProbe(); store.kv.used = 0;
}

function forgetAll() {
  clearConversation();
  $("prompt").value = "";
  $("system-prompt").value = "";
  store.forget = null;
  store.busy.forget = true;
  worker.postMessage({ type: "forget" });
  render();
}

// Test hook (tests/browser/test_kernels_in_worker.py): runs kernel cases in the worker through lab/kernelcheck.py on
// inputs given in base64 and resolves with their outputs. The worker makes and frees its own buffers for them; the
// store, the page and the conversation are not touched.
const kernelChecks = new Map();   // id -> {resolve, reject}
let kernelCheckId = 0;
window.labKernelCheck = (cases) => new Promise((resolve, reject) => {
  const id = ++kernelCheckId;
  kernelChecks.set(id, { resolve, reject });
  worker.postMessage({ type: "kernel-check", id, cases });
});

function settleKernelCheck(m) {
  const p = kernelChecks.get(m.id);
  kernelChecks.delete(m.id);
  if (p) m.error ? p.reject(new Error(m.error)) : p.resolve(m);
}

// ---- worker messages: each handler updates the store; the page is then re-rendered from it ----------------------
// Keyed by the message types lab/worker.py (and web/worker.js) post.
const onWorker = {
  status: (m) => { store.boot = m.text; },
  booted: (m) => { store.boot = `ready: Python ${m.python} booted in ${(m.ms / 1000).toFixed(1)} s`; },
  gpu: (m) => { if (store.boot === "GPU lost") store.boot = "ready: a new GPU device"; store.gpu = m.info; },
  selftest: (m) => { store.selftest = m.result; },
  "model-info": (m) => { if (current(m)) { store.model = m.summary; store.error = null; } },
  "load-progress": (m) => { if (current(m)) store.loading = m; },
  loaded: (m) => {
    if (!current(m)) return;
    store.loaded = { ...m.stats, wasm_heap_growth: store.loading?.wasm_heap_growth };
    store.loading = null; store.kv.used = 0;
  },
  prompt: (m) => {
    if (store.dropTurn) return;
    store.context = m.ids.map((id, i) => ({ id, piece: m.pieces[i] }));
    store.probe = freshProbe();
    store.messages.push({ role: "assistant", content: "" });
  },
  token: (m) => {
    if (store.dropTurn) return;
    store.context.push({ id: m.id, piece: m.piece });
    store.messages.at(-1).content += m.text;
    store.kv.used = m.kv_used;
  },
  done: (m) => {
    store.generating = false;
    if (store.dropTurn) { store.dropTurn = false; return; }
    store.timings = m.result;
    store.messages.at(-1).content = m.result.text;
    store.kv.used = m.result.kv_used;
    requestInspect();
  },
  embedding: (m) => {
    store.busy.embedding = false;
    if (m.index === store.selected) store.embedding = m;
  },
  inspection: (m) => {
    store.busy.inspect = Math.max(0, store.busy.inspect - 1);
    if (m.n === store.context.length) onInspection(m);
    if (!store.busy.inspect) requestInspect();
  },
  forget: (m) => { store.busy.forget = false; store.forget = m.report; },
  error: (m) => {
    if (onError[m.where]) onError[m.where](m);
    else store.error = `${m.where}: ${m.message}`;
  },
};

// A load's messages carry the seq the page gave it; those of a load given up on (another file picked) are dropped.
const current = (m) => m.seq == null || m.seq === store.loadSeq;

function loadFailed(m) {
  if (!current(m)) return;
  store.error = m.message; store.loading = null; store.loaded = null;
}

// Keyed by `where`: the type of the message whose handling failed, or "device" when the GPU was lost.
const onError = {
  "read-header": (m) => { if (current(m)) { loadFailed(m); store.model = null; } },
  load: loadFailed,
  init: (m) => { store.error = m.message; store.boot = "no GPU: the lab cannot run here"; },
  device: (m) => {   // the worker asks for a new device at once: its "gpu" message makes loading possible again
    clearConversation(); store.dropTurn = false;
    store.error = m.message; store.boot = "GPU lost"; store.loaded = null; store.loading = null;
    store.generating = false; store.gpu = null; store.selftest = null;
  },
  chat: (m) => {
    store.error = `chat: ${m.message}`; store.generating = false; store.dropTurn = false;
    const last = store.messages.at(-1);
    if (last && last.role === "assistant" && !last.content) store.messages.pop();
  },
  "probe-inspect": (m) => { store.error = `panels: ${m.message}`; store.busy.inspect = Math.max(0, store.busy.inspect - 1); },
  "probe-embedding": (m) => { store.error = `embedding: ${m.message}`; store.busy.embedding = false; },
  forget: (m) => { store.error = `forget: ${m.message}`; store.busy.forget = false; },
};

worker.onmessage = (e) => {
  const m = e.data;
  if (m.type === "kernel-check") { settleKernelCheck(m); return; }
  if (onWorker[m.type]) onWorker[m.type](m);
  render();
};
worker.onerror = (e) => { store.error = `worker: ${e.message}`; render(); };

function load(file) {
  if (!file) return;
  if (store.loading) worker.postMessage({ type: "cancel-load" });   // the newest pick wins
  store.error = null; store.loaded = null; store.model = null;
  store.loading = { done: 0, total: 0 };
  newChat();
  worker.postMessage({ type: "load", file, seq: ++store.loadSeq });
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
  clearConversation();
  render();
}

$("model-file").addEventListener("change", (e) => {
  load(e.target.files[0]);
  e.target.value = "";     // the same file picked again (after a lost GPU, a cancel) must fire `change` again
});
$("load-default").addEventListener("click", loadDefault);
$("load-cancel").addEventListener("click", () => worker.postMessage({ type: "cancel-load" }));
$("send").addEventListener("click", send);
$("stop").addEventListener("click", () => worker.postMessage({ type: "stop" }));
$("new-chat").addEventListener("click", newChat);
$("forget").addEventListener("click", forgetAll);
$("tokens").addEventListener("click", (e) => {
  const t = e.target.closest("[data-testid=token]");
  if (t) selectToken(Number(t.dataset.index));
});
$("tokens").addEventListener("keydown", (e) => {
  const t = e.target.closest("[data-testid=token]");
  if (t && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); selectToken(Number(t.dataset.index)); }
});
for (const d of document.querySelectorAll("details[data-panel]")) {
  d.addEventListener("toggle", () => {
    if (store.panels[d.dataset.panel] === d.open) return;
    store.panels[d.dataset.panel] = d.open;
    requestInspect();
    render();
  });
}
$("attention-layer").addEventListener("change", (e) => { store.attn.layer = Number(e.target.value); render(); });
$("attention-head").addEventListener("change", (e) => { store.attn.head = Number(e.target.value); render(); });
$("lens-positions").addEventListener("change", (e) => {
  store.lens.positions = Number(e.target.value);
  requestInspect();
  render();
});
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
