// The Tokenizer card: a byte-level BPE vocabulary trained in the tab on text files the user picks (the Files go to the
// worker, which reads and checks them) or on the chat's text so far, by the trainer `lab tokenizer-train` runs
// (lab/worker/tokenizer.py; no model needed). It shows the run's progress (merges made of the target), then the
// vocabulary, bytes per token on the text for it and for the loaded model's tokenizer, the first merges in order, the
// text's opening cut both ways, and offers the vocabulary as the CLI's JSON file and as a vocabulary-only GGUF.
// Stop posts "stop", which web/worker.js records while Python gives it a turn between slices of merges; a stopped run
// keeps the merges it made. Every refusal (the vocabulary's bounds, no text, too much, a file that is not UTF-8 text)
// is the worker's one line, shown here.
// The text, the merges and the files are the user's data: the picked Files (references, not their bytes) and the
// run's result (its JSON and GGUF included) live in this card's store only, until Forget, New chat, another model or
// a lost GPU drops them (`cleared`); the worker keeps nothing after a run. A download is a Blob behind an object URL,
// revoked soon after.
// Its state is store.tokenizer (freshTokenizer): main.js hands the worker's messages to the update functions below;
// its `card` (web/cards.js, at the end) says what a model's life does to it, and draws it with renderTokenizer.
import { factList, shown } from "/web/panels.js";

const $ = (id) => document.getElementById(id);
const KEEP_URL_MS = 10_000;       // as web/export.js: long enough for the download to take the Blob

// ---- the card's state: store.tokenizer ---------------------------------------------------------------------------
export function freshTokenizer() {
  return {
    files: [],          // the picked Files (the worker reads them)
    seq: 0,             // the newest run asked for; messages of older runs are dropped
    running: false,
    progress: null,     // the last "tokenizer-progress": {phase, done, total, seconds}
    result: null,       // the "tokenizer-done" message's result
    json: null,         // ... its JSON file, as text
    gguf: null,         // ... its vocabulary-only GGUF, a Uint8Array
    error: null,        // one line: what the worker refused or failed on
  };
}

const NO_RUN = { running: false, progress: null, result: null, json: null, gguf: null, error: null };

export function tokProgress(s, m) {
  if (m.seq !== s.seq) return;
  s.progress = m;
}

export function tokDone(s, m) {
  if (m.seq !== s.seq) return;
  s.running = false;
  s.result = m.result;
  s.json = m.json;
  s.gguf = new Uint8Array(m.gguf.buffer, m.gguf.byteOffset, m.gguf_size);
}

export function tokFailed(s, m) {
  if (m.seq != null && m.seq !== s.seq) return;
  s.running = false;
  s.progress = null;
  s.error = m.message;
}

// The conversation was dropped (Forget, New chat, another model, a lost GPU): a run in flight is stopped and its
// answer dropped, the picked files and everything the card shows go.
function dropTokenizer(s, worker) {
  if (s.running) worker.postMessage({ type: "stop" });
  s.seq++;
  Object.assign(s, NO_RUN, { files: [] });
  $("tok-files").value = "";
}

// ---- events -------------------------------------------------------------------------------------------------------
const source = () => (document.querySelector("input[name=tok-source]:checked")?.value ?? "files");
// The chat's text so far, as the Training card takes it: each message on its own, in order.
const conversationText = (store) => store.messages.map((m) => m.content).filter((t) => t.trim()).join("\n\n");
// The worker answers one message at a time: a load or a reply in flight would hold the run back without a word.
const canTrain = (store) => !store.tokenizer.running && !store.generating && !store.loading;

function start(store, worker, rerender) {
  if (!canTrain(store)) return;
  const s = store.tokenizer;
  const v = $("tok-vocab").value;
  Object.assign(s, NO_RUN, { running: true });
  // the worker checks all of it (the vocabulary's bounds, no text, too much text, each file): its line is shown
  const body = source() === "files" ? { files: s.files } : { text: conversationText(store) };
  // an empty box sends no vocab at all (Pyodide turns a JS null into its own `jsnull`, not None)
  worker.postMessage({ type: "tokenizer-train", ...body, ...(v === "" ? {} : { vocab: Number(v) }), seq: ++s.seq });
  rerender();
}

function download(data, name, type) {
  const url = URL.createObjectURL(new Blob([data], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), KEEP_URL_MS);
}

