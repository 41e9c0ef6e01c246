// The context length the user chooses in the model card, and the memory plan the worker made for it
// (lab/engine/budget.py, in the "model-info" summary as `plan`). Changing the number loads the file again at that
// context; the plan (weights, KV cache, activations against the adapter's limits) comes before any upload,
// and a refusal names the buffer, its bytes and the limit. Also the test hook labWeightBytes.
import { fmtBytes } from "/web/panels.js";

const $ = (id) => document.getElementById(id);

export function initContext(worker, getStore, reload) {
  const input = $("context-length"), out = $("context-plan");
  const engineDefault = Number(input.value);   // the template writes the engine's DEFAULT_CTX
  // chosen: null until the user picks a number; sent: the n_ctx the last load asked for
  const st = { file: null, chosen: null, sent: null, uploaded: 0 };

  // The tensor-core prefill (lab/ops/matmul.py matmul_i8): offered where the adapter has int8 subgroup matrices.
  // Its inputs are rounded to 8 bits, so its replies may differ from the exact path's at near-ties.
  const int8 = $("int8-prefill");
  int8.addEventListener("change", () => { if (st.file) reload(st.file); render(); });

  input.addEventListener("input", () => render());
  input.addEventListener("change", () => {
    const plan = getStore().model?.plan;
    let n = Math.round(Number(input.value));
    if (!(n >= 2)) n = 2;
    if (plan) n = Math.min(n, plan.n_ctx_train);      // bounded by the model's own
    input.value = String(n);
    st.chosen = n;
    // a second change with the same number (the browser fires one on blur after a scripted one) loads nothing:
    // it would also disable the buttons under the click that blurred the input
    if (st.file && n !== st.sent) reload(st.file);
    render();
  });

  // main.js calls this on every load; the answer is the load message's n_ctx (null: the worker's default,
  // DEFAULT_CTX at most the model's own)
  function fileLoaded(file) {
    st.file = file;
    st.uploaded = 0;
    st.sent = st.chosen;
    return st.chosen;
  }

  // the load message's int8 flag
  const int8Prefill = () => int8.checked && !int8.disabled;

  function render() {
    const gpu = getStore().gpu;
    int8.disabled = !gpu?.int8_matrix;
    if (int8.disabled) int8.checked = false;
    $("int8-note").textContent = gpu?.int8_matrix ? (int8.checked ? "on: prompts run through int8 tensor cores"
      : "off: exact f32 prefill") : "not on this adapter (no int8 subgroup matrices)";
    const plan = getStore().model?.plan;
    out.dataset.uploaded = String(st.uploaded);   // bytes the current load has moved (0 until its upload starts)
    if (!plan) {
      out.textContent = "the KV cache size shows once a file's header is read";
      out.dataset.kvBytes = "";
      out.dataset.fits = "";
      return;
    }
    input.max = String(plan.n_ctx_train);
    if (st.chosen == null && document.activeElement !== input) input.value = String(plan.n_ctx);
    const n = Number(input.value) || engineDefault;
    const kv = plan.kv_bytes_per_token * n;
    out.dataset.kvBytes = String(kv);
    out.dataset.fits = n === plan.n_ctx ? String(plan.fits) : "";     // the plan is for plan.n_ctx
    out.textContent = `KV cache ${fmtBytes(kv)} (${fmtBytes(plan.kv_bytes_per_token)} per token × ${n}); `
      + `weights ${fmtBytes(plan.weight_bytes)}, activations ${fmtBytes(plan.scratch_bytes)}; `
      + `largest buffer ${fmtBytes(plan.largest.bytes)} of ${fmtBytes(plan.max_buffer_size)} allowed; `
      + `the model's own context: ${plan.n_ctx_train}`
      + (n === plan.n_ctx && !plan.fits ? " (does not fit: see the error)" : "");
  }

  // Test hook (tests/browser/test_big_file.py): bytes [offset, offset + size) of a file tensor, read back from the
  // GPU buffers it was uploaded into (lab/instruments/weightread.py), resolved as a base64 string.
  const calls = new Map();
  let callId = 0;
  window.labWeightBytes = (name, offset, size) => new Promise((resolve, reject) => {
    const id = ++callId;
    calls.set(id, { resolve, reject });
    worker.postMessage({ type: "weight-bytes", id, name, offset, size });
  });

  // Messages this card takes: its hook's answers (consumed), and load progress (watched, passed on).
  function handles(m) {
    if (m.type === "load-progress") {
      if (m.seq === getStore().loadSeq) st.uploaded = Math.max(st.uploaded, m.done);
      return false;
    }
    if (m.type !== "weight-bytes") return false;
    const p = calls.get(m.id);
    calls.delete(m.id);
    if (p) m.error ? p.reject(new Error(m.error)) : p.resolve(m.bytes);
    return true;
  }

  return { fileLoaded, int8Prefill, render, handles };
}
