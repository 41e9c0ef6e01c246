// The context length the user chooses in the model card, and the memory budget the worker counted for it
// (lab/engine/budget.py, in the "model-info" summary as `budget`). Changing the number loads the file again at that
// context; the budget (weights, KV cache, activations against the adapter's limits) comes before any upload,
// and a refusal names the buffer, its bytes and the limit.
// Its state is store.contextLength (freshContextLength; store.context is the conversation's tokens): main.js calls
// contextFileLoaded on every load and contextUploaded with the load's progress, and renderContext on every render.
import { fmtBytes } from "/web/panels.js";

const $ = (id) => document.getElementById(id);

// ---- the card's state: store.contextLength ------------------------------------------------------------------------
export function freshContextLength() {
  return {
    file: null,        // the file loaded last, loaded again when the number changes
    chosen: null,      // null until the user picks a number
    sent: null,        // the n_ctx the last load asked for
    uploaded: 0,       // bytes the current load has moved (0 until its upload starts)
  };
}

// A load starts; the answer is the load message's n_ctx (null: the worker's default, DEFAULT_CTX at most the
// model's own).
export function contextFileLoaded(s, file) {
  s.file = file;
  s.uploaded = 0;
  s.sent = s.chosen;
  return s.chosen;
}

// A "load-progress" of the current load.
export function contextUploaded(s, m) {
  s.uploaded = Math.max(s.uploaded, m.done);
}

// The load message's int8 flag. The tensor-core prefill (lab/ops/matmul.py matmul_i8) is offered where the adapter
// has int8 subgroup matrices; its inputs are rounded to 8 bits, so its replies may differ from the exact path's at
// near-ties.
export function int8Prefill() {
  const int8 = $("int8-prefill");
  return int8.checked && !int8.disabled;
}

// The load message's KV cache type: "f16" where the box is ticked (each cached value rounded to f16, half the memory;
// packed two to a word in core WGSL, so on any adapter: lab/ops/attention.py KV_TYPES), else "f32" (exact).
export function kvType() {
  return $("kv-f16").checked ? "f16" : "f32";
}

// ---- events -------------------------------------------------------------------------------------------------------
// The number typed: at least the input's min (the template writes lab.settings MIN_CTX), at most the model's own.
function choose(store, reload) {
  const input = $("context-length"), s = store.contextLength;
  const budget = store.model?.budget;
  let n = Math.round(Number(input.value));
  if (!(n >= Number(input.min))) n = Number(input.min);
  if (budget) n = Math.min(n, budget.n_ctx_train);
  input.value = String(n);
  s.chosen = n;
  // a second change with the same number (the browser fires one on blur after a scripted one) loads nothing:
  // it would also disable the buttons under the click that blurred the input
  if (s.file && n !== s.sent) reload(s.file);
}

// `reload(file)` loads the file again (main.js load). The card re-renders alone on its own events.
export function wireContext(store, reload) {
  const input = $("context-length"), int8 = $("int8-prefill"), kv = $("kv-f16");
  const render = () => renderContext(store);
  int8.addEventListener("change", () => { if (store.contextLength.file) reload(store.contextLength.file); render(); });
  kv.addEventListener("change", () => { if (store.contextLength.file) reload(store.contextLength.file); render(); });
  input.addEventListener("input", render);
  input.addEventListener("change", () => { choose(store, reload); render(); });
}

// ---- rendering ----------------------------------------------------------------------------------------------------
function renderInt8(gpu) {
  const int8 = $("int8-prefill");
  int8.disabled = !gpu?.int8_matrix;
  if (int8.disabled) int8.checked = false;
  $("int8-note").textContent = gpu?.int8_matrix ? (int8.checked ? "on: prompts run through int8 tensor cores"
    : "off: exact f32 prefill") : "not on this adapter (no int8 subgroup matrices)";
}

function renderKvType(gpu) {
  const box = $("kv-f16");
  box.disabled = !gpu;
  $("kv-f16-note").textContent = box.checked ? "on: each cached key and value rounded to f16"
    : "off: exact f32 cache";
}

export function renderContext(store) {
  renderInt8(store.gpu);
  renderKvType(store.gpu);
  const input = $("context-length"), out = $("context-plan");
  const budget = store.model?.budget;
  out.dataset.uploaded = String(store.contextLength.uploaded);
  if (!budget) {
    out.textContent = "the KV cache size shows once a file's header is read";
    out.dataset.kvBytes = "";
    out.dataset.fits = "";
    return;
  }
  input.max = String(budget.n_ctx_train);
  if (store.contextLength.chosen == null && document.activeElement !== input) input.value = String(budget.n_ctx);
  const n = Number(input.value) || Number(input.defaultValue);   // the template writes the engine's DEFAULT_CTX
  // the budget was counted for the cache type of the last load; the box may have changed since (a reload follows)
  const perToken = budget.kv_bytes_per_token * (kvType() === budget.kv_type ? 1 : kvType() === "f16" ? 0.5 : 2);
  const kv = perToken * n;
  out.dataset.kvBytes = String(kv);
  out.dataset.fits = n === budget.n_ctx ? String(budget.fits) : "";     // the budget is for budget.n_ctx
  out.textContent = `KV cache ${fmtBytes(kv)} (${fmtBytes(perToken)} per token × ${n}, ${kvType()}); `
    + `weights ${fmtBytes(budget.weight_bytes)}, activations ${fmtBytes(budget.scratch_bytes)}; `
    + `largest buffer ${fmtBytes(budget.largest.bytes)} of ${fmtBytes(budget.max_buffer_size)} allowed; `
    + `the model's own context: ${budget.n_ctx_train}`
    + (budget.state_bytes ? `; its recurrent and conv states ${fmtBytes(budget.conv_state_bytes + budget.delta_state_bytes)}`
       + ` whatever the length (buffers ${fmtBytes(budget.state_bytes)} with the snapshots and rings)` : "")
    + (n === budget.n_ctx && !budget.fits ? " (does not fit: see the error)" : "")
    + (budget.experts ? `; experts: ${budget.experts.n_expert} a layer on ${budget.experts.layers} routed layers,`
       + ` ${budget.experts.n_expert_used} a token (${fmtBytes(budget.experts.bytes)} of weights, all resident;`
       + ` ${fmtBytes(budget.experts.bytes_a_token)} of them read a token)` : "")
    + (budget.skipped?.length ? `. Left out on purpose: ${budget.skipped.join("; ")}` : "");
}
