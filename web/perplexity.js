// The perplexity card: pasted text scored by the loaded model the way llama.cpp's llama-perplexity scores it
// (lab/instruments/perplexity.py; the worker's side is lab/worker/perplexity.py). The worker does all of it; this card
// sends the text and the window, shows "chunk i of n" and the running value as they come, and the result.
// Cancel posts "stop", which web/worker.js records itself while Python is busy (labStopRequested); the run checks it
// after every step and answers with the chunks it finished.
// The pasted text is conversation-like data: it is never stored (it stays in the textarea), and dropPerplexity
// (Forget, New chat, a new model) empties the textarea, drops the result and stops a run in flight.
// Its state is store.perplexity (freshPerplexity): main.js hands the worker's messages to the update functions below;
// its `card` (web/cards.js, at the end) says what a model's life does to it, and draws it with renderPerplexity.
const $ = (id) => document.getElementById(id);

// The windows offered (tokens), within the bounds the template writes on the select from lab.settings
// (PERPLEXITY_MIN_CTX .. PERPLEXITY_MAX_CTX) and the loaded context; the select starts at PERPLEXITY_CTX.
const WINDOWS = [64, 128, 256, 512];

// ---- the card's state: store.perplexity ---------------------------------------------------------------------------
export function freshPerplexity() {
  return {
    seq: 0,             // the newest run asked for; messages of older runs are dropped
    running: false,
    progress: null,     // the last "perplexity-progress": {chunk, chunks, ppl, n_tokens}
    result: null,       // the "perplexity" message's result
    error: null,
  };
}

const NO_RESULT = { progress: null, result: null, error: null };

// A "perplexity-progress"; true for the run's first, when it has begun overwriting the KV cache (main.js then drops
// the chat's KV picture).
export function pplProgress(s, m) {
  if (m.seq !== s.seq) return false;
  const first = !s.progress;
  s.progress = m;
  return first;
}

export function pplResult(s, m) {
  if (m.seq !== s.seq) return;
  s.running = false;
  s.result = m.result;
}

export function pplFailed(s, m) {
  if (m.seq != null && m.seq !== s.seq) return;
  s.running = false;
  s.error = m.message;
}

// The conversation was dropped: the pasted text goes with it, and a run in flight is stopped.
export function dropPerplexity(s, worker) {
  if (s.running) worker.postMessage({ type: "stop" });
  $("ppl-text").value = "";
  s.seq++;            // an answer still on its way is about the dropped text
  Object.assign(s, NO_RESULT, { running: false });
}

// ---- events -------------------------------------------------------------------------------------------------------
const canRun = (store) => store.loaded && !store.generating && !store.perplexity.running && $("ppl-text").value.trim();

function run(store, worker, rerender) {
  if (!canRun(store)) return;
  const s = store.perplexity;
  Object.assign(s, NO_RESULT, { running: true });
  worker.postMessage({ type: "perplexity", text: $("ppl-text").value, n_ctx: Number($("ppl-ctx").value), seq: ++s.seq });
  rerender();
}

export function wirePerplexity(store, worker, rerender) {
  $("ppl-run").addEventListener("click", () => run(store, worker, rerender));
  $("ppl-cancel").addEventListener("click", () => {
    if (store.perplexity.running) worker.postMessage({ type: "stop" });
  });
  $("ppl-text").addEventListener("input", () => rerender());
}

// ---- rendering ----------------------------------------------------------------------------------------------------
// The window select: rebuilt when the loaded context changes what it may offer; a choice still offered is kept.
function renderWindows(nCtx) {
  const sel = $("ppl-ctx");
  const byDefault = Number(sel.dataset.default), min = Number(sel.dataset.min), max = Number(sel.dataset.max);
  const allowed = WINDOWS.filter((c) => c >= min && c <= max && (!nCtx || c <= nCtx));
  if (sel.options.length === allowed.length) return;
  const keep = Number(sel.value) || byDefault;
  sel.replaceChildren(...allowed.map((c) => new Option(`${c} tokens`, String(c))));
  sel.value = String(allowed.includes(keep) ? keep : allowed.includes(byDefault) ? byDefault : allowed.at(-1));
}

