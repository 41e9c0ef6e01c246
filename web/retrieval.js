// The retrieval card, "Ask your files": text files indexed by the loaded model's own embeddings, a question answered
// from the passages nearest to it, and the index's measured recall (lab/instruments/retrieval.py; the worker's side is
// lab/worker/retrieval.py). The worker does all of it; this card sends the files and the question, and shows the
// plan, the progress, the ranked passages, the prompt exactly as the model reads it, and the answers as they stream.
// Everything that comes from a file (its name, its passages, the prompt that holds them, the answers) is set as
// text (textContent), never parsed as HTML: a file may hold <script> or <img onerror=...>, and they show as written.
// The files are conversation-like data: the File objects are held only until Index sends them, nothing is stored, and
// dropRetrieval (Forget, a new model, a lost GPU) empties the card and stops what runs; a new chat keeps the index.
// "Tune on these files" trains the card's embedder on the indexed files' windows in the worker (lab/worker/embedder.py:
// the stages, the recall table before and after each, the index embedded again with it), then offers its switch and
// its file as a download. The tuned embedder is the worker's, as the index is: New chat keeps it, Forget wipes it.
// Its state is store.retrieval (freshRetrieval): main.js hands the worker's messages to the update functions below;
// its `card` (web/cards.js, at the end) says what a model's life does to it, and draws it with renderRetrieval.
import { fmtBytes, node as el, withTestid as testid } from "/web/panels.js";

const $ = (id) => document.getElementById(id);
const KEEP_URL_MS = 10_000;       // as web/export.js: long enough for the download to take the Blob

// ---- the card's state: store.retrieval --------------------------------------------------------------------------
// What a new question empties.
const NO_ANSWER = {
  hits: null,         // [{rank, file, window, start_token, end_token, score, text}]
  prompt: null,       // the packed prompt, verbatim
  promptTokens: 0,
  answers: null,      // {rag: text so far, plain: text so far | null (not compared)}
  result: null,       // "retrieval-answer": {rag, plain} with their timings
  error: null,
};

// What a new index, a Clear or Forget empties (the picked files and the defaults are kept apart).
const NOTHING = {
  plan: null,         // "retrieval-plan": {files [{name, tokens}], refused [{name, message}], windows, tokens}
  progress: null,     // the build's last "retrieval-progress": {what: "index", done, total, seconds, eta_s}
  built: null,        // "retrieval-ready"'s built: {windows, done, seconds, windows_per_s, stopped}
  ...NO_ANSWER,
  recallProgress: null,   // the recall's last "retrieval-progress" (what: "recall")
  recall: null,       // "retrieval-recall"'s recall: {queries, recall_at_1, recall_at_5, seconds, crop, seed}
  wiped: null,        // the index's buffers in the last Forget report: {buffers, before, after, labels}
};

// The tuned embedder as the card shows it; a new run, Forget and another model start it again.
const NO_TUNE = () => ({
  plan: null,         // "retrieval-tune-plan": {stages, steps, pairs, window, windows, rank | null, full, lr, ...}
  last: null,         // the last "retrieval-tune-progress": {phase (measure | train | index), row, stage, done, ...}
  table: null,        // {columns, rows [[name, recall@1, recall@5 (24), recall@1, recall@5 (12)]]}: as it grows
  result: null,       // "retrieval-tune-done"
  tuned: false,       // the worker holds a tuned embedder for this model
  full: false,        // ... every weight of the model (no adapter)
  on: true,           // ... the index embeds with it
  want: true,         // the switch asked for, its answer not back yet
  downloading: false,
  error: null,        // one line: a refusal or a failure
});

export function freshRetrieval() {
  return {
    seq: 0,             // the newest request; messages of older ones are dropped
    busy: null,         // what runs: null | "index" | "ask" | "recall" | "tune" | "switch"
    defaults: null,     // the inputs' defaults and bounds, from the "loaded" message (lab/worker/retrieval.py defaults)
    limits: null,       // why the model cannot be tuned ("loaded" stats.embedder: lab/worker/embedder.py defaults)
    picked: [],         // File objects picked or dropped, sent (and let go) by Index
    tune: NO_TUNE(),
    tuneLabels: [],     // the tuned embedder's buffers' labels, to find them in Forget's report (kept past a drop)
    tuneWiped: null,    // those buffers in the last Forget report: {buffers, before, after, full}
    ...NOTHING,
  };
}

