// The verification card: "Does it match llama.cpp?". It asks the worker (lab/worker/verify.py) to replay the fixed
// prompt of the loaded file's reference and to run the kernel fixtures, and renders what comes back; it computes
// nothing itself. Its state is store.verify (freshVerify): main.js hands the worker's "verify*" messages and errors to
// the update functions below; its `card` (web/cards.js) runs verifyFileLoaded when a file is picked, and renderVerify
// on every render.
const $ = (id) => document.getElementById(id);

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

const fmt = (x) => (x == null ? "—" : x === 0 ? "0" : Math.abs(x) < 1e-3 || Math.abs(x) >= 1e4 ? x.toExponential(2) : x.toPrecision(3));

// ---- the card's state: store.verify -----------------------------------------------------------------------------
export function freshVerify() {
  return {
    file: null,            // the File last given to the worker to load (its bytes are hashed there, never its name)
    seq: 0,                // the load it belongs to: results of an older load are dropped
    state: "idle",         // idle | running | done | no-reference | error
    progress: null, result: null, hash: null, kernels: null, kernelState: "idle", error: null,
  };
}

const NO_RESULTS = { progress: null, result: null, hash: null, kernels: null, error: null };

export function verifyFileLoaded(s, file) {
  Object.assign(s, NO_RESULTS, { file, seq: s.seq + 1, state: "idle", kernelState: "idle" });
}

// An answer about the file loaded now (one about an older load is dropped).
const current = (s, m) => m.seq == null || m.seq === s.seq;

export function verifyProgress(s, m) {
  if (current(s, m)) s.progress = m;
}

export function verifyKernels(s, m) {
  if (!current(s, m)) return;
  s.kernels = m;
  s.kernelState = m.rows.every((r) => r.pass) ? "pass" : "fail";
}

// The replay's answer; true when it ran, which overwrote the KV cache (main.js: the next turn prefills again).
export function verifyResult(s, m) {
  if (!current(s, m)) return false;
  s.hash = m.hash;
  s.result = m.result;
  s.state = m.result ? "done" : "no-reference";
  return !!m.result;
}

// An error of the replay ("verify") or of the kernel fixtures ("verify-kernels").
export function verifyFailed(s, m) {
  if (!current(s, m)) return;
  if (m.where === "verify-kernels") s.kernelState = "error";
  else s.state = "error";
  s.error = `${m.where}: ${m.message}`;
}

const canRun = (store) => store.loaded && !store.generating && store.verify.state !== "running" && store.verify.file;

function run(store, worker, rerender) {
  const s = store.verify;
  if (!canRun(store)) return;
  Object.assign(s, NO_RESULTS, { state: "running", kernelState: "running" });
  // kernels first (a second or two), then the replay (a token per decode step)
  worker.postMessage({ type: "verify-kernels", seq: s.seq });
  worker.postMessage({ type: "verify", file: s.file, seq: s.seq });
  rerender();
}

export function wireVerify(store, worker, rerender) {
  $("verify-run").addEventListener("click", () => run(store, worker, rerender));
}

// ---- rendering ----------------------------------------------------------------------------------------------------
function statusText(store) {
  const s = store.verify;
  const short = s.hash ? s.hash.slice(0, 16) : "";
  if (s.state === "idle") {
    return store.loaded ? "ready: the replay uses the chat's KV cache, which is refilled on the next turn" : "load a model first";
  }
  if (s.state === "running") {
    const p = s.progress;
    return p ? `replaying ${p.model}: a ${p.prompt}-token prefill, then ${p.steps} decode steps…`
      : "hashing the file and looking for its reference…";
  }
  if (s.state === "no-reference") {
    return `no reference for this file (content ${short}…): the page ships llama.cpp references only `
      + "for the default model and the two test models, matched by their bytes";
  }
  if (s.state === "done") {
    const r = s.result;
    const fails = r.rows.filter((x) => x.verdict === "fail").length;
    return `${r.model} (content ${short}…): ${r.ok ? "every check within its tolerance" : `${fails} check(s) FAIL`}`
      + ` · replay ${r.replay_s} s, compare ${r.compare_s} s · prompt ${r.prompt_ids.length} tokens`;
  }
  return s.error;
}

function renderRows(s) {
  const rows = s.result ? s.result.rows : [];
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

function renderKernels(s) {
  const k = s.kernels;
  const sum = $("verify-kernels-summary");
  sum.dataset.state = s.kernelState;
  if (k) {
    const ok = k.rows.filter((r) => r.pass).length;
    sum.dataset.pass = ok;
    sum.dataset.total = k.rows.length;
    sum.textContent = `${ok} of ${k.rows.length} kernels match their fixtures (numpy oracles; run on ${k.adapter.name})`;
  } else {
    sum.textContent = s.kernelState === "running" ? "running the kernel fixtures…"
      : s.kernelState === "error" ? s.error : "kernel checks: run with the button above";
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

export function renderVerify(store) {
  const s = store.verify;
  $("verify-run").disabled = !canRun(store);
  const status = $("verify-status");
  status.dataset.state = s.state;
  if (s.state === "done") status.dataset.ok = s.result.ok ? "true" : "false";
  status.textContent = statusText(store);
  $("verify-explain").textContent = s.result ? `Why two references: ${s.result.explain}` : "";
  renderRows(s);
  renderKernels(s);
}

// ---- folded (web/navigator.js): the card in one line ----------------------------------------------------------------
// The verdict in one line.
function verifyLine(store) {
  const s = store.verify, r = s.result;
  const kernels = s.kernelState === "idle" ? "" : ` · kernel checks ${s.kernelState === "pass" ? "pass" : s.kernelState}`;
  if (s.state === "done") {
    const fails = r.rows.filter((x) => x.verdict === "fail").length;
    return `${r.model}: ${r.ok ? "every check within its tolerance" : `${fails} check(s) FAIL`}${kernels}`;
  }
  if (s.state === "no-reference") return `no llama.cpp reference for this file${kernels}`;
  return (s.state === "idle" ? (store.loaded ? "not run yet" : "load a model first") : statusText(store)) + kernels;
}

// ---- its place in the page (web/cards.js): another file picked resets what the card showed of the last one ---------
export const card = {
  key: "verify",
  fresh: freshVerify,
  render: renderVerify,
  wire: (store, worker, page) => wireVerify(store, worker, page.render),
  picked: (store, file) => verifyFileLoaded(store.verify, file),
  summary: verifyLine,
};
