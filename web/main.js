// The page: one store, a worker that does all the work, and panels that only render (web/panels.js).
// The cards with state of their own (web/context.js, and those web/cards.js registers: verify.js, rope.js, routing.js,
// perplexity.js, retrieval.js, grounded.js, experiments.js, training.js, tokenizer.js) keep it here, under their key: each module makes its key, changes only
// that key through the functions main.js calls with it (the worker's messages, and for the registered cards the
// moments of a model's life, through web/cards.js each) and its own event handlers, and renders from the store.
// Which cards are folded and on screen is web/navigator.js's (store.nav); a card's request goes to the worker only
// while navigator.js says it `computes`.
// Nothing the user types or loads is stored (no localStorage, IndexedDB, cookies or URL state), nor which cards are open.
import {
  fmtBytes, lensPositions, LINES, renderAttention, renderEmbedding, renderForget, renderKv, renderLens, renderResidual,
  renderWiped, selectedPos, selectedEmbedding, shown,
} from "/web/panels.js";
import { computes, freshNav, isOpen, renderNavigator, wireNavigator } from "/web/navigator.js";
import { refreshExports, registerExport, revokeExports } from "/web/export.js";
import { probeExports } from "/web/probe-exports.js";
import { CARDS, each } from "/web/cards.js";
import { verifyFailed, verifyKernels, verifyProgress, verifyResult } from "/web/verify.js";
import { ropeAnswer, ropeFailed } from "/web/rope.js";
import { pplFailed, pplProgress, pplResult } from "/web/perplexity.js";
import {
  retrievalAnswer, retrievalDropped, retrievalFailed, retrievalHits, retrievalPlan, retrievalProgress, retrievalReady,
  retrievalRecall, retrievalToken, retrievalTuneDone, retrievalTuneDownload, retrievalTuneFailed, retrievalTunePlan,
  retrievalTuneProgress, retrievalTuneSwitched, retrievalTuneTable,
} from "/web/retrieval.js";
import {
  experimentFailed, experimentPlan, experimentProgress, experimentResult, experimentToken, experimentTokens,
} from "/web/experiments.js";
import {
  trainAdapter, trainAdapterFile, trainCompared, trainDone, trainFailed, trainPlan, trainProgress, trainSwitched,
  trainToken,
} from "/web/training.js";
import { tokDone, tokFailed, tokProgress } from "/web/tokenizer.js";
import { routerAblation, routerData, routerFailed } from "/web/routing.js";
import { groundedEval, groundedFailed, groundedRow, groundedSet } from "/web/grounded.js";
import {
  contextFileLoaded, contextUploaded, freshContextLength, int8Prefill, kvType, renderContext, wireContext,
} from "/web/context.js";

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
  // the folded cards and those on screen (web/navigator.js): a card asks the worker for nothing while it is folded or
  // out of view (navigator.js computes)
  nav: freshNav(),
  // The selection, the one place it lives: the context position the user chose (click, arrow keys), or null to
  // follow the newest token. Every panel reads it through panels.js selectedPos(store). A reply does not move a
  // choice the user made; with none, the panels follow the newest token, whose lens column is the model's own
  // next-token prediction and whose embedding and residual are what a learner asks about first.
  selected: null,
  embedding: null,                                       // the worker's "embedding" message
  probe: freshProbe(),                                   // the worker's inspections of this conversation
  attn: { layer: 0, head: 0 },                           // the attention panel's choice
  lens: { positions: null },                             // logit-lens positions chosen; null: all (panels.js lensPositions)
  kv: freshKv(),                                         // the KV cache: rows held and their magnitudes (kv-view)
  memory: freshMemory(null),                             // a hybrid's conv and delta-net states (memory-view)
  forget: null,                                          // the last Forget report
  // the last New chat's or the tab's unload's wipe: {moment ("new-chat" | "unload"), report, left?}; busy while asked
  wiped: null,
  busy: { embedding: false, inspect: 0, forget: false, wiped: false },
  // The cards with state of their own: each module owns the shape of its key and the functions that update it.
  contextLength: freshContextLength(),                   // web/context.js: the context the next load makes, its budget
  // web/cards.js's: verify (the llama.cpp checks), rope (the RoPE demo), router (a mixture of experts' routing),
  // perplexity (a pasted text's perplexity),
  // retrieval (the index of the user's files, the asks), experiments (ablation, patching, steering, attribution),
  // training (a LoRA adapter), tokenizer (a BPE vocabulary trained on the user's text)
  ...Object.fromEntries(CARDS.map((card) => [card.key, card.fresh()])),
};