const mine = (s, m) => m.seq === s.seq;

export function retrievalLoaded(s, stats) {
  s.defaults = stats.retrieval;
  s.limits = stats.embedder;
}

export function retrievalPlan(s, m) {
  if (mine(s, m)) s.plan = m;
}

// A "retrieval-progress"; true for a build's or a recall's first, when it has begun overwriting the KV cache (main.js
// then drops the chat's KV picture).
export function retrievalProgress(s, m) {
  if (!mine(s, m)) return false;
  const key = m.what === "recall" ? "recallProgress" : "progress";
  const first = !s[key];
  s[key] = m;
  return first;
}

export function retrievalReady(s, m) {
  if (!mine(s, m)) return;
  s.busy = null;
  s.built = m.built;
}

// The question's passages: true, since the search overwrote the KV cache (main.js drops the chat's KV picture).
export function retrievalHits(s, m) {
  if (!mine(s, m)) return false;
  s.hits = m.hits;
  s.prompt = m.prompt;
  s.promptTokens = m.prompt_tokens;
  return true;
}

export function retrievalToken(s, m) {
  if (!mine(s, m) || !s.answers) return;
  s.answers[m.which] += m.piece;
}

export function retrievalAnswer(s, m) {
  if (!mine(s, m)) return;
  s.busy = null;
  s.result = m;
  s.answers = { rag: m.rag.text, plain: m.plain ? m.plain.text : null };
}

export function retrievalRecall(s, m) {
  if (!mine(s, m)) return;
  s.busy = null;
  s.recall = m.recall;
}

export function retrievalFailed(s, m) {
  if (m.seq != null && m.seq !== s.seq) return;
  s.busy = null;
  s.error = m.message;
}

// ---- the tuning's messages (lab/worker/embedder.py) --------------------------------------------------------------
// Its plan: true, since its steps and measurements overwrite the KV cache (main.js drops the chat's KV picture).
export function retrievalTunePlan(s, m) {
  if (!mine(s, m)) return false;
  s.tune.plan = m;
  return true;
}

export function retrievalTuneProgress(s, m) {
  if (mine(s, m)) s.tune.last = m;
}

export function retrievalTuneTable(s, m) {
  if (mine(s, m)) s.tune.table = { columns: m.columns, rows: m.rows };
}

// The run's end: the index was embedded again (with the tuned embedder, or, after a divergence, without). True when
// every weight was tuned: the model the panels read changed (main.js reads them again).
export function retrievalTuneDone(s, m) {
  if (!mine(s, m)) return false;
  s.busy = null;
  Object.assign(s.tune, { result: m, table: m.table, tuned: m.tuned, full: m.full, on: m.on, want: m.on,
                          before: null });
  s.tuneLabels = m.labels;
  s.built = m.built;
  s.progress = null;      // the bar was the index before's: the status line says how the new one was built
  return m.full;
}

// The switch's answer: the index was embedded again (true: it overwrote the KV cache).
export function retrievalTuneSwitched(s, m) {
  if (!mine(s, m)) return false;
  s.busy = null;
  s.tune.on = s.tune.want = m.on;
  if (m.built) { s.built = m.built; s.progress = null; }
  return true;
}

// The adapter's bytes (or, every weight tuned, the model's): straight into a download, nothing kept.
export function retrievalTuneDownload(s, m, modelName) {
  s.tune.downloading = false;
  const bytes = new Uint8Array(m.bytes.buffer, m.bytes.byteOffset, m.size);
  const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
  const a = document.createElement("a");
  a.href = url;
  const stem = (modelName || "model").replace(/\.gguf$/i, "");
  a.download = m.full ? `${stem}.embedder.gguf` : `${stem}.embedder.lora.gguf`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), KEEP_URL_MS);
}

export function retrievalTuneFailed(s, m) {
  if (m.seq != null && m.seq !== s.seq) return;
  if (m.where !== "retrieval-tune-download") s.busy = null;
  // a run refused before it started leaves the tuned embedder before as it was (a failure after its start came
  // with "retrieval-dropped", which let it go)
  if (m.where === "retrieval-tune" && s.tune.before) s.tune = { ...s.tune.before, before: null };
  Object.assign(s.tune, { downloading: false, want: s.tune.on, error: m.message });
}

