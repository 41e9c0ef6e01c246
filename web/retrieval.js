// The retrieval card, "Ask your files": text files indexed by the loaded model's own embeddings, a question answered
// from the passages nearest to it, and the index's measured recall (lab/instruments/retrieval.py; the worker's side is
// lab/worker/retrieval.py). The worker does all of it; this card sends the files and the question, and shows the
// plan, the progress, the ranked passages, the prompt exactly as the model reads it, and the answers as they stream.
// Everything that comes from a file (its name, its passages, the prompt that holds them, the answers) is set as
// text (textContent), never parsed as HTML: a file may hold <script> or <img onerror=...>, and they show as written.
// The files are conversation-like data: the File objects are held only until Index sends them, nothing is stored, and
// dropRetrieval (Forget, a new model, a lost GPU) empties the card and stops what runs; a new chat keeps the index.
// Its state is store.retrieval (freshRetrieval): main.js hands the worker's messages to the update functions below;
// its `card` (web/cards.js, at the end) says what a model's life does to it, and draws it with renderRetrieval.
import { node as el, withTestid as testid } from "/web/panels.js";

const $ = (id) => document.getElementById(id);

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

export function freshRetrieval() {
  return {
    seq: 0,             // the newest request; messages of older ones are dropped
    busy: null,         // what runs: null | "index" | "ask" | "recall"
    defaults: null,     // the inputs' defaults and bounds, from the "loaded" message (lab/worker/retrieval.py defaults)
    picked: [],         // File objects picked or dropped, sent (and let go) by Index
    ...NOTHING,
  };
}

const mine = (s, m) => m.seq === s.seq;

export function retrievalLoaded(s, stats) {
  s.defaults = stats.retrieval;
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

// Forget's report: the index's own buffers (labelled retrieval.*), as read back before and after the wipe.
export function retrievalForgotten(s, report) {
  const items = report.items.filter((i) => i.label.startsWith("retrieval."));
  const sum = (key) => items.reduce((a, i) => a + i[key], 0);
  s.wiped = items.length
    ? { buffers: items.length, before: sum("before"), after: sum("after"), labels: items.map((i) => i.label) } : null;
}

// Forget, a new model, a lost GPU: the index is gone in the worker, so is everything the card shows of it; what runs
// is stopped, and its remaining messages are dropped (seq).
export function dropRetrieval(s, worker) {
  if (s.busy) worker.postMessage({ type: "stop" });
  s.seq++;
  Object.assign(s, NOTHING, { busy: null, picked: [] });
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
}

// ---- folded (web/navigator.js): the card in one line ----------------------------------------------------------------
// What the index holds, or what runs.
function retrievalLine(store) {
  const s = store.retrieval, st = status(store), pct = (x) => `${(100 * x).toFixed(1)} %`;
  const recall = s.recall ? ` · recall@1 ${pct(s.recall.recall_at_1)}, @5 ${pct(s.recall.recall_at_5)}` : "";
  return (st.text || "no files indexed") + recall;
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