// used: rows the session holds; columns[p]: Float32Array [n_layer, 2] of |K|, |V| at position p (lab/instruments/kvview.py);
// after: the picture Forget drew from its read-back of the caches (the "forget" message's kv).
// asked: a "kv-picture" is on its way (requestKvPicture).
function freshKv() {
  return { used: 0, columns: [], rev: 0, ms: null, after: null, asked: false };
}

// A hybrid's states for the memory card (lab/instruments/memory.py): conv, the rows the next token reads
// {start, end, layers, values}; records, [{pos, norms: Float32Array [n_delta, H]}] read as tokens arrived; head, the
// picked delta-net head's matrix ("memory-head"); snaps, the positions the engine's snapshots hold; pick, the
// {layer, head} chosen; after, what Forget read back.
function freshMemory(mem, pick) {
  return { conv: null, records: [], head: null, snaps: null, after: null, rev: 0, busy: false,
           pick: pick ?? { layer: mem && mem.delta ? mem.delta.layers[0] : 0, head: 0 } };
}
const dropMemory = () => { store.memory = freshMemory(store.loaded && store.loaded.memory, store.memory.pick); };
// A card's run overwrote the KV cache from position 0 (perplexity, retrieval): the chat's KV and memory pictures go.
const dropKvPicture = () => { store.kv = freshKv(); dropMemory(); };
// The model computes otherwise (an adapter went on or off): the panels' readings of the conversation are read again.
const redoPanels = () => { store.probe = freshProbe(); requestInspect(); };

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
      ["upload", `${l.upload_s.toFixed(2)} s, ${l.upload_mb_s} MB/s`], ["KV cache", `${l.n_ctx} tokens, ${fmtBytes(l.kv_bytes_per_token)} per token (${l.kv_type})`],
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

let chatShown = "";        // the messages last drawn (their count and the last one's length)

function renderChat() {
  const box = $("messages"), scroll = $("chat-scroll");
  // Where the model and the chat scroll on their own (two columns), the newest message stays in view above the
  // prompt, as in a chat app: when the messages changed, or while the reader is at the foot already; a reader
  // scrolled up to the model card stays there.
  const shownNow = `${store.messages.length}:${store.messages.at(-1)?.content.length ?? 0}`;
  const follow = store.messages.length
    && (shownNow !== chatShown || scroll.scrollHeight - scroll.scrollTop - scroll.clientHeight < 8);
  chatShown = shownNow;
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
  // a hybrid's turn: what it continued from besides the K/V rows (lab/instruments/memory.py reuse_note)
  $("reuse").textContent = t ? `prefilled ${t.prefilled}, reused ${t.reused}${t.reuse_note ? `: ${t.reuse_note}` : ""}` : "";
  if (follow) scroll.scrollTop = scroll.scrollHeight;
}

function tokenEl(tok, index) {
  const s = document.createElement("span");
  s.className = "tok";
  s.setAttribute("role", "option");        // the strip is the focusable listbox: arrow keys move the selection
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
  for (const s of strip.querySelectorAll(".tok.selected, .tok.current")) {
    s.classList.remove("selected", "current");
    s.removeAttribute("aria-selected");
  }
  // the user's choice is filled; with none, the newest token (which the panels then follow) is outlined
  const pos = selectedPos(store);
  if (pos != null) {
    strip.children[pos].classList.add(store.selected != null ? "selected" : "current");
    strip.children[pos].setAttribute("aria-selected", "true");
  }
  strip.dataset.selected = pos ?? "";
  $("context-count").textContent = store.context.length ? `(${store.context.length} tokens)` : "";
  // the selection named beside the title: the strip may have scrolled it out of its own few lines
  $("selected-token").textContent = pos == null ? ""
    : `${store.selected != null ? "selected" : "newest"}: #${pos} ${shown(ctx[pos].piece)}`;
}

const panelActions = { selectHead: (h) => { store.attn.head = h; render(); } };
// The memory card picks a delta-net layer and head: its matrix is read from the GPU.
const memoryActions = {
  pickState: (layer, head) => { store.memory.pick = { layer, head }; store.memory.rev++; requestMemoryHead(); render(); },
};
// What a card's own event handlers may ask of the page (web/cards.js wire): a render, the chat's sampling inputs (the
// retrieval answers and steering use them too), and the panels' layer and head (the Experiments card's heatmap cells
// and head bars pick them).
const page = {
  render: () => render(),
  sampling: () => ({ settings: settings(), max_new: maxNew() }),
  selectHead: (layer, head) => { store.attn = { layer, head }; render(); },
};