// A run that failed after its start: the worker dropped the index and the tuned embedder (its error follows).
export function retrievalDropped(s, m) {
  if (!mine(s, m) || s.busy !== "tune") return;
  Object.assign(s, NOTHING, { busy: null, tune: NO_TUNE(), tuneLabels: [] });
}

// Forget's report: the index's own buffers (labelled retrieval.*) and the tuned embedder's, each as read back before
// and after the wipe.
export function retrievalForgotten(s, report) {
  const sum = (items, key) => items.reduce((a, i) => a + i[key], 0);
  const tuned = new Set(s.tuneLabels);
  const items = report.items.filter((i) => i.label.startsWith("retrieval.") && !tuned.has(i.label));
  s.wiped = items.length ? { buffers: items.length, before: sum(items, "before"), after: sum(items, "after"),
                             labels: items.map((i) => i.label) } : null;
  const mine_ = report.items.filter((i) => tuned.has(i.label));
  s.tuneWiped = mine_.length ? { buffers: mine_.length, before: sum(mine_, "before"), after: sum(mine_, "after"),
                                 labels: mine_.map((i) => i.label),
                                 full: s.tuneLabels.some((l) => !l.startsWith("retrieval.")) } : null;
  s.tuneLabels = [];
}

// Forget, a new model, a lost GPU: the index is gone in the worker, and the tuned embedder with it, so is everything
// the card shows of them; what runs is stopped, and its remaining messages are dropped (seq). The tuned embedder's
// labels stay for Forget's report (retrievalForgotten).
export function dropRetrieval(s, worker) {
  if (s.busy) worker.postMessage({ type: "stop" });
  s.seq++;
  Object.assign(s, NOTHING, { busy: null, picked: [], tune: NO_TUNE(), tuneWiped: null });
  $("rag-files").value = "";
  $("rag-question").value = "";
}

// ---- events -------------------------------------------------------------------------------------------------------
const idle = (store) => store.loaded && !store.generating && !store.retrieval.busy;
const canIndex = (store) => idle(store) && store.retrieval.picked.length > 0;
const canAsk = (store) => idle(store) && $("rag-question").value.trim();
const indexed = (s) => s.built && s.built.done > 0;

function pick(store, files, rerender) {
  store.retrieval.picked = [...files];
  rerender();
}

function startIndex(store, worker, rerender) {
  if (!canIndex(store)) return;
  const s = store.retrieval;
  Object.assign(s, NOTHING, { busy: "index" });
  worker.postMessage({ type: "retrieval-index", files: s.picked, window: Number($("rag-window").value),
                       stride: Number($("rag-stride").value), seq: ++s.seq });
  s.picked = [];                       // the worker has its own copies (structured clone); these are let go
  $("rag-files").value = "";
  rerender();
}

function ask(store, worker, rerender, sampling) {
  if (!canAsk(store)) return;
  const s = store.retrieval;
  const compare = $("rag-compare").checked;
  Object.assign(s, NO_ANSWER, { busy: "ask", answers: { rag: "", plain: compare ? "" : null } });
  worker.postMessage({ type: "retrieval-ask", question: $("rag-question").value, k: Number($("rag-k").value), compare,
                       ...sampling(), seq: ++s.seq });
  rerender();
}

function measure(store, worker, rerender) {
  const s = store.retrieval;
  if (!idle(store) || !indexed(s)) return;
  Object.assign(s, { busy: "recall", recallProgress: null, recall: null, error: null });
  // seed 0, as `lab retrieval-eval`: the same crops every time, so two indexes of the same files compare
  worker.postMessage({ type: "retrieval-recall", queries: Number($("rag-queries").value), seed: 0, seq: ++s.seq });
  rerender();
}

function clear(store, worker, rerender) {
  const s = store.retrieval;
  if (s.busy) return;
  Object.assign(s, NOTHING);
  worker.postMessage({ type: "retrieval-drop", seq: ++s.seq });
  rerender();
}