// The status line: its state (idle | running | error | cancelled | done) and text.
function status(store) {
  const s = store.perplexity, p = s.progress, r = s.result;
  if (s.running) {
    return { state: "running", text: !p ? "tokenizing…"
      : `chunk ${Math.min(p.chunk + 1, p.chunks)} of ${p.chunks} running`
        + (p.ppl != null ? ` · after ${p.chunk}: perplexity ${p.ppl.toFixed(4)}` : "") + ` · ${p.n_tokens} tokens` };
  }
  if (s.error) return { state: "error", text: s.error };
  if (r) {
    return r.stopped ? { state: "cancelled", text: `cancelled after ${r.chunks} of ${r.chunks_total} chunks` }
      : { state: "done", text: "done" };
  }
  return { state: "idle", text: store.loaded ? "" : "load a model first" };
}

function renderStatus(store) {
  const p = store.perplexity.progress;
  const { state, text } = status(store);
  const el = $("ppl-status");
  el.dataset.state = state;
  el.dataset.chunk = p ? p.chunk : "";
  el.dataset.chunks = p ? p.chunks : "";
  el.dataset.ppl = p && p.ppl != null ? p.ppl : "";
  el.textContent = text;
}

function renderResult(r) {
  const out = $("ppl-result");
  out.hidden = !r || r.ppl == null;
  if (!r || r.ppl == null) { out.replaceChildren(); return; }
  const rows = [
    ["perplexity", `${r.ppl.toFixed(4)}${r.ppl_err != null ? ` ± ${r.ppl_err.toFixed(4)}` : ""}`, "ppl-value", r.ppl],
    ["chunks", `${r.chunks} of ${r.n_ctx} tokens${r.stopped ? ` (of ${r.chunks_total})` : ""}`, "ppl-chunks", r.chunks],
    ["tokens scored", `${r.tokens_scored} of ${r.n_tokens}`, "ppl-scored", r.tokens_scored],
    ["after each chunk", r.running.map((v, i) => `[${i + 1}]${v.toFixed(4)}`).join(" "), "ppl-running", ""],
    ["time", `${r.seconds.toFixed(1)} s`, "ppl-time", r.seconds],
  ];
  out.replaceChildren(...rows.flatMap(([k, v, testid, value]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    dd.setAttribute("data-testid", testid);
    dd.dataset.value = value;
    return [dt, dd];
  }));
}

export function renderPerplexity(store) {
  const s = store.perplexity, p = s.progress;
  renderWindows(store.loaded?.n_ctx);
  $("ppl-run").disabled = !canRun(store);
  $("ppl-cancel").disabled = !s.running;
  $("ppl-ctx").disabled = s.running;
  const bar = $("ppl-progress");
  bar.hidden = !s.running;
  bar.value = p && p.chunks ? p.chunk / p.chunks : 0;
  renderStatus(store);
  renderResult(s.result);
}

// ---- folded (web/navigator.js): the card in one line ----------------------------------------------------------------
// The last result, or what runs.
function perplexityLine(store) {
  const r = store.perplexity.result, st = status(store);
  if (st.state === "done" && r.ppl != null) {
    return `perplexity ${r.ppl.toFixed(4)}${r.ppl_err != null ? ` ± ${r.ppl_err.toFixed(4)}` : ""} over ${r.tokens_scored} tokens`;
  }
  return st.text || "no text run yet";
}

// ---- its place in the page (web/cards.js): the pasted text goes with the conversation -------------------------------
export const card = {
  key: "perplexity",
  fresh: freshPerplexity,
  render: renderPerplexity,
  wire: (store, worker, page) => wirePerplexity(store, worker, page.render),
  cleared: (store, worker) => dropPerplexity(store.perplexity, worker),
  summary: perplexityLine,
};