export function wireTokenizer(store, worker, rerender) {
  const s = store.tokenizer;
  $("tok-train").addEventListener("click", () => start(store, worker, rerender));
  $("tok-stop").addEventListener("click", () => { if (s.running) worker.postMessage({ type: "stop" }); });
  $("tok-files").addEventListener("change", (e) => {
    s.files = [...e.target.files];
    s.error = null;
    $("tok-source-files").checked = true;
    rerender();
  });
  for (const r of document.querySelectorAll("input[name=tok-source]")) r.addEventListener("change", () => rerender());
  // the same file `lab tokenizer-train --out` writes (UTF-8: a Blob encodes the text so), and the GGUF's bytes
  $("tok-download-json").addEventListener("click", () => {
    if (s.json) download(s.json, `tokenizer-${s.result.vocab}.json`, "application/json");
  });
  $("tok-download-gguf").addEventListener("click", () => {
    if (s.gguf) download(s.gguf, `tokenizer-${s.result.vocab}.gguf`, "application/octet-stream");
  });
}

// ---- rendering ----------------------------------------------------------------------------------------------------
const n = (x) => x.toLocaleString("en");
const fmtS = (x) => `${x.toFixed(x < 10 ? 2 : 1)} s`;
const fmtBytes = (b) => (b < 1e4 ? `${n(b)} bytes` : b < 1e6 ? `${(b / 1e3).toFixed(1)} KB` : `${(b / 1e6).toFixed(2)} MB`);

// The status line: its state (idle | running | stopped | done | error) and text.
function status(store) {
  const s = store.tokenizer, p = s.progress, r = s.result;
  if (s.running) {
    if (!p || p.phase === "count") return { state: "running", text: "cutting the text into words and counting them…" };
    if (p.phase === "merge") return { state: "running", text: `merge ${n(p.done)} of ${n(p.total)}` };
    return { state: "running", text: "counting tokens: bytes per token on the text…" };
  }
  if (s.error) return { state: "error", text: "refused (below)" };
  if (r && r.stopped) return { state: "stopped", text: `stopped after ${n(r.merges)} of ${n(r.target)} merges` };
  if (r) return { state: "done", text: `done: ${n(r.merges)} merges in ${fmtS(r.train_s)}` };
  return { state: "idle", text: "" };
}

function renderStatus(store) {
  const s = store.tokenizer, p = s.progress;
  const { state, text } = status(store);
  const el = $("tok-status");
  el.dataset.state = state;
  el.dataset.phase = p ? p.phase : "";
  el.dataset.done = p ? p.done : "";
  el.textContent = text;
  $("tok-progress-row").hidden = !s.running;
  const bar = $("tok-bar");
  // merges made of the target; while counting and measuring there is no share to show
  if (p && p.phase === "merge" && p.total) bar.value = Math.min(1, p.done / p.total);
  else bar.removeAttribute("value");
  $("tok-progress-text").textContent = !p ? "" : `${fmtS(p.seconds)} so far`;
  const err = $("tok-error");
  err.hidden = !s.error;
  err.textContent = s.error || "";
}

function facts(store) {
  const r = store.tokenizer.result;
  const files = r.names.length === 1 ? r.names[0] : `${r.names.length} files (${r.names.join(", ")})`;
  const vocab = `${n(r.vocab)} tokens: ${r.specials.length} special + 256 bytes + ${n(r.merges)} merges`
    + (r.stopped ? ` (stopped: ${n(r.target)} merges were asked for)`
      : r.exhausted ? ` (${n(r.vocab_asked)} asked for: the text holds no more pairs to merge)` : "");
  const own = r.bytes_per_token;
  const modelName = store.model?.file_name ?? "the loaded model";
  const model = r.model;
  const rows = [
    ["text", `${fmtBytes(r.bytes)} of ${files}: ${n(r.words)} distinct words`, "tok-text", r.bytes],
    ["vocabulary", vocab, "tok-vocab-size", r.vocab],
    ["training", `${fmtS(r.train_s)} (counting the words, then the merges)`, "tok-time", r.train_s],
    ["bytes per token, this tokenizer", own == null ? "not measured (stopped)"
      : `${own.toFixed(2)} on this text, with ${n(r.vocab)} tokens in its vocabulary`, "tok-bpt", own ?? ""],
    ["bytes per token, the model's", !model ? "load a model to compare its tokenizer on the same text"
      : model.bytes_per_token == null ? "not measured (stopped)"
        : `${model.bytes_per_token.toFixed(2)} on the same text: ${modelName}'s tokenizer, ${n(model.vocab)} tokens`
          + (own == null || model.bytes_per_token === own ? ""
            : ` (${model.bytes_per_token > own ? "fewer" : "more"} tokens for this text than the one trained here)`),
     "tok-model-bpt", model?.bytes_per_token ?? ""],
  ];
  return rows;
}