// ---- tuning the embedder ------------------------------------------------------------------------------------------
const tuneMode = () => (document.querySelector("input[name=tune-mode]:checked")?.value ?? "lora");
// Why Tune cannot start on this model: the worker's words ("loaded" stats.embedder, the Training card's own).
function tuneRefusal(store) {
  const l = store.retrieval.limits;
  if (!store.loaded || !l) return null;
  return (tuneMode() === "full" ? l.full_refusal : l.refusal) ?? null;
}
const canTune = (store) => idle(store) && indexed(store.retrieval) && !tuneRefusal(store);

function startTune(store, worker, rerender) {
  if (!canTune(store)) return;
  const s = store.retrieval, num = (id) => Number($(id).value), full = tuneMode() === "full";
  // the tuned embedder stays the worker's until the run starts: a refusal puts it back here (retrievalTuneFailed)
  s.tune = { ...NO_TUNE(), before: s.tune };
  s.busy = "tune";
  worker.postMessage({ type: "retrieval-tune", stage: $("tune-stage").value, steps: num("tune-steps"),
                       pairs: num("tune-pairs"), lr: num("tune-lr"), queries: num("rag-queries"),
                       ...(full ? { full } : { rank: num("tune-rank") }), seq: ++s.seq });
  rerender();
}

// The mode changed: the learning rate's default is each mode's own (a LoRA's moves a small pair from zero, every
// weight's all of a trained model's at once), unless the field holds a value the user typed (it stays), as the
// Training card's.
function tuneModeChanged(store, rerender) {
  const lr = $("tune-lr"), d = lr.dataset;
  if (lr.value === d.auto) lr.value = d.auto = tuneMode() === "full" ? d.full : d.lora;
  store.retrieval.tune.error = null;
  rerender();
}

function wireTune(store, worker, rerender) {
  const s = store.retrieval;
  $("tune-start").addEventListener("click", () => startTune(store, worker, rerender));
  $("tune-stop").addEventListener("click", () => {
    if (s.busy === "tune" || s.busy === "switch") worker.postMessage({ type: "stop" });
  });
  const lr = $("tune-lr");
  lr.dataset.lora = lr.dataset.auto = lr.value;      // the template's value: lab/settings.py EMBEDDER.lr
  for (const r of document.querySelectorAll("input[name=tune-mode]")) {
    r.addEventListener("change", () => tuneModeChanged(store, rerender));
  }
  $("tune-on").addEventListener("change", (e) => {
    if (!s.tune.tuned || s.tune.full || !idle(store)) { e.target.checked = s.tune.on; return; }
    s.busy = "switch";
    s.tune.want = e.target.checked;
    s.tune.error = null;
    worker.postMessage({ type: "retrieval-tune-switch", on: e.target.checked, seq: ++s.seq });
    rerender();
  });
  $("tune-download").addEventListener("click", () => {
    if (!s.tune.tuned || s.tune.downloading || s.busy) return;
    s.tune.downloading = true;
    worker.postMessage({ type: "retrieval-tune-download", seq: s.seq });
    rerender();
  });
}

// sampling(): {settings, max_new} from the chat's Sampling inputs, which the answers use too.
export function wireRetrieval(store, worker, rerender, sampling) {
  $("rag-files").addEventListener("change", (e) => pick(store, e.target.files, rerender));
  const zone = $("rag-drop");
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    pick(store, e.dataTransfer.files, rerender);
  });
  $("rag-index").addEventListener("click", () => startIndex(store, worker, rerender));
  // Index, Ask and Measure recall each have their Stop (the page's one "stop" message): a build keeps the windows done,
  // an answer ends at its next token, a recall reports the queries it ran
  for (const id of ["rag-stop", "rag-ask-stop", "rag-recall-stop"]) {
    $(id).addEventListener("click", () => { if (store.retrieval.busy) worker.postMessage({ type: "stop" }); });
  }
  $("rag-clear").addEventListener("click", () => clear(store, worker, rerender));
  $("rag-ask").addEventListener("click", () => ask(store, worker, rerender, sampling));
  $("rag-question").addEventListener("input", () => rerender());
  $("rag-question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); ask(store, worker, rerender, sampling); }
  });
  $("rag-recall").addEventListener("click", () => measure(store, worker, rerender));
  wireTune(store, worker, rerender);
}

