// The perplexity card: pasted text scored by the loaded model the way llama.cpp's llama-perplexity scores it
// (lab/instruments/perplexity.py; the worker's side is lab/worker/perplexity.py). The worker does all of it; this card sends the
// text and the window, shows "chunk i of n" and the running value as they come, and the result.
// Cancel posts "stop", which web/worker.js records itself while Python is busy (labStopRequested); the run checks it
// after every step and answers with the chunks it finished.
// The pasted text is conversation-like data: it is never stored, and clear() (Forget, New chat, a new model) empties
// the textarea, drops the result and stops a run in flight. main.js calls render() on every render and hands it the
// worker's messages (handles(m)). `cacheOverwritten` is called when a run starts: it replaces the KV cache's contents.

const $ = (id) => document.getElementById(id);
const CONTEXTS = [64, 128, 256, 512];
const DEFAULT_CTX = 128;

export function initPerplexity(worker, getStore, rerender, cacheOverwritten) {
  const st = {
    seq: 0,             // the newest run asked for; messages of older runs are dropped
    running: false,
    progress: null,     // the last "perplexity-progress": {chunk, chunks, ppl, n_tokens}
    result: null,       // the "perplexity" message's result
    error: null,
  };

  $("ppl-run").addEventListener("click", () => {
    const store = getStore();
    const text = $("ppl-text").value;
    if (!store.loaded || store.generating || st.running || !text.trim()) return;
    Object.assign(st, { running: true, progress: null, result: null, error: null });
    worker.postMessage({ type: "perplexity", text, n_ctx: Number($("ppl-ctx").value), seq: ++st.seq });
    rerender();
  });
  $("ppl-cancel").addEventListener("click", () => {
    if (st.running) worker.postMessage({ type: "stop" });
  });
  $("ppl-text").addEventListener("input", () => rerender());

  function handles(m) {
    if (m.type === "perplexity-progress") {
      if (m.seq === st.seq) {
        if (!st.progress) cacheOverwritten();
        st.progress = m;
      }
      return true;
    }
    if (m.type === "perplexity") {
      if (m.seq === st.seq) { st.running = false; st.result = m.result; }
      return true;
    }
    if (m.type === "error" && m.where === "perplexity") {
      if (m.seq == null || m.seq === st.seq) { st.running = false; st.error = m.message; }
      return true;
    }
    return false;
  }

  function clear() {
    if (st.running) worker.postMessage({ type: "stop" });
    $("ppl-text").value = "";
    st.seq++;            // an answer still on its way is about the dropped text
    Object.assign(st, { running: false, progress: null, result: null, error: null });
  }

  function renderContexts(nCtx) {
    const sel = $("ppl-ctx");
    const allowed = CONTEXTS.filter((c) => !nCtx || c <= nCtx);
    if (sel.options.length !== allowed.length) {
      const keep = Number(sel.value) || DEFAULT_CTX;
      sel.replaceChildren(...allowed.map((c) => new Option(`${c} tokens`, String(c))));
      sel.value = String(allowed.includes(keep) ? keep : allowed.includes(DEFAULT_CTX) ? DEFAULT_CTX : allowed.at(-1));
    }
  }

  function render() {
    const store = getStore();
    renderContexts(store.loaded?.n_ctx);
    $("ppl-run").disabled = !store.loaded || store.generating || st.running || !$("ppl-text").value.trim();
    $("ppl-cancel").disabled = !st.running;
    $("ppl-ctx").disabled = st.running;
    const p = st.progress, r = st.result;
    const bar = $("ppl-progress");
    bar.hidden = !st.running;
    bar.value = p && p.chunks ? p.chunk / p.chunks : 0;
    const status = $("ppl-status");
    let state = "idle", text = store.loaded ? "" : "load a model first";
    if (st.running) {
      state = "running";
      text = !p ? "tokenizing…"
        : `chunk ${Math.min(p.chunk + 1, p.chunks)} of ${p.chunks} running`
          + (p.ppl != null ? ` · after ${p.chunk}: perplexity ${p.ppl.toFixed(4)}` : "") + ` · ${p.n_tokens} tokens`;
    } else if (st.error) {
      state = "error"; text = st.error;
    } else if (r) {
      state = r.stopped ? "cancelled" : "done";
      text = r.stopped ? `cancelled after ${r.chunks} of ${r.chunks_total} chunks` : "done";
    }
    status.dataset.state = state;
    status.dataset.chunk = p ? p.chunk : "";
    status.dataset.chunks = p ? p.chunks : "";
    status.dataset.ppl = p && p.ppl != null ? p.ppl : "";
    status.textContent = text;
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

  return { render, handles, clear };
}
