// The verification card: "Does it match llama.cpp?". It asks the worker (lab/worker/verify.py) to replay the fixed
// prompt of the loaded file's reference and to run the kernel fixtures, and renders what comes back; it computes
// nothing itself. Its state is its own: main.js calls fileLoaded(file) on a load, render() on every render, and
// hands it the worker's "verify*" messages and errors (handles(m)).
const $ = (id) => document.getElementById(id);

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

const fmt = (x) => (x == null ? "—" : x === 0 ? "0" : Math.abs(x) < 1e-3 || Math.abs(x) >= 1e4 ? x.toExponential(2) : x.toPrecision(3));

export function initVerify(worker, getStore, rerender) {
  const st = {
    file: null,            // the File last given to the worker to load (its bytes are hashed there, never its name)
    seq: 0,                // the load it belongs to: results of an older load are dropped
    state: "idle",         // idle | running | done | no-reference | error
    progress: null, result: null, hash: null, kernels: null, kernelState: "idle", error: null,
  };

  function fileLoaded(file) {
    Object.assign(st, { file, seq: st.seq + 1, state: "idle", progress: null, result: null, hash: null,
                        kernels: null, kernelState: "idle", error: null });
  }

  function run() {
    const store = getStore();
    if (!store.loaded || store.generating || st.state === "running" || !st.file) return;
    Object.assign(st, { state: "running", progress: null, result: null, hash: null, kernels: null,
                        kernelState: "running", error: null });
    // kernels first (a second or two), then the replay (a token per decode step)
    worker.postMessage({ type: "verify-kernels", seq: st.seq });
    worker.postMessage({ type: "verify", file: st.file, seq: st.seq });
    rerender();
  }
  $("verify-run").addEventListener("click", run);

  function handles(m) {
    const where = m.type === "error" ? m.where : m.type;
    if (!where || !where.startsWith("verify")) return false;
    if (m.seq != null && m.seq !== st.seq) return true;         // an older load's answer
    if (m.type === "error") {
      if (where === "verify-kernels") st.kernelState = "error";
      else st.state = "error";
      st.error = `${where}: ${m.message}`;
    } else if (m.type === "verify-progress") {
      st.progress = m;
    } else if (m.type === "verify-kernels") {
      st.kernels = m;
      st.kernelState = m.rows.every((r) => r.pass) ? "pass" : "fail";
    } else if (m.type === "verify") {
      st.hash = m.hash;
      st.result = m.result;
      st.state = m.result ? "done" : "no-reference";
      if (m.result) getStore().kv.used = 0;   // the replay overwrote the cache: the next turn prefills again
    }
    return true;
  }

  function renderRows() {
    const rows = st.result ? st.result.rows : [];
    $("verify-rows").replaceChildren(...rows.map((r) => {
      const tr = document.createElement("tr");
      tr.setAttribute("data-testid", "verify-row");
      Object.assign(tr.dataset, { reference: r.reference, check: r.check, verdict: r.verdict,
                                  number: r.number == null ? "" : String(r.number) });
      const v = cell(r.verdict, `verdict ${r.verdict}`);
      v.dataset.state = r.verdict === "fail" ? "fail" : r.verdict === "pass" ? "pass" : "other";
      tr.append(cell(r.reference), cell(r.check), cell(r.value), v, cell(r.tolerance, "muted"));
      return tr;
    }));
    $("verify-table").hidden = !rows.length;
  }

  function renderKernels() {
    const k = st.kernels;
    const sum = $("verify-kernels-summary");
    sum.dataset.state = st.kernelState;
    if (k) {
      const ok = k.rows.filter((r) => r.pass).length;
      sum.dataset.pass = ok;
      sum.dataset.total = k.rows.length;
      sum.textContent = `${ok} of ${k.rows.length} kernels match their fixtures (numpy oracles; run on ${k.adapter.name})`;
    } else {
      sum.textContent = st.kernelState === "running" ? "running the kernel fixtures…"
        : st.kernelState === "error" ? st.error : "kernel checks: run with the button above";
    }
    $("verify-kernel-rows").replaceChildren(...(k ? k.rows : []).map((r) => {
      const tr = document.createElement("tr");
      tr.setAttribute("data-testid", "verify-kernel-row");
      Object.assign(tr.dataset, { name: r.name, verdict: r.pass ? "pass" : "fail" });
      const v = cell(r.pass ? "pass" : "fail");
      v.dataset.state = r.pass ? "pass" : "fail";
      tr.append(cell(r.name), cell(r.trap), cell(r.error == null ? "non-finite or wrong" : fmt(r.error)),
        cell(`${fmt(r.tolerance)} ${r.tolerance_why}`, "muted"), v);
      return tr;
    }));
    $("verify-kernels").hidden = !k;
  }

  function render() {
    const store = getStore();
    const btn = $("verify-run");
    btn.disabled = !store.loaded || store.generating || st.state === "running" || !st.file;
    const status = $("verify-status");
    status.dataset.state = st.state;
    const short = st.hash ? st.hash.slice(0, 16) : "";
    if (st.state === "idle") {
      status.textContent = store.loaded ? "ready: the replay uses the chat's KV cache, which is refilled on the next turn"
        : "load a model first";
    } else if (st.state === "running") {
      const p = st.progress;
      status.textContent = p ? `replaying ${p.model}: a ${p.prompt}-token prefill, then ${p.steps} decode steps…`
        : "hashing the file and looking for its reference…";
    } else if (st.state === "no-reference") {
      status.textContent = `no reference for this file (content ${short}…): the page ships llama.cpp references only `
        + "for the default model and the two test models, matched by their bytes";
    } else if (st.state === "done") {
      const r = st.result;
      const fails = r.rows.filter((x) => x.verdict === "fail").length;
      status.dataset.ok = r.ok ? "true" : "false";
      status.textContent = `${r.model} (content ${short}…): ${r.ok ? "every check within its tolerance" : `${fails} check(s) FAIL`}`
        + ` · replay ${r.replay_s} s, compare ${r.compare_s} s · prompt ${r.prompt_ids.length} tokens`;
    } else {
      status.textContent = st.error;
    }
    $("verify-explain").textContent = st.result ? `Why two references: ${st.result.explain}` : "";
    renderRows();
    renderKernels();
  }

  return { fileLoaded, handles, render, run };
}
