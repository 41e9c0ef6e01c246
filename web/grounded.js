// The grounded card, "Answer from your files, or decline" (issue #44 part 4; the worker's side is
// lab/worker/grounded.py, the rules lab/instruments/grounded.py): a set made by rule from the files the retrieval card
// indexed (questions whose answers are quoted from a passage shown; rows shown passages without the answer, which must
// decline), downloaded or handed to the Training card to train a LoRA on; then each held-out row's greedy reply,
// without and with the Training card's adapter, scored three ways: refuses when it should, refuses when it should not,
// and grounding (the share of a reply's five-word sequences found verbatim in the passages it was shown).
// The set is made of the user's files: it is kept here only until Forget, another model or a lost GPU, and the worker
// keeps none of it (the measure gets the held-out rows back each time). Stop posts "stop" (web/worker.js records it
// while Python is busy): the measure ends after the reply in flight, with the rows it scored.
const $ = (id) => document.getElementById(id);
const KEEP_URL_MS = 10_000;     // a download's object URL, revoked after the click has used it

// ---- the card's state: store.grounded -----------------------------------------------------------------------------
export function freshGrounded() {
  return {
    seq: 0,             // the newest request; messages of older ones are dropped
    making: false,
    set: null,          // "grounded-set": {files, train, held (.jsonl texts), rows, refusals, held_rows, held_refusals}
    running: false,     // a measure in flight
    progress: null,     // its last "grounded-row": {which, done, total}
    result: null,       // "grounded-eval": {without, with, stopped}
    error: null,
  };
}

const NOTHING = { making: false, set: null, running: false, progress: null, result: null, error: null };

export function groundedSet(s, m) {
  if (m.seq !== s.seq) return;
  Object.assign(s, NOTHING, { set: m });
}

// A "grounded-row"; true for the measure's first, when it has begun overwriting the KV cache (main.js then drops the
// chat's KV picture).
export function groundedRow(s, m) {
  if (m.seq !== s.seq) return false;
  const first = !s.progress;
  s.progress = m;
  return first;
}

export function groundedEval(s, m) {
  if (m.seq !== s.seq) return;
  s.running = false;
  s.result = m;
}

export function groundedFailed(s, m) {
  if (m.seq != null && m.seq !== s.seq) return;
  s.making = false;
  s.running = false;
  s.error = m.message;
}

// Forget, another model, a lost GPU: the set (the user's files' sentences) and the scores go; a run is stopped.
function dropGrounded(s, worker) {
  if (s.making || s.running) worker.postMessage({ type: "stop" });
  s.seq++;
  Object.assign(s, NOTHING);
}

// ---- events -------------------------------------------------------------------------------------------------------
const busy = (store) => store.grounded.making || store.grounded.running || store.generating;

function make(store, worker, rerender) {
  const s = store.grounded;
  if (!store.loaded || busy(store)) return;
  Object.assign(s, NOTHING, { making: true });
  worker.postMessage({ type: "grounded-set", seq: ++s.seq });
  rerender();
}

function measure(store, worker, rerender) {
  const s = store.grounded;
  if (!store.loaded || busy(store) || !s.set) return;
  Object.assign(s, { running: true, progress: null, result: null, error: null });
  worker.postMessage({ type: "grounded-eval", held: s.set.held, max_new: Number($("gr-new").value), seq: ++s.seq });
  rerender();
}

function download(text, name) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/jsonl" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), KEEP_URL_MS);
}

// The set handed to the Training card as its picked file: Train then trains on its answers (a .jsonl of chat turns).
function toTraining(store, rerender) {
  const s = store.grounded;
  if (!s.set) return;
  store.training.file = { name: "grounded.jsonl", text: s.set.train };
  store.training.error = null;
  $("train-source-file").checked = true;
  rerender();
  $("training").scrollIntoView({ block: "start" });
}

export function wireGrounded(store, worker, rerender) {
  $("gr-make").addEventListener("click", () => make(store, worker, rerender));
  $("gr-measure").addEventListener("click", () => measure(store, worker, rerender));
  $("gr-stop").addEventListener("click", () => { if (store.grounded.running) worker.postMessage({ type: "stop" }); });
  $("gr-download").addEventListener("click", () => store.grounded.set && download(store.grounded.set.train,
                                                                                   "grounded.jsonl"));
  $("gr-download-held").addEventListener("click", () => store.grounded.set
    && download(store.grounded.set.held, "grounded.heldout.jsonl"));
  $("gr-train").addEventListener("click", () => toTraining(store, rerender));
}