function renderFacts(store) {
  const dl = $("tok-facts"), r = store.tokenizer.result;
  dl.hidden = !r;
  if (!r) { dl.replaceChildren(); return; }
  factList(dl, facts(store));
}

// One merge: left + right → the new token, and the pair's count when it was joined.
function mergeEl(m) {
  const li = document.createElement("li");
  li.className = "tok-merge";
  li.dataset.left = m.left;
  li.dataset.right = m.right;
  li.dataset.count = m.count;
  const tok = (text) => {
    const t = document.createElement("span");
    t.className = "tok";
    t.textContent = shown(text);
    return t;
  };
  const count = document.createElement("span");
  count.className = "tok-count";
  count.textContent = `× ${n(m.count)}`;
  li.append(tok(m.left), " + ", tok(m.right), " → ", tok(m.left + m.right), count);
  return li;
}

function renderMerges(r) {
  $("tok-merges-block").hidden = !r || !r.first_merges.length;
  const list = $("tok-merges");
  const key = r ? `${r.merges}:${r.first_merges.length}` : "";
  if (list.dataset.key === key) return;
  list.dataset.key = key;
  list.replaceChildren(...(r ? r.first_merges.map(mergeEl) : []));
}

function strip(el, pieces) {
  el.replaceChildren(...pieces.map((p) => {
    const t = document.createElement("span");
    t.className = "tok";
    t.textContent = shown(p);
    t.dataset.piece = p;
    return t;
  }));
}

function renderSample(store) {
  const r = store.tokenizer.result, s = r?.sample;
  $("tok-sample-block").hidden = !s || !s.text;
  if (!s) { strip($("tok-sample-trained"), []); strip($("tok-sample-model"), []); return; }
  // the sample is the first text's opening: with several files, say whose
  $("tok-sample-title").textContent = `The opening of ${r.names.length > 1 ? r.names[0] : "the text"}, cut into tokens `
    + "both ways";
  $("tok-sample-trained-label").textContent = `this tokenizer: ${s.trained.length} tokens`;
  strip($("tok-sample-trained"), s.trained);
  const model = !!s.model;
  $("tok-sample-model-label").textContent = model
    ? `${store.model?.file_name ?? "the loaded model"}'s: ${s.model.length} tokens`
    : "the model's: load a model to see how its tokenizer cuts the same text";
  $("tok-sample-model").hidden = !model;
  strip($("tok-sample-model"), model ? s.model : []);
}

function renderSource(store) {
  const s = store.tokenizer;
  const bytes = s.files.reduce((a, f) => a + f.size, 0);
  $("tok-files-note").textContent = s.files.length
    ? `${s.files.length} file${s.files.length === 1 ? "" : "s"}, ${fmtBytes(bytes)}` : "";
  const k = store.messages.filter((m) => m.content.trim()).length;
  $("tok-chat-note").textContent = `(${k} message${k === 1 ? "" : "s"} so far)`;
}

export function renderTokenizer(store) {
  const s = store.tokenizer, r = s.result;
  $("tok-train").disabled = !canTrain(store);
  $("tok-stop").disabled = !s.running;
  for (const id of ["tok-vocab", "tok-files", "tok-source-files", "tok-source-chat"]) $(id).disabled = s.running;
  renderSource(store);
  renderStatus(store);
  renderFacts(store);
  renderMerges(r);
  renderSample(store);
  $("tok-downloads").hidden = $("tok-downloads-note").hidden = !r;
}

// ---- folded (web/navigator.js): the card in one line ----------------------------------------------------------------
function tokenizerLine(store) {
  const r = store.tokenizer.result, st = status(store);
  if (st.state === "done" && r.bytes_per_token != null) {
    const model = r.model?.bytes_per_token != null ? ` (the model's: ${r.model.bytes_per_token.toFixed(2)})` : "";
    return `${n(r.vocab)} tokens, ${r.bytes_per_token.toFixed(2)} bytes per token on ${fmtBytes(r.bytes)}${model}`;
  }
  if (st.state === "error") return store.tokenizer.error;
  return st.text || "no tokenizer trained yet";
}

// ---- its place in the page (web/cards.js): the text and the vocabulary go with the conversation --------------------
export const card = {
  key: "tokenizer",
  fresh: freshTokenizer,
  render: renderTokenizer,
  wire: (store, worker, page) => wireTokenizer(store, worker, page.render),
  cleared: (store, worker) => dropTokenizer(store.tokenizer, worker),
  summary: tokenizerLine,
};