// ---- rendering ----------------------------------------------------------------------------------------------------
const secs = (x) => `${x.toFixed(x < 10 ? 1 : 0)} s`;   // seconds: a tenth below ten, whole ones above

// The inputs take the worker's defaults once a model is loaded, and its bounds (the window's depends on the context).
function renderInputs(store) {
  const d = store.retrieval.defaults;
  if (!d) return;
  const set = (id, value, min, max) => {
    const input = $(id);
    input.min = String(min);
    input.max = String(max);
    if (!input.value) input.value = String(value);
  };
  set("rag-window", d.window, d.min_window, d.max_window);
  set("rag-stride", d.stride, 1, d.max_window);
  set("rag-k", d.k, 1, d.max_k);
  set("rag-queries", d.queries, 1, d.max_queries);
}

// The status line: its state and text.
function status(store) {
  const s = store.retrieval, p = s.progress;
  if (!store.loaded) return { state: "idle", text: "load a model first" };
  if (s.busy === "index") {
    if (!s.plan) return { state: "indexing", text: "reading and tokenizing the files…" };
    return { state: "indexing", text: `${s.plan.tokens.toLocaleString("en")} tokens in ${s.plan.windows} windows; `
      + (p ? "embedding…" : "embedding the first window (its time is the estimate for the rest)…") };
  }
  if (s.busy === "ask") return { state: "asking", text: s.hits ? "answering…" : "searching the index…" };
  if (s.busy === "recall") return { state: "recalling", text: "measuring recall…" };
  if (s.busy === "tune") return { state: "tuning", text: "tuning the embedder (below)…" };
  if (s.busy === "switch") return { state: "indexing", text: "embedding the index again (below)…" };
  if (s.error) return { state: "error", text: s.error };
  const b = s.built;
  if (b) {
    const rate = `${b.done} windows in ${secs(b.seconds)} (${b.windows_per_s} windows/s)`;
    return b.stopped ? { state: "stopped", text: `stopped: ${rate} of ${b.windows}; the index holds those` }
      : { state: "ready", text: `indexed: ${rate}` };
  }
  return { state: "idle", text: s.picked.length ? "" : "pick or drop text files, then Index" };
}

// A build's or a recall's bar, while it runs and after it (full, with its time), until the next one starts.
function renderProgress(p, running, row, bar, text, what) {
  $(row).hidden = !running && !p;
  $(bar).value = p && p.total ? p.done / p.total : 0;
  const t = $(text);
  t.dataset.done = p ? p.done : "";
  t.dataset.total = p ? p.total : "";
  t.textContent = !p ? "starting…" : `${p.done} / ${p.total} ${what} done`
    + (p.done === p.total || !running ? ` in ${secs(p.seconds)}`
      : p.eta_s == null ? "" : `, about ${Math.ceil(p.eta_s)} s left`);
}

function renderFiles(s) {
  const picked = $("rag-picked");
  picked.textContent = s.picked.length
    ? `${s.picked.length} file${s.picked.length > 1 ? "s" : ""} picked: ${s.picked.map((f) => f.name).join(", ")}` : "";
  const list = $("rag-file-list");
  if (list.rendered === s.plan) return;      // rebuilt only when the plan changes, not on every token
  list.rendered = s.plan;
  const files = s.plan ? s.plan.files : [], refused = s.plan ? s.plan.refused : [];
  list.replaceChildren(
    ...files.map((f) => {
      const li = testid(el("li", "rag-file"), "rag-file");
      li.dataset.name = f.name;
      li.dataset.tokens = f.tokens;
      li.append(el("span", "rag-name", f.name), el("span", "muted", ` ${f.tokens.toLocaleString("en")} tokens`));
      return li;
    }),
    ...refused.map((f) => {
      const li = testid(el("li", "rag-refused"), "rag-refused");
      li.dataset.name = f.name;
      li.append(el("span", "rag-tag", "refused"), el("span", null, ` ${f.message}`));
      return li;
    }));
}