// ---- rendering ----------------------------------------------------------------------------------------------------
const pct = (x) => (x == null ? "—" : `${Math.round(100 * x)}%`);
const count = (n, one, many) => `${n} ${n === 1 ? one : many}`;

function status(store) {
  const s = store.grounded, p = s.progress, r = s.result;
  if (s.making) return { state: "running", text: "making the set from the indexed files…" };
  if (s.running) {
    return { state: "running", text: !p ? "the first reply…"
      : `reply ${p.done} of ${p.total} ${p.which === "with" ? "with the adapter" : "without the adapter"}` };
  }
  if (s.error) return { state: "error", text: s.error };
  if (r) {
    const by = r.with && r.without ? "without and with the adapter"
      : r.with ? "by the model as trained" : "by the model as loaded";
    return { state: r.stopped ? "stopped" : "done", text: r.stopped ? "stopped: the rows replied so far"
      : `done: ${count(p ? p.total : 0, "held-out row", "held-out rows")}, each replied ${by}` };
  }
  return { state: "idle", text: store.loaded ? "" : "load a model first" };
}

function renderSet(s) {
  const out = $("gr-set");
  out.hidden = !s.set;
  if (!s.set) { out.textContent = ""; return; }
  const m = s.set;
  out.textContent = `${m.rows} rows to train on (${m.refusals} decline) and ${m.held_rows} held out `
    + `(${m.held_refusals} decline), from ${m.files.length} file${m.files.length === 1 ? "" : "s"}`;
  out.dataset.rows = m.rows;
  out.dataset.held = m.held_rows;
}

function renderScores(s) {
  const table = $("gr-scores"), r = s.result;
  table.hidden = !r;
  const body = table.tBodies[0];
  if (!r) { body.replaceChildren(); return; }
  const rows = [["without", "the model as loaded"], ["with", r.without ? "with the Training card's adapter"
    : "the model as trained"]]
    .filter(([key]) => r[key]);
  body.replaceChildren(...rows.map(([key, name]) => {
    const tr = document.createElement("tr");
    tr.dataset.which = key;
    const sc = r[key];
    const of = (x, n, one, many) => `${pct(x)} of ${count(n, one, many)}`;
    const cells = [[name, ""], [of(sc.refuses_when_it_should, sc.rows_should_refuse, "row", "rows"), "should"],
                   [of(sc.refuses_when_it_should_not, sc.rows_should_answer, "row", "rows"), "should-not"],
                   [of(sc.grounding, sc.replies_grounded, "reply", "replies"), "grounding"]];
    for (const [text, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      if (cls) td.dataset.col = cls;
      tr.append(td);
    }
    return tr;
  }));
}

export function renderGrounded(store) {
  const s = store.grounded, p = s.progress;
  const { state, text } = status(store);
  const line = $("gr-status");
  line.dataset.state = state;
  line.textContent = text;
  $("gr-make").disabled = !store.loaded || busy(store);
  for (const id of ["gr-measure", "gr-download", "gr-download-held", "gr-train"]) {
    $(id).disabled = !store.loaded || busy(store) || !s.set;
  }
  $("gr-stop").disabled = !s.running;
  $("gr-progress-row").hidden = !s.running;
  $("gr-bar").max = p ? p.total : 1;
  $("gr-bar").value = p ? p.done : 0;
  renderSet(s);
  renderScores(s);
}

// ---- its place in the page (web/cards.js): a new chat keeps the set (the files are not the conversation); Forget,
// another model and a lost GPU drop it.
export const card = {
  key: "grounded",
  fresh: freshGrounded,
  render: renderGrounded,
  wire: (store, worker, page) => wireGrounded(store, worker, page.render),
  summary: (store) => status(store).text || (store.grounded.set ? `a set of ${store.grounded.set.rows} rows`
    : "no set made yet"),
  forgetting: (store, worker) => dropGrounded(store.grounded, worker),
  dropped: (store, worker) => dropGrounded(store.grounded, worker),
};