function render() {
  $("boot").textContent = store.boot;
  renderGpu();
  renderModel();
  renderChat();
  renderEmbedding(store);
  renderResidual(store);
  renderAttention(store, panelActions);
  renderLens(store);
  renderKv(store, memoryActions);
  renderForget(store);
  renderWiped(store);
  renderContext(store);
  each("render", store);
  renderNavigator(store, foldedLines);
  refreshExports();
}

// ---- panel requests: ask the worker for what the open panels need and the store lacks -------------------
function requestInspect() {
  const n = store.context.length;
  if (!store.loaded || store.generating || !n || store.busy.inspect || store.dropTurn) return;
  const p = store.probe;
  const lens = Math.min(lensPositions(store), n);
  const wantAttention = computes(store, "attention") && !p.attention;
  const wantLens = computes(store, "lens") && !(p.lens && p.lens.end - p.lens.lens_start >= lens);
  const pos = selectedPos(store);
  const wantResidual = computes(store, "residual") && pos != null && !p.residual.has(pos);
  const window = store.loaded.probe.window;
  const inWindow = pos != null && pos >= n - window;
  // The lens (a minute or more on a CPU device) goes alone and last: the cards on screen together show attention and
  // residual after their pass, not after the lens. Alone, the lens runs only its own positions (docs/panels.md).
  const requests = [];
  if (wantAttention) requests.push({ attention: true, lens: 0, residual: wantResidual && inWindow });
  if (wantResidual && !(wantAttention && inWindow)) requests.push({ start: pos, end: pos + 1, residual: true });
  if (wantLens) requests.push({ attention: false, lens, residual: false });
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

// The embedding card asks for the selected token's row when it computes (open, on screen) and lacks it; one request
// at a time, so a held arrow key costs one request for where the selection ends up, not one per step (see
// onWorker.embedding).
function requestEmbedding() {
  const pos = selectedPos(store);
  if (!store.loaded || store.generating || store.dropTurn || pos == null || store.busy.embedding) return;
  if (!computes(store, "embedding") || selectedEmbedding(store)) return;
  store.busy.embedding = true;
  worker.postMessage({ type: "probe-embedding", id: store.context[pos].id, index: pos });
}

// index: a context position, or null to follow the newest token.
function selectToken(index) {
  if (index != null && !store.context[index]) return;
  store.selected = index;
  requestEmbedding();
  requestInspect();
  render();
}

// The strip scrolls within itself to show a token. Not scrollIntoView, nor the browser's focus scrolling: the strip is
// pinned (position: sticky), and Chromium scrolls the page to where the strip would sit unpinned, far from the card
// being read.
function showInStrip(tok) {
  const strip = $("tokens");                   // positioned (style.css): a token's offsetTop is within it
  const top = tok.offsetTop, bottom = top + tok.offsetHeight;
  if (top < strip.scrollTop) strip.scrollTop = top;
  else if (bottom > strip.scrollTop + strip.clientHeight) strip.scrollTop = bottom - strip.clientHeight;
}

// Keys of the focused context strip (a listbox): ← → step, Home End jump, Esc follows the newest token again.
function stripKey(e) {
  const n = store.context.length, at = selectedPos(store);
  if (!n) return;
  const to = { ArrowLeft: Math.max(0, at - 1), ArrowRight: Math.min(n - 1, at + 1), Home: 0, End: n - 1, Escape: null }[e.key];
  if (to === undefined) return;
  e.preventDefault();
  selectToken(to);
  showInStrip($("tokens").children[selectedPos(store)]);
}

// The picked delta-net head's state, when the memory card computes and lacks it (a reply or a new pick); Forget's
// read-back draws its own.
function requestMemoryHead() {
  const mem = store.loaded && store.loaded.memory, m = store.memory, h = m.head;
  if (!mem || !mem.delta || !computes(store, "kv") || store.generating || !store.context.length || m.busy || m.after) return;
  if (h && h.layer === m.pick.layer && h.head === m.pick.head && h.pos === store.kv.used) return;
  m.busy = true;
  worker.postMessage({ type: "memory-head", ...m.pick });
}

// The memory card folded through a turn missed its picture (the chat asked for none): the whole of it, once the card
// computes again.
function requestKvPicture() {
  const kv = store.kv;
  if (!store.loaded || store.generating || store.dropTurn || kv.asked || kv.after || !computes(store, "kv")) return;
  if (kv.columns.length >= kv.used) return;
  kv.asked = true;
  worker.postMessage({ type: "kv-picture" });
}

// What now computes asks for what it lacks: a card came on screen, was opened, or the selection moved.
function cardsChanged() {
  requestEmbedding();
  requestInspect();
  requestMemoryHead();
  requestKvPicture();
  each("changed", store, worker);
  render();
}

// A card was opened (web/navigator.js): a registered card asks for what it needs by itself (its `opened` hook).
function cardOpened(id) {
  const card = CARDS.find((c) => c.key === id);
  if (card && card.opened && store.loaded) card.opened(store, worker);
  cardsChanged();
}

// The one line each card shows while folded: the registered cards' `summary`, the built-in panels' LINES.
const foldedLines = { ...LINES, ...Object.fromEntries(CARDS.filter((c) => c.summary).map((c) => [c.key, c.summary])) };

// Empties every trace of the conversation the page holds (DOM included, by re-rendering).
function clearConversation() {
  // A turn in flight is stopped; its remaining messages are dropped, and `generating` stays set until its
  // "done" arrives, so no new turn starts before the worker is free.
  if (store.generating) { worker.postMessage({ type: "stop" }); store.dropTurn = true; }
  store.messages = []; store.context = []; store.timings = null;
  store.selected = null; store.embedding = null; store.probe = freshProbe(); store.kv = freshKv();
  dropMemory();
  revokeExports();
  each("cleared", store, worker);
}

// `skip` is for tests only (window.labForgetSkipping): the label of one buffer the wipe must leave alone.
// A new chat keeps what a card holds beyond the conversation (the retrieval index: the user's files); Forget wipes it.
function forgetAll(skip) {
  clearConversation();
  each("forgetting", store, worker);
  $("prompt").value = "";
  $("system-prompt").value = "";
  store.forget = null;
  store.busy.forget = true;
  // the delta-net head the memory card shows is redrawn from Forget's read-back
  const head = store.loaded && store.loaded.memory && store.loaded.memory.delta ? store.memory.pick : undefined;
  worker.postMessage({ type: "forget", ...(skip ? { skip } : {}), ...(head ? { head } : {}) });
  render();
}

// Test hooks: questions to the worker that tests ask through the page, each answered by a message of the same type
// carrying the question's id (an `error` field rejects). The store and the page are not touched; the worker's
// conversation is, where a hook says so (greedy ids, last logits and profile run their own steps over the cache).
// - labKernelCheck(cases) (tests/browser/test_kernels_in_worker.py): kernel cases through
//   lab/instruments/kernelcheck.py on inputs in base64; the worker makes and frees its own buffers for them.
// - labKvRows(positions) (tests/browser/test_kv_page.py): the raw K and V rows of every layer at those positions,
//   read from the caches without the KV panel's kernel, so a test can check the panel's numbers.
// - labStateBytes() (tests/browser/test_hybrid_page.py): every conv and delta-net state's and snapshot's raw bytes,
//   read without the memory card's code, so a test can check the card's rows and Forget's zeros.
// - labGreedyIds(ids, n, session) (tests/browser/test_arch_page.py): n greedy ids after raw prompt ids, straight through
//   the engine's steps (no template, no end-of-generation stop), to hold the page to llama.cpp's fixture; with
//   session, as a turn of the worker's Session (reusing what the last turn left: a hybrid's states), with `reused`;
//   labLastLogits(ids): the logits after prefilling those ids (f32, base64), for the same test.
//   labTrainGrads(m): a training step's LoRA gradients at the adapter m.params (f32, base64), for the page's gradient
//     check (tests/browser/test_gradcheck_page.py).
// - labProfile(t, pos, families, reps, warm_ms): GPU time of a step by timestamp queries, after warm_ms of GPU work
//   (lab/instruments/profile.py; `lab bench --backend browser --profile` asks the worker directly). Drops the
//   conversation.
// - labWeightBytes(name, offset, size) (tests/browser/test_big_file.py): bytes [offset, offset + size) of a file
//   tensor, read back from the GPU buffers it was uploaded into (lab/instruments/weightread.py), as base64.
// labForgetSkipping(label): Forget with that one buffer left uncleared, to prove the page says NOT wiped and keeps
// its cells lit.
const questions = new Map();      // id -> {type, resolve, reject}
let questionId = 0;
function ask(type, body) {
  return new Promise((resolve, reject) => {
    const id = ++questionId;
    questions.set(id, { type, resolve, reject });
    worker.postMessage({ type, id, ...body });
  });
}

function answered(m) {
  const q = m.id != null && questions.get(m.id);
  if (!q || q.type !== m.type) return false;
  questions.delete(m.id);
  m.error ? q.reject(new Error(m.error)) : q.resolve(m);
  return true;
}

window.labKernelCheck = (cases) => ask("kernel-check", { cases });
window.labKvRows = (positions) => ask("kv-rows", { positions });
window.labStateBytes = () => ask("state-bytes", {});
window.labGreedyIds = (ids, n, session = false) => ask("greedy-ids", { ids, n, session });
window.labLastLogits = (ids) => ask("last-logits", { ids });
window.labTrainGrads = (m) => ask("train-grads", m);
window.labProfile = (t, pos, families, reps, warm_ms) => ask("profile", { t, pos, families, reps, warm_ms });
window.labWeightBytes = (name, offset, size) => ask("weight-bytes", { name, offset, size }).then((m) => m.bytes);
window.labForgetSkipping = (label) => forgetAll(label);

// ---- worker messages: each handler updates the store; the page is then re-rendered from it ----------------------
// Keyed by the message types lab/worker/router.py (and web/worker.js) post.
const onWorker = {
  status: (m) => { store.boot = m.text; },
  booted: (m) => { store.boot = `ready: Python ${m.python} booted in ${(m.ms / 1000).toFixed(1)} s`; },
  gpu: (m) => { if (store.boot === "GPU lost") store.boot = "ready: a new GPU device"; store.gpu = m.info; },
  selftest: (m) => { store.selftest = m.result; },
  "model-info": (m) => {
    if (!current(m)) return;
    // a model trained from scratch (the Training card's "new model"): the model before is gone in the worker now
    if (m.made) madeModel();
    store.model = m.summary; store.error = null;
  },
  "load-progress": (m) => { if (current(m)) { store.loading = m; contextUploaded(store.contextLength, m); } },
  loaded: (m) => {
    if (!current(m)) return;
    store.loaded = { ...m.stats, wasm_heap_growth: store.loading?.wasm_heap_growth };
    store.loading = null; store.kv = freshKv(); store.memory = freshMemory(m.stats.memory);
    each("loaded", store, m.stats, worker);
    for (const card of CARDS) if (card.opened && isOpen(store, card.key)) card.opened(store, worker);
  },
  prompt: (m) => {
    if (store.dropTurn) return;
    // a chosen position survives the new prompt where the same token still stands there
    if (store.selected != null && m.ids[store.selected] !== store.context[store.selected]?.id) store.selected = null;
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
    requestEmbedding();
    requestInspect();
    requestMemoryHead();
    requestKvPicture();           // the memory card folded when the turn began, open now
    each("changed", store, worker);   // a card that reads the conversation (the router) reads it again
  },
  embedding: (m) => {
    store.busy.embedding = false;
    if (m.index === selectedPos(store) && m.id === store.context[m.index]?.id) store.embedding = m;
    requestEmbedding();            // the selection moved on while this one ran
  },
  inspection: (m) => {
    store.busy.inspect = Math.max(0, store.busy.inspect - 1);
    if (m.n === store.context.length) onInspection(m);
    if (!store.busy.inspect) requestInspect();
  },
  forget: (m) => {
    store.busy.forget = false; store.forget = m.report; store.kv.after = m.kv;
    store.memory.after = m.memory; store.memory.rev++;
    // a model trained here was made of the conversation: wiped with it, and unloaded
    if (m.unloaded) { each("dropped", store, worker); store.loaded = null; store.model = null; }
    each("forgotten", store, m.report);
  },
  // New chat's wipe: the KV and memory cards redrawn from its read-back, as after Forget
  reset: (m) => {
    store.busy.wiped = false; store.wiped = { moment: "new-chat", report: m.report };
    store.kv.after = m.kv; store.memory.after = m.memory; store.memory.rev++;
  },
  unloaded: (m) => { store.busy.wiped = false; store.wiped = { moment: "unload", report: m.report, left: m.left }; },
  "kv-view": (m) => {
    if (store.dropTurn) return;
    const cols = store.kv.columns, w = 2 * m.n_layer;
    cols.length = m.start;                 // a turn's first read starts at 0: the prompt may have replaced rows
    for (let p = m.start; p < m.end; p++) cols.push(m.norms.subarray((p - m.start) * w, (p - m.start + 1) * w));
    store.kv.ms = m.ms; store.kv.after = null; store.kv.asked = false; store.kv.rev++;
  },
  "memory-view": (m) => {
    if (store.dropTurn) return;
    const mem = store.memory;
    mem.conv = m.conv; mem.snaps = m.snaps; mem.after = null; mem.rev++;
    // a state read at a position replaces any read at or past it (the prompt may have been run again from 0)
    if (m.delta) mem.records = mem.records.filter((r) => r.pos < m.state_pos).concat([{ pos: m.state_pos, norms: m.delta }]);
  },
  "memory-head": (m) => {
    store.memory.busy = false;
    if (!store.memory.after) { store.memory.head = m; store.memory.rev++; }
    requestMemoryHead();          // the pick moved on while this one was read
  },
  // the cards' own messages: each updates its card's key; what they mean for the rest of the store is said here
  "verify-progress": (m) => verifyProgress(store.verify, m),
  "verify-kernels": (m) => verifyKernels(store.verify, m),
  // a replay that ran overwrote the KV cache: the next turn prefills again
  verify: (m) => { if (verifyResult(store.verify, m)) store.kv.used = 0; },
  rope: (m) => ropeAnswer(store.rope, m, store.context.length),
  // a run overwrites the KV cache from position 0, so the KV picture of the chat is dropped
  "perplexity-progress": (m) => { if (pplProgress(store.perplexity, m)) dropKvPicture(); },
  perplexity: (m) => pplResult(store.perplexity, m),
  // embedding windows and questions overwrites the KV cache from position 0: the chat's KV picture is dropped
  "retrieval-plan": (m) => retrievalPlan(store.retrieval, m),
  "retrieval-progress": (m) => { if (retrievalProgress(store.retrieval, m)) dropKvPicture(); },
  "retrieval-ready": (m) => retrievalReady(store.retrieval, m),
  "retrieval-hits": (m) => { if (retrievalHits(store.retrieval, m)) dropKvPicture(); },
  "retrieval-token": (m) => retrievalToken(store.retrieval, m),
  "retrieval-answer": (m) => retrievalAnswer(store.retrieval, m),
  "retrieval-recall": (m) => retrievalRecall(store.retrieval, m),
  "grounded-set": (m) => groundedSet(store.grounded, m),
  "grounded-row": (m) => { if (groundedRow(store.grounded, m)) dropKvPicture(); },
  "grounded-eval": (m) => groundedEval(store.grounded, m),
  // Clear emptied the card when it was pressed; a tuning that failed after its start dropped the index
  "retrieval-dropped": (m) => retrievalDropped(store.retrieval, m),
  // tuning the embedder embeds windows and runs steps over the KV cache: the chat's KV picture is dropped; tuning every
  // weight changes the model the panels read (read again), an adapter of the card's own does not
  "retrieval-tune-plan": (m) => { if (retrievalTunePlan(store.retrieval, m)) dropKvPicture(); },
  "retrieval-tune-progress": (m) => retrievalTuneProgress(store.retrieval, m),
  "retrieval-tune-table": (m) => retrievalTuneTable(store.retrieval, m),
  "retrieval-tune-done": (m) => { if (retrievalTuneDone(store.retrieval, m)) redoPanels(); },
  "retrieval-tune-switch": (m) => { if (retrievalTuneSwitched(store.retrieval, m)) dropKvPicture(); },
  "retrieval-tune-download": (m) => retrievalTuneDownload(store.retrieval, m, store.model?.file_name),
  // an experiment puts the chat's KV cache back as it was: the chat's KV picture stays
  "experiment-tokens": (m) => experimentTokens(store.experiments, m),
  "experiment-plan": (m) => experimentPlan(store.experiments, m),
  "experiment-progress": (m) => experimentProgress(store.experiments, m),
  "experiment-token": (m) => experimentToken(store.experiments, m),
  "experiment-result": (m) => experimentResult(store.experiments, m),
  // the router card's runs put the chat's KV cache back as it was, as the experiments do: the KV picture stays
  router: (m) => routerData(store.router, m),
  "router-ablation": (m) => routerAblation(store.router, m),
  // training overwrites the KV cache and puts the adapter on: the chat's KV picture and the panels' readings go (they
  // are read again with the adapter); so do the with / without replies and the switch
  "train-plan": (m) => { if (trainPlan(store.training, m)) dropKvPicture(); },
  "train-progress": (m) => trainProgress(store.training, m),
  "train-done": (m) => { if (trainDone(store.training, m)) redoPanels(); },
  "train-token": (m) => { if (trainToken(store.training, m)) dropKvPicture(); },
  "train-compare": (m) => trainCompared(store.training, m),
  "train-switch": (m) => { trainSwitched(store.training, m); dropKvPicture(); redoPanels(); },
  "train-adapter": (m) => trainAdapter(store.training, m, store.model?.file_name),
  "train-model": (m) => trainAdapter(store.training, m, store.model?.file_name),
  "train-adapter-file": (m) => { if (trainAdapterFile(store.training, m)) { dropKvPicture(); redoPanels(); } },
  // the tokenizer's training runs in Python alone: nothing of the model or the conversation changes
  "tokenizer-progress": (m) => tokProgress(store.tokenizer, m),
  "tokenizer-done": (m) => tokDone(store.tokenizer, m),
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

// A card's request that fails after its model is gone (the GPU lost, another file picked mid-request) is stale: the
// page already says why the model went, and "load a model first" from a panel must not take that line's place.
function cardFailed(text) {
  if (store.loaded) store.error = text;
}

// Keyed by `where`: the type of the message whose handling failed, or "device" when the GPU was lost.
const onError = {
  load: loadFailed,
  init: (m) => { store.error = m.message; store.boot = "no GPU: the lab cannot run here"; },
  device: (m) => {   // the worker asks for a new device at once: its "gpu" message makes loading possible again
    clearConversation(); store.dropTurn = false; each("dropped", store, worker);
    store.error = m.message; store.boot = "GPU lost"; store.loaded = null; store.loading = null;
    store.generating = false; store.gpu = null; store.selftest = null;
  },
  chat: (m) => {
    store.error = `chat: ${m.message}`; store.generating = false; store.dropTurn = false;
    const last = store.messages.at(-1);
    if (last && last.role === "assistant" && !last.content) store.messages.pop();
  },
  "probe-inspect": (m) => {
    cardFailed(`panels: ${m.message}`); store.busy.inspect = Math.max(0, store.busy.inspect - 1);
  },
  "probe-embedding": (m) => { cardFailed(`embedding: ${m.message}`); store.busy.embedding = false; },
  forget: (m) => { store.error = `forget: ${m.message}`; store.busy.forget = false; },
  reset: (m) => { store.error = `new chat: ${m.message}`; store.busy.wiped = false; },
  unload: (m) => { store.error = `unload: ${m.message}`; store.busy.wiped = false; },
  "memory-head": (m) => { cardFailed(`memory: ${m.message}`); store.memory.busy = false; },
  "kv-picture": (m) => { cardFailed(`memory: ${m.message}`); store.kv.asked = false; },
  "probe-rope": (m) => { cardFailed(`RoPE demo: ${m.message}`); ropeFailed(store.rope); },
  verify: (m) => verifyFailed(store.verify, m),
  "verify-kernels": (m) => verifyFailed(store.verify, m),
  perplexity: (m) => pplFailed(store.perplexity, m),
  "retrieval-index": (m) => retrievalFailed(store.retrieval, m),
  "retrieval-ask": (m) => retrievalFailed(store.retrieval, m),
  "retrieval-recall": (m) => retrievalFailed(store.retrieval, m),
  "grounded-set": (m) => groundedFailed(store.grounded, m),
  "grounded-eval": (m) => groundedFailed(store.grounded, m),
  "retrieval-drop": (m) => retrievalFailed(store.retrieval, m),
  "retrieval-tune": (m) => retrievalTuneFailed(store.retrieval, m),
  "retrieval-tune-switch": (m) => retrievalTuneFailed(store.retrieval, m),
  "retrieval-tune-download": (m) => retrievalTuneFailed(store.retrieval, m),
  experiment: (m) => experimentFailed(store.experiments, m),
  router: (m) => routerFailed(store.router, m, store.context.length),
  "router-ablate": (m) => routerFailed(store.router, m, store.context.length),
  train: (m) => trainFailed(store.training, m),
  "train-compare": (m) => trainFailed(store.training, m),
  "train-adapter": (m) => trainFailed(store.training, m),
  "train-switch": (m) => trainFailed(store.training, m),
  "train-adapter-file": (m) => trainFailed(store.training, m),
  "train-new": (m) => trainFailed(store.training, m),
  "train-model": (m) => trainFailed(store.training, m),
  "tokenizer-train": (m) => tokFailed(store.tokenizer, m),
  "experiment-tokens": () => {},     // the prompts' tokens are a courtesy: the run says what is wrong with them
};

worker.onmessage = (e) => {
  const m = e.data;
  if (answered(m)) return;
  if (onWorker[m.type]) onWorker[m.type](m);
  render();
};
worker.onerror = (e) => { store.error = `worker: ${e.message}`; render(); };

// The Training card's new model is arriving (its "model-info"): the page drops the model before as a new file's load
// does, less the card's own run, which is making the new one (`made`, web/training.js).
function madeModel() {
  clearConversation();
  each("dropped", store, worker, { made: true });
  store.loaded = null; store.loading = null;
}

function load(file) {
  if (!file) return;
  if (store.loading) worker.postMessage({ type: "cancel-load" });   // the newest pick wins
  store.error = null; store.loaded = null; store.model = null;
  store.loading = { done: 0, total: 0 };
  clearConversation();                // the worker's load destroys the old model's buffers, zeroed first
  each("dropped", store, worker);     // what the cards held of the old model (the index: its embeddings)
  each("picked", store, file);
  worker.postMessage({ type: "load", file, n_ctx: contextFileLoaded(store.contextLength, file), int8: int8Prefill(),
                       kv: kvType(), seq: ++store.loadSeq });
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
const maxNew = () => Number($("max-tokens").value);

function send() {
  const text = $("prompt").value;
  if (!store.loaded || store.generating || !text.trim()) return;
  store.error = null;
  const system = $("system-prompt").value.trim();
  store.messages.push({ role: "user", content: text });
  const convo = (system ? [{ role: "system", content: system }] : []).concat(store.messages);
  store.generating = true;
  $("prompt").value = "";
  // the memory card on screen: a new column with each token; open elsewhere: the picture at the turn's end; folded:
  // none (requestKvPicture asks for it when the card is opened)
  const kvView = computes(store, "kv") ? "live" : isOpen(store, "kv") ? "end" : null;
  worker.postMessage({ type: "chat", messages: convo, settings: settings(), max_new: maxNew(),
                       ...(kvView ? { kv_view: kvView } : {}) });
  render();
}

// New chat: the page's copies dropped (the store, each card's derived data, the text fields) and the worker's wipe
// asked for, as Forget's but leaving the user's files (the retrieval index, a trained adapter); its one line and the
// KV and memory cards' blank pictures come with the "reset" message.
function newChat() {
  clearConversation();
  $("prompt").value = "";
  $("system-prompt").value = "";
  store.wiped = null;
  store.busy.wiped = true;
  const head = store.loaded && store.loaded.memory && store.loaded.memory.delta ? store.memory.pick : undefined;
  worker.postMessage({ type: "reset", ...(head ? { head } : {}) });
  render();
}

// The tab is closing or reloading: the worker is asked to clear, read back and destroy every conversation buffer and
// drop its Python copies before the browser ends it (docs/privacy.md says what that can and cannot promise). The
// page cannot wait for the answer; a page kept in the back-forward cache comes back with no model.
// window.labUnloadLog (tests, measurements): the worker logs its progress (counts only) to the console.
function unloadTab() {
  clearConversation();
  each("dropped", store, worker);
  $("prompt").value = "";
  $("system-prompt").value = "";
  store.loaded = null; store.loading = null; store.wiped = null; store.busy.wiped = true;
  worker.postMessage({ type: "unload", ...(window.labUnloadLog ? { log: true } : {}) });
  render();
}
window.addEventListener("pagehide", unloadTab);

$("model-file").addEventListener("change", (e) => {
  load(e.target.files[0]);
  e.target.value = "";     // the same file picked again (after a lost GPU, a cancel) must fire `change` again
});
$("load-default").addEventListener("click", loadDefault);
$("load-cancel").addEventListener("click", () => worker.postMessage({ type: "cancel-load" }));
$("send").addEventListener("click", send);
$("stop").addEventListener("click", () => worker.postMessage({ type: "stop" }));
$("new-chat").addEventListener("click", newChat);
$("forget").addEventListener("click", () => forgetAll());
$("tokens").addEventListener("click", (e) => {
  const t = e.target.closest("[data-testid=token]");
  if (t) selectToken(Number(t.dataset.index));
});
$("tokens").addEventListener("keydown", stripKey);
$("tokens").addEventListener("mousedown", (e) => {     // focused without the browser's scroll (showInStrip says why)
  e.preventDefault();
  $("tokens").focus({ preventScroll: true });
});
for (const [id, exp] of probeExports(store)) registerExport(id, exp);
each("exports", store, registerExport);
wireContext(store, load);
each("wire", store, worker, page);
wireNavigator(store, { render, changed: cardsChanged, opened: cardOpened });
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