function renderHits(s) {
  const list = $("rag-hits");
  if (list.rendered === s.hits) return;
  list.rendered = s.hits;
  $("rag-hits-block").hidden = !s.hits;
  list.replaceChildren(...(s.hits || []).map((h) => {
    const li = testid(el("li", "rag-hit"), "rag-hit");
    li.dataset.rank = h.rank;
    li.dataset.score = h.score;
    li.dataset.file = h.file;
    const head = el("div", "rag-hit-head");
    head.append(el("span", "rag-rank", `#${h.rank}`), el("span", "rag-score", h.score.toFixed(3)),
      el("span", "rag-name", h.file), el("span", "muted", `tokens ${h.start_token}–${h.end_token}`));
    li.append(head, el("div", "rag-passage", h.text));
    return li;
  }));
}

function renderPrompt(s) {
  $("rag-prompt-block").hidden = s.prompt == null;
  $("rag-prompt").textContent = s.prompt ?? "";
  $("rag-prompt-tokens").textContent = s.prompt == null ? "" : `(${s.promptTokens.toLocaleString("en")} tokens)`;
}

function renderAnswers(s) {
  const a = s.answers, box = $("rag-answers");
  box.hidden = !a;
  box.classList.toggle("compared", !!a && a.plain != null);
  $("rag-plain").hidden = !a || a.plain == null;
  $("rag-rag-text").textContent = a ? a.rag : "";
  $("rag-plain-text").textContent = a && a.plain != null ? a.plain : "";
  const r = s.result;
  const timing = (x) => (x ? `${x.ids.length} tokens (${x.stop}) · first token after ${secs(x.ttft_s)}`
    + ` (${x.prefilled} prompt tokens prefilled)` : "");
  $("rag-rag-meta").textContent = timing(r?.rag);
  $("rag-plain-meta").textContent = timing(r?.plain);
  box.dataset.state = r ? "done" : a ? "streaming" : "";
}

function renderRecall(s) {
  const out = $("rag-recall-result"), r = s.recall;
  out.hidden = !r;
  if (!r) { out.replaceChildren(); return; }
  const pct = (x) => `${(100 * x).toFixed(1)} %`;
  const rows = [
    ["recall@1", pct(r.recall_at_1), "rag-recall-1", r.recall_at_1],
    ["recall@5", pct(r.recall_at_5), "rag-recall-5", r.recall_at_5],
    ["queries", `${r.queries} random ${r.crop}-token crops (seed ${r.seed})`, "rag-recall-queries", r.queries],
    ["time", secs(r.seconds), "rag-recall-time", r.seconds],
  ];
  out.replaceChildren(...rows.flatMap(([k, v, id, value]) => {
    const dd = testid(el("dd", null, v), id);
    dd.dataset.value = value;
    return [el("dt", null, k), dd];
  }));
}

function renderWiped(s) {
  const w = s.wiped, line = $("rag-wiped");
  line.hidden = !w;
  line.dataset.before = w ? w.before : "";
  line.dataset.after = w ? w.after : "";
  line.dataset.state = !w ? "" : w.after ? "failed" : "wiped";
  line.textContent = !w ? "" : w.after
    ? `Forget did NOT wipe the index: ${w.after} non-zero words remain in its buffers`
    : `Forget wiped the index: ${w.before.toLocaleString("en")} non-zero words in its ${w.buffers} buffers `
      + `(${w.labels.join(", ")}) read back as zero.`;
}

// The tuning's line: what runs, or how the last run ended.
function tuneStatus(store) {
  const s = store.retrieval, t = s.tune, p = t.last;
  if (s.busy === "tune") {
    if (!t.plan) return { state: "running", text: "making the adapter and checking the settings…" };
    if (!p || p.phase === "measure") {
      return { state: "running", text: `measuring recall ${p?.row ?? "untuned"}: a fresh index of the files` };
    }
    if (p.phase === "train") return { state: "running", text: `stage ${p.stage}: training` };
    return { state: "running", text: "embedding the index with the tuned embedder, then measuring its recall" };
  }
  if (s.busy === "switch") {
    return { state: "running", text: `embedding the index ${t.want ? "with" : "without"} the tuned embedder` };
  }
  const r = t.result;
  if (r) {
    if (r.diverged) {
      return { state: "error", text: `stopped after ${r.steps_done} steps: the embeddings are no numbers any more (the `
        + "learning rate is too high)" + (r.full ? "; the model's weights are lost: load the file again"
          : "; the adapter is dropped and the index embedded untuned") };
    }
    const head = r.stopped ? `stopped after ${r.steps_done} steps` : `done: ${r.steps_done} steps`;
    return { state: r.stopped ? "stopped" : "done", text: `${head} in ${secs(r.seconds)}; `
      + (t.full ? "the model itself is tuned: the index, the chat and every card use it"
        : t.on ? "the index and the questions are embedded with the tuned adapter"
          : "the index is embedded without it (switched off)") };
  }
  if (!indexed(s)) return { state: "idle", text: "index some files first, then Tune" };
  return { state: "idle", text: "" };
}

function renderTuneProgress(s) {
  const running = s.busy === "tune" || s.busy === "switch", p = s.tune.last;
  $("tune-progress-row").hidden = !running;
  $("tune-bar").value = running && p && p.total ? p.done / p.total : 0;
  const t = $("tune-progress-text");
  t.dataset.phase = running && p ? p.phase : "";
  t.dataset.done = running && p ? p.done : "";
  t.textContent = !running || !p ? "" : p.phase === "train"
    ? `step ${p.done} of ${p.total} · loss ${p.loss.toFixed(4)} · ${secs(p.seconds)}`
    : `${p.done} / ${p.total} windows embedded`;
}

// The table `lab train-embedder` prints (lab/instruments/embedder.py rows), as it grows, and what the run was.
function renderTuneTable(s) {
  const t = s.tune.table, table = $("tune-table"), plan = s.tune.plan;
  table.hidden = !t;
  if (table.rendered === t && table.planned === plan) return;
  table.rendered = t;
  table.planned = plan;
  if (!t) { $("tune-head").replaceChildren(); $("tune-rows").replaceChildren(); table.deleteCaption(); return; }
  $("tune-head").replaceChildren(el("th", null, ""), ...t.columns.map((c) => el("th", null, c)));
  $("tune-rows").replaceChildren(...t.rows.map(([name, ...cells]) => {
    const tr = testid(el("tr", null), "tune-row");
    tr.dataset.name = name;
    tr.append(el("td", null, name), ...cells.map((v) => {
      const td = el("td", "num", v.toFixed(3));
      td.dataset.value = v;
      return td;
    }));
    return tr;
  }));
  if (!plan) { table.deleteCaption(); return; }
  const memory = Object.values(plan.memory).reduce((a, b) => a + b, 0);
  table.createCaption().textContent = `${plan.windows} windows of ${plan.window} tokens side by side, ${plan.pairs} `
    + `pairs a step, ${plan.steps} steps a stage; `
    + (plan.full ? "every weight of the model" : `a LoRA adapter of rank ${plan.rank}`)
    + ` (${plan.params.toLocaleString("en")} parameters), AdamW at learning rate ${plan.lr}, `
    + `${fmtBytes(memory)} of training buffers; recall on ${plan.queries} random crops of each length (seed 0)`;
}

function renderTuneAfter(store) {
  const s = store.retrieval, t = s.tune;
  $("tune-after").hidden = !t.tuned || s.busy === "tune";
  for (const e of $("tune-after").querySelectorAll("[data-tune=lora]")) e.hidden = t.full;
  $("tune-on").checked = s.busy === "switch" ? t.want : t.on;
  $("tune-on").disabled = !idle(store) && s.busy !== "switch";
  $("tune-download").disabled = !t.tuned || !!s.busy || t.downloading;
  $("tune-download").textContent = t.full ? "Download the model (.gguf)" : "Download the adapter (.gguf)";
  const hint = $("tune-file-hint");
  hint.hidden = !t.tuned || s.busy === "tune";
  hint.textContent = t.full
    ? "The loaded file's metadata and vocabulary with every tensor as tuned, in F32: llama.cpp and this page load it "
      + "like any model file."
    : "A llama.cpp LoRA adapter of this model: lab index, lab ask and lab retrieval-eval take it with --lora.";
}

function renderTuneWiped(s) {
  const w = s.tuneWiped, line = $("tune-wiped");
  line.hidden = !w;
  line.dataset.before = w ? w.before : "";
  line.dataset.after = w ? w.after : "";
  line.dataset.state = !w ? "" : w.after ? "failed" : "wiped";
  line.textContent = !w ? "" : w.after
    ? `Forget did NOT wipe the tuned embedder: ${w.after} non-zero words remain in its buffers`
    : w.full
      ? `Forget wiped the tuned model's weights, ${w.buffers} buffers holding data (${w.before.toLocaleString("en")} `
        + "non-zero words read back as zero), and unloaded it."
      : `Forget wiped the tuned embedder: ${w.before.toLocaleString("en")} non-zero words in its ${w.buffers} `
        + `buffers (${w.labels.join(", ")}) read back as zero.`;
}

function renderTune(store) {
  const s = store.retrieval, why = s.tune.error || tuneRefusal(store), line = $("tune-refusal");
  line.hidden = !why;
  line.textContent = why || "";
  line.dataset.kind = s.tune.error ? "error" : why ? "refusal" : "";
  $("tune-start").disabled = !canTune(store);
  $("tune-stop").disabled = s.busy !== "tune" && s.busy !== "switch";
  const full = tuneMode() === "full";
  for (const id of ["tune-stage", "tune-steps", "tune-pairs", "tune-lr", "tune-mode-lora", "tune-mode-full"]) {
    $(id).disabled = !!s.busy;
  }
  $("tune-rank").disabled = !!s.busy || full;
  const st = tuneStatus(store), status = $("tune-status");
  status.dataset.state = st.state;
  status.textContent = st.text;
  renderTuneProgress(s);
  renderTuneTable(s);
  renderTuneAfter(store);
  renderTuneWiped(s);
}

export function renderRetrieval(store) {
  const s = store.retrieval;
  renderInputs(store);
  $("rag-index").disabled = !canIndex(store);
  $("rag-stop").disabled = s.busy !== "index";
  $("rag-ask-stop").disabled = s.busy !== "ask";
  $("rag-recall-stop").disabled = s.busy !== "recall";
  $("rag-clear").disabled = !!s.busy || !(s.plan || s.built);
  $("rag-ask").disabled = !canAsk(store);
  $("rag-recall").disabled = !idle(store) || !indexed(s);
  for (const id of ["rag-files", "rag-window", "rag-stride"]) $(id).disabled = !store.loaded || !!s.busy;
  const st = status(store), line = $("rag-status");
  line.dataset.state = st.state;
  line.textContent = st.text;
  renderProgress(s.progress, s.busy === "index", "rag-progress-row", "rag-bar", "rag-progress-text", "windows");
  renderProgress(s.recallProgress, s.busy === "recall", "rag-recall-row", "rag-recall-bar", "rag-recall-text",
    "queries");
  renderFiles(s);
  renderHits(s);
  renderPrompt(s);
  renderAnswers(s);
  renderRecall(s);
  renderWiped(s);
  renderTune(store);
}

// ---- folded (web/navigator.js): the card in one line ----------------------------------------------------------------
// What the index holds, or what runs.
function retrievalLine(store) {
  const s = store.retrieval, st = status(store), pct = (x) => `${(100 * x).toFixed(1)} %`;
  const recall = s.recall ? ` · recall@1 ${pct(s.recall.recall_at_1)}, @5 ${pct(s.recall.recall_at_5)}` : "";
  const t = s.tune, tuned = !t.tuned ? "" : t.full ? " · every weight tuned" : t.on ? " · tuned embedder on"
    : " · tuned embedder off";
  return (st.text || "no files indexed") + recall + tuned;
}

// ---- its place in the page (web/cards.js): a new chat keeps the index (the user's files, not the conversation);
// Forget, another file and a lost GPU drop it, and Forget's report says whether its buffers read back as zero.
export const card = {
  key: "retrieval",
  fresh: freshRetrieval,
  render: renderRetrieval,
  wire: (store, worker, page) => wireRetrieval(store, worker, page.render, page.sampling),
  loaded: (store, stats) => retrievalLoaded(store.retrieval, stats),
  summary: retrievalLine,
  forgetting: (store, worker) => dropRetrieval(store.retrieval, worker),
  forgotten: (store, report) => retrievalForgotten(store.retrieval, report),
  dropped: (store, worker) => dropRetrieval(store.retrieval, worker),    // the index was the old model's embeddings
};
