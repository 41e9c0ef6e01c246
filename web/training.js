// The Training card: a LoRA adapter trained in the tab on a text file the user picks (read here, sent to the worker) or
// on the chat's text so far, with a live loss curve, then put to use: replies with and without it, an on/off switch for
// the rest of the page, and its file as a download. The worker does all of it (lab/worker/training.py); this card sends
// the text and the settings and draws what comes back.
// Stop posts "stop", which web/worker.js records itself while Python is busy; the run checks it after each step, so the
// step in flight finishes and the adapter keeps it.
// Or the adapter is a llama.cpp LoRA adapter file the user picks ("Adapter file"): the File goes to the worker, which
// checks it against the model, reads it in slices and puts it on the engine as the card's adapter; the switch, the
// replies and the download then work on it as on a trained one. A file refused is one line; the adapter before stays.
// Or ("a new model from scratch") a llama model of a preset shape on a vocabulary the user trained (the Tokenizer card's,
// or a tokenizer JSON file), trained on the same text through every weight (lab/worker/scratch.py): the worker checks
// everything, unloads the model before, then sends model-info (`made`) and loaded under a load seq this card took from
// the page (store.loadSeq), so main.js drops the old model's state and takes the new one as any load's; the run's own
// messages follow as a LoRA run's. Its one reply is the model's, and its download is the model itself.
// Or ("every weight of the loaded model") full fine-tuning of the loaded F32 file: a LoRA run's message with `full`,
// its messages a LoRA run's; from its start the model's weights are the user's data (the worker makes them
// CONVERSATION buffers: New chat keeps them, Forget wipes them and unloads the model). As a new model's, its one
// reply is the model's and its download is the whole model, named after the file (NAME.trained.gguf, as
// `lab train --full` names it).
// The picked text is the user's data: it is kept here only until Forget (or another model) drops it; the adapter's
// bytes go straight into a download (a Blob behind an object URL, revoked soon after) and are not kept.
// Its state is store.training (freshTraining): main.js hands the worker's messages to the update functions below; its
// `card` (web/cards.js, at the end) says what a model's life does to it, and draws it with renderTraining.
import { factList, fmtBytes } from "/web/panels.js";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const KEEP_URL_MS = 10_000;       // as web/export.js: long enough for the download to take the Blob

// ---- the card's state: store.training -----------------------------------------------------------------------------
export function freshTraining() {
  return {
    limits: null,       // the loaded model's {refusal, max_ctx} ("loaded" stats.training); null: no model
    file: null,         // the picked text file: {name, text}
    vocabFile: null,    // a new model's picked tokenizer file: {name, text}
    making: false,      // a new model's run is in flight: the model it makes is the one being loaded
    seq: 0,             // the newest request; messages of older ones are dropped
    running: false,
    plan: null,         // "train-plan"
    curve: [],          // [{step, loss, held}] from "train-progress"
    last: null,         // the last "train-progress"
    result: null,       // "train-done"
    error: null,        // one line: a refusal or a failure
    trained: false,     // the worker holds an adapter for this model (trained here, or read from a file)
    fromFile: null,     // ... read from a file: its "train-adapter-file" message
    reading: "",        // the adapter file being read (its name), its answer not back yet
    on: true,           // ... and it is on
    compare: null,      // {running, without, with, prompt_tokens}
    downloading: false,
    switching: false,  // a switch asked for, its answer not back yet
    want: true,        // ... the state it asked for
    opening: "",        // the first words of the text trained on: the with / without prompt unless one is typed
    chat: null,         // a run on a .jsonl of chat turns: {system} (its last conversation's system prompt, or "")
    labels: [],         // the adapter's buffers' labels, to find them in Forget's report
    labelsOf: "",       // ... whose: a run's (what it trained: "lora", "full", "new"), or "file" (an adapter file's)
    wiped: null,        // those buffers in the last Forget report: {buffers, before, after}
  };
}

const noRun = () => ({ running: false, plan: null, curve: [], last: null, result: null, error: null, trained: false,
                       on: true, compare: null, switching: false, downloading: false, fromFile: null, reading: "",
                       making: false });

// What a plan trained: "new" (a model from scratch), "full" (every weight of the loaded one) or "lora" (an adapter).
const ran = (plan) => (plan?.made ? "new" : plan?.full ? "full" : "lora");

export function trainPlan(s, m) {
  if (m.seq !== s.seq) return false;
  s.plan = m;
  s.labels = m.labels;
  s.labelsOf = ran(m);
  if (!$("train-prompt").value.trim()) $("train-prompt").value = s.opening;
  s.trained = true;
  s.on = true;
  return true;
}

export function trainProgress(s, m) {
  if (m.seq !== s.seq) return;
  s.last = m;
  s.curve.push({ step: m.step, loss: m.loss, held: m.held });
}

export function trainDone(s, m) {
  if (m.seq !== s.seq) return false;
  s.running = false;
  s.making = false;
  s.result = m;
  return true;
}

// The first token of a comparison: the engine's KV cache is being overwritten (main.js drops the chat's picture).
export function trainToken(s, m) {
  if (m.seq !== s.seq || !s.compare) return false;
  const first = !s.compare.without && !s.compare.with;
  s.compare[m.which] += m.piece;
  return first;
}

export function trainCompared(s, m) {
  if (m.seq !== s.seq || !s.compare) return;
  s.compare = { running: false, without: m.without?.text ?? "", with: m.with?.text ?? "",
                prompt_tokens: m.prompt_tokens };
}

// An adapter file is on the engine: the card's adapter now (whatever the card held before is gone on the worker's side).
export function trainAdapterFile(s, m) {
  if (m.seq !== s.seq) return false;
  Object.assign(s, noRun(), { trained: true, on: true, fromFile: m, labels: m.labels, labelsOf: "file", wiped: null });
  return true;
}

export function trainSwitched(s, m) {
  s.switching = false;
  s.on = m.on;
}

// The adapter's bytes (or a new model's, "train-model"): straight into a download, nothing kept.
export function trainAdapter(s, m, modelName) {
  s.downloading = false;
  const bytes = new Uint8Array(m.bytes.buffer, m.bytes.byteOffset, m.size);
  const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
  const a = document.createElement("a");
  a.href = url;
  const stem = (modelName || "model").replace(/\.gguf$/i, "");
  a.download = m.type !== "train-model" ? `${stem}.lora.gguf`
    : s.plan?.made ? `llm-lab-${s.plan.made.preset}.gguf` : `${stem}.trained.gguf`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), KEEP_URL_MS);
}

export function trainFailed(s, m) {
  if (m.seq != null && m.seq !== s.seq) return;
  if (m.where === "train" || m.where === "train-new") { s.running = false; s.making = false; }
  if (m.where === "train-compare" && s.compare) s.compare.running = false;
  if (m.where === "train-switch") s.switching = false;
  if (m.where === "train-adapter" || m.where === "train-model") s.downloading = false;
  if (m.where === "train-adapter-file") s.reading = "";
  s.error = m.message;
}

// Forget's report: the training's own buffers, as read back before and after the wipe.
function trainingForgotten(s, report) {
  const ours = new Set(s.labels);
  const items = report.items.filter((i) => ours.has(i.label));
  const sum = (key) => items.reduce((a, i) => a + i[key], 0);
  s.wiped = items.length ? { buffers: items.length, before: sum("before"), after: sum("after"), of: s.labelsOf } : null;
  s.labels = [];
}

// Forget, another model, a lost GPU: a run in flight is stopped and its remaining messages dropped; the adapter is
// gone on the worker's side (Forget closes it, an unload too), and with it everything this card shows of it. The
// picked file's text and the prompt go too.
function dropTraining(s, worker) {
  if (s.running || s.compare?.running) worker.postMessage({ type: "stop" });
  s.seq++;
  Object.assign(s, noRun(), { file: null, vocabFile: null, wiped: null, opening: "", chat: null });
  $("train-file").value = "";
  $("train-vocab-file").value = "";
  $("train-adapter-file").value = "";
  $("train-prompt").value = "";
}

// ---- events -------------------------------------------------------------------------------------------------------
const busy = (store) => store.training.running || !!store.training.compare?.running || store.training.switching
  || !!store.training.reading || store.training.downloading;
const mode = () => (document.querySelector("input[name=train-mode]:checked")?.value ?? "lora");
// Why Train cannot start now: a LoRA needs a loaded model the worker can train, full fine-tuning one whose every
// weight it can train (an F32 file, an f32 KV cache: the worker's own words); a new model only a GPU (and a model
// being loaded is left to finish first).
function refusal(store) {
  const m = mode(), limits = store.training.limits;
  if (m === "new") return !store.gpu ? "no GPU yet" : store.loading ? "a model is loading: wait for it" : null;
  if (!store.loaded) return "load a model first";
  return (m === "full" ? limits?.full_refusal : limits?.refusal) ?? null;
}
const canStart = (store) => !refusal(store) && !store.generating && !busy(store);
const source = () => (document.querySelector("input[name=train-source]:checked")?.value ?? "file");
const vocabSource = () => (document.querySelector("input[name=train-vocab]:checked")?.value ?? "card");

// A new model's vocabulary: the Tokenizer card's last result, or the picked file; {name, text} or an error line.
function vocabulary(store) {
  const s = store.training;
  if (vocabSource() === "file") {
    return s.vocabFile ?? { error: "choose a tokenizer file (.json, from the Tokenizer card or lab tokenizer-train)" };
  }
  const t = store.tokenizer;
  return t?.json ? { name: `the Tokenizer card's vocabulary (${t.result.vocab} tokens)`, text: t.json }
    : { error: "train a vocabulary in the Tokenizer card first, or choose a tokenizer file" };
}

// A .jsonl of chat turns: its last conversation's system prompt and last user message, the with / without prompt
// (the worker checks every line; a line that is not a conversation leaves the prompt empty here).
function lastTurn(text) {
  const lines = text.split("\n").filter((l) => l.trim());
  let msgs = [];
  try { msgs = JSON.parse(lines[lines.length - 1] ?? "null")?.messages ?? []; } catch { msgs = []; }
  if (!Array.isArray(msgs)) msgs = [];
  const content = (role) => String(msgs.filter((m) => m?.role === role).at(-1)?.content ?? "");
  return { system: content("system"), user: content("user") };
}

// The chat's text so far: what was said, each message on its own, in order.
const conversationText = (store) => store.messages.map((m) => m.content).filter((t) => t.trim()).join("\n\n");

function start(store, worker, rerender) {
  if (!canStart(store)) return;
  const s = store.training;
  const text = source() === "file" ? s.file?.text ?? "" : conversationText(store);
  if (!text.trim()) {
    s.error = source() === "file" ? "choose a text file first" : "the conversation is empty: chat first";
    rerender();
    return;
  }
  const num = (id) => Number($(id).value);
  const turns = source() === "file" && /\.jsonl$/i.test(s.file?.name ?? "") ? lastTurn(text) : null;
  if (turns && mode() === "new") {
    s.error = "a new model trains on text: pick a text file (a .jsonl of chat turns trains the loaded model)";
    rerender();
    return;
  }
  const settings = { text, steps: num("train-steps"), lr: num("train-lr"), ctx: num("train-ctx"),
                     batch: num("train-batch"), optimizer: $("train-optimizer").value, chat: Boolean(turns) };
  // the with / without prompt: the text's first words, or a chat file's last question (held out of training)
  const opening = turns ? turns.user : text.trim().split(/\s+/).slice(0, 6).join(" ");
  s.chat = turns ? { system: turns.system } : null;
  if (mode() === "new") {
    const vocab = vocabulary(store);
    if (vocab.error) { s.error = vocab.error; rerender(); return; }
    // the new model's messages carry a load seq of the page's: a load given up on is told apart from it
    Object.assign(s, noRun(), { running: true, making: true, wiped: null, opening });
    worker.postMessage({ type: "train-new", ...settings, tokenizer: vocab.text, tokenizer_name: vocab.name,
                         preset: $("train-preset").value, seed: num("train-seed"), seq: ++s.seq,
                         load_seq: ++store.loadSeq });
    rerender();
    return;
  }
  // the text's first words: the with / without prompt once the run starts, unless one was typed
  Object.assign(s, noRun(), { running: true, wiped: null, opening });
  const full = mode() === "full";
  worker.postMessage({ type: "train", ...settings, ...(full ? { full } : { rank: num("train-rank") }), seq: ++s.seq });
  rerender();
}

// The mode changed: the learning rate's default is each mode's own (a LoRA's moves a small pair from zero, a new
// model's every weight from a random start, full fine-tuning's every weight of a trained model), unless the field
// holds another value than the one the card put there last (the user's: it stays). Compared by value, not by an
// input event, so a value set back to the default is the default again.
function modeChanged(store, rerender) {
  const lr = $("train-lr"), d = lr.dataset;
  if (lr.value === d.auto) lr.value = d.auto = { new: d.scratch, full: d.full }[mode()] ?? d.lora;
  store.training.error = null;
  rerender();
}

function compare(store, worker, rerender) {
  const s = store.training;
  if (!s.trained || busy(store) || store.generating) return;
  s.error = null;
  s.compare = { running: true, without: "", with: "", prompt_tokens: null };
  worker.postMessage({ type: "train-compare", prompt: $("train-prompt").value, max_new: Number($("train-new").value),
                       chat: Boolean(s.chat), system: s.chat?.system ?? "", seq: ++s.seq });
  rerender();
}

async function pickVocab(store, file, rerender) {
  const s = store.training;
  s.vocabFile = file ? { name: file.name, text: await file.text() } : null;
  s.error = null;
  $("train-vocab-file-pick").checked = true;
  rerender();
}

async function pickFile(store, file, rerender) {
  const s = store.training;
  s.file = file ? { name: file.name, text: await file.text() } : null;
  s.error = null;
  $("train-source-file").checked = true;
  rerender();
}

// An adapter file picked: the File itself goes to the worker (it reads the header and the A and B ranges in slices).
function openAdapter(store, worker, input, rerender) {
  const s = store.training, file = input.files[0];
  input.value = "";                   // the File is posted: the same file may be picked again
  if (!file || !store.loaded || busy(store) || store.generating) return;
  s.error = null;
  s.reading = file.name;
  worker.postMessage({ type: "train-adapter-file", file, seq: ++s.seq });
  rerender();
}

export function wireTraining(store, worker, rerender) {
  const s = store.training;
  $("train-start").addEventListener("click", () => start(store, worker, rerender));
  $("train-stop").addEventListener("click", () => { if (s.running) worker.postMessage({ type: "stop" }); });
  $("train-file").addEventListener("change", (e) => pickFile(store, e.target.files[0], rerender));
  $("train-vocab-file").addEventListener("change", (e) => pickVocab(store, e.target.files[0], rerender));
  for (const r of document.querySelectorAll("input[name=train-mode]")) {
    r.addEventListener("change", () => modeChanged(store, rerender));
  }
  for (const r of document.querySelectorAll("input[name=train-vocab]")) r.addEventListener("change", () => rerender());
  const lr = $("train-lr");
  lr.dataset.lora = lr.dataset.auto = lr.value;     // the template's value: lab/settings.py TRAINING.lr
  $("train-adapter-file").addEventListener("change", (e) => openAdapter(store, worker, e.target, rerender));
  for (const r of document.querySelectorAll("input[name=train-source]")) r.addEventListener("change", () => rerender());
  $("train-compare").addEventListener("click", () => compare(store, worker, rerender));
  $("train-prompt").addEventListener("keydown", (e) => { if (e.key === "Enter") compare(store, worker, rerender); });
  $("train-on").addEventListener("change", (e) => {
    if (!s.trained || busy(store)) { e.target.checked = s.on; return; }
    s.switching = true;
    s.want = e.target.checked;
    worker.postMessage({ type: "train-switch", on: e.target.checked, seq: s.seq });
    rerender();
  });
  $("train-download").addEventListener("click", () => {
    if (!s.trained || s.downloading) return;
    s.downloading = true;
    worker.postMessage({ type: "train-adapter", seq: s.seq });
    rerender();
  });
  $("train-download-model").addEventListener("click", () => {
    if (!s.trained || busy(store)) return;
    s.downloading = true;
    worker.postMessage({ type: "train-model", seq: s.seq });
    rerender();
  });
}

// ---- rendering ----------------------------------------------------------------------------------------------------
const fmtLoss = (x) => (x == null ? "—" : x.toFixed(4));
const fmtPpl = (x) => (x == null ? "—" : x >= 1e4 ? x.toExponential(2) : x.toFixed(x < 100 ? 2 : 1));
const fmtRate = (x) => (x == null ? "—" : x.toFixed(x < 10 ? 2 : 0));
function fmtTime(s) {
  if (s == null) return "—";
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

function status(store) {
  const s = store.training, p = s.last, r = s.result;
  if (s.running) {
    if (!s.plan) {
      return { state: "running", text: s.making ? "checking the vocabulary and the text, drawing the new model…"
        : "tokenizing the text and making the adapter…" };
    }
    if (!p) return { state: "running", text: "scoring the held-out windows before training…" };
    return { state: "running", text: p.step ? `step ${p.step} of ${p.steps}` : "training…" };
  }
  if (r) {
    if (r.diverged) {
      return { state: "error",
               text: `stopped at step ${r.steps_done}: the loss is not a number (the learning rate is too high)` };
    }
    const what = ran(s.plan);
    if (r.stopped) {
      return { state: "stopped", text: `stopped after step ${r.steps_done} of ${r.steps}: the `
        + `${what === "lora" ? "adapter" : "model"} keeps it` };
    }
    return { state: "done", text: `done: ${r.steps_done} steps in ${fmtTime(r.seconds)}`
      + { new: "; the new model is loaded: chat with it, or open any card",
          full: "; the loaded model is the trained one now: the chat and every card use it",
          lora: "" }[what] };
  }
  return { state: "idle", text: "" };
}

function renderStatus(store) {
  const s = store.training, p = s.last;
  const { state, text } = status(store);
  const el = $("train-status");
  el.dataset.state = state;
  el.dataset.step = p ? p.step : "";
  el.textContent = text;
  $("train-progress-row").hidden = !s.running;
  $("train-bar").value = p ? p.step / p.steps : 0;
  $("train-progress-text").textContent = !p || !p.step ? ""
    : `loss ${fmtLoss(p.loss)} · ${fmtRate(p.tokens_per_s)} tokens/s · about ${fmtTime(p.eta_s)} left`;
}

// The loss curve: the training loss of each step (a line), the held-out loss where it was measured (dots, step 0
// before training), on one scale.
function renderCurve(s) {
  const box = $("train-curve");
  const points = s.curve;
  box.hidden = !points.length;
  if (!points.length) { box.replaceChildren(); return; }
  const key = `${points.length}:${s.seq}:${!!s.result}`;
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  const W = 560, H = 190, L = 52, R = 12, T = 24, B = 24;
  // the steps asked for while it runs (the line grows across), the steps it ran once it is over
  const steps = s.result ? Math.max(1, s.result.steps_done) : s.plan ? s.plan.steps : Math.max(1, ...points.map((p) => p.step));
  const values = points.flatMap((p) => [p.loss, p.held]).filter((v) => v != null && Number.isFinite(v));
  let lo = Math.min(...values), hi = Math.max(...values);
  if (!(hi > lo)) { lo -= 0.5; hi += 0.5; }
  const pad = (hi - lo) * 0.08;
  lo -= pad; hi += pad;
  const x = (step) => L + ((W - L - R) * step) / steps;
  const y = (v) => T + ((H - T - B) * (hi - v)) / (hi - lo);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "loss per step" });
  svg.append(svgEl("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "train-plot" }));
  for (const v of [lo + pad, (lo + hi) / 2, hi - pad]) {
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "train-grid" }),
               svgText(v.toFixed(2), L - 4, y(v) + 4, "end"));
  }
  svg.append(svgText("0", x(0), H - B + 14, "middle"), svgText(String(steps), x(steps), H - B + 14, "end"),
             svgText("step", (L + W - R) / 2, H - B + 14, "middle"), svgText("loss", L - 4, T - 8, "end"));
  const train = points.filter((p) => p.loss != null && Number.isFinite(p.loss));
  svg.append(svgEl("polyline", { class: "train-loss", points: train.map((p) => `${x(p.step)},${y(p.loss)}`).join(" ") }));
  const held = points.filter((p) => p.held != null && Number.isFinite(p.held));
  svg.append(svgEl("polyline", { class: "train-held-line", points: held.map((p) => `${x(p.step)},${y(p.held)}`).join(" ") }));
  for (const p of held) svg.append(svgEl("circle", { cx: x(p.step), cy: y(p.held), r: 3.5, class: "train-held" }));
  const legend = svgEl("g", {});
  legend.append(svgEl("line", { x1: L + 4, x2: L + 22, y1: T - 11, y2: T - 11, class: "train-loss" }),
                svgText("training loss (the step's windows)", L + 26, T - 7, "start"),
                svgEl("circle", { cx: L + 236, cy: T - 11, r: 3.5, class: "train-held" }),
                svgText("held-out loss (windows never trained on)", L + 244, T - 7, "start"));
  svg.append(legend);
  svg.dataset.points = String(train.length);
  svg.dataset.held = String(held.length);
  svg.setAttribute("data-testid", "train-svg");
  box.replaceChildren(svg);
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function svgText(text, x, y, anchor) {
  const t = svgEl("text", { x, y, "text-anchor": anchor, class: "train-axis" });
  t.textContent = text;
  return t;
}

// Perplexity, exp of the held-out loss: before training, then as last measured (or after the last step).
function heldLine(s) {
  const before = s.curve.length ? s.curve[0].held : null;
  const now = [...s.curve].reverse().find((c) => c.held != null && c.step > 0);
  if (before == null) return "scoring the held-out windows…";
  const head = `${fmtPpl(Math.exp(before))} before training`;
  if (!now) return `${head} (loss ${fmtLoss(before)}); measured again every few steps`;
  const when = s.result ? "after training" : `at step ${now.step}`;
  return `${head} → ${fmtPpl(Math.exp(now.held))} ${when} (loss ${fmtLoss(before)} → ${fmtLoss(now.held)})`;
}

function renderFacts(s) {
  const dl = $("train-facts"), p = s.plan, r = s.result, last = s.last;
  dl.hidden = !p;
  if (!p) { dl.replaceChildren(); return; }
  const mem = r ? r.memory : p.memory;
  const rows = [
    p.chat
      ? ["text", `${p.windows} conversations, each a window of ${p.ctx} tokens: ${p.train} trained on, ${p.held} held `
        + `out; ${p.trained_tokens.toLocaleString("en")} answer tokens trained (the rest is prompt and padding)`,
         "train-text", p.tokens]
      : ["text", `${p.tokens.toLocaleString("en")} tokens in ${p.windows} windows of ${p.ctx}: ${p.train} trained on, `
        + `${p.held} held out`, "train-text", p.tokens],
    p.made
      ? ["model", `${p.params.toLocaleString("en")} parameters, every one trained: ${p.made.layers} layers of `
        + `${p.made.width}, ${p.made.heads} heads, feed-forward ${p.made.ffn}, a vocabulary of `
        + `${p.made.vocab.toLocaleString("en")} (seed ${p.made.seed}); `
        + `${p.optimizer === "sgd" ? "SGD" : "AdamW"} at learning rate ${p.lr}`, "train-params", p.params]
      : p.full
        ? ["model", `${p.params.toLocaleString("en")} parameters, every weight of the loaded model trained (every `
          + `matrix and every norm); ${p.optimizer === "sgd" ? "SGD" : "AdamW"} at learning rate ${p.lr}`,
          "train-params", p.params]
        : ["adapter", `${p.params.toLocaleString("en")} parameters: rank ${p.rank} on ${p.targets} matrices, `
          + `${p.optimizer === "sgd" ? "SGD" : "AdamW"} at learning rate ${p.lr}`, "train-params", p.params],
    ["held-out perplexity", heldLine(s), "train-ppl", r && r.ppl_after != null ? r.ppl_after : ""],
    ["speed", last && last.tokens_per_s != null
      ? `${fmtRate(r ? r.tokens_per_s : last.tokens_per_s)} tokens/s · ${fmtTime(r ? r.seconds : last.seconds)}`
        + (r ? " in all" : " so far") : "—",
     "train-speed", r ? r.tokens_per_s : ""],
    ["memory", Object.entries(mem).map(([k, v]) => `${k} ${fmtBytes(v)}`).join(" · ")
      + ` (${fmtBytes(Object.values(mem).reduce((a, b) => a + b, 0))} in all)`, "train-memory", ""],
  ];
  factList(dl, rows);
}

function renderAfter(store) {
  const s = store.training, c = s.compare;
  $("train-after").hidden = !s.trained || s.running;
  $("train-without").textContent = c ? c.without : "";
  $("train-with").textContent = c ? c.with : "";
  $("train-without").dataset.state = $("train-with").dataset.state = !c ? "" : c.running ? "running" : "done";
  $("train-compare").disabled = !s.trained || busy(store) || store.generating;
  $("train-on").checked = s.switching ? s.want : s.on;
  $("train-on").disabled = !s.trained || busy(store);
  $("train-download").disabled = !s.trained || busy(store) || s.downloading;
  $("train-download-model").disabled = !s.trained || busy(store) || !store.loaded;
}

// The mode's own parts of the card: the radio's, and under the replies the run's (what was trained last).
// An element's data-mode lists the modes it belongs to ("new full": both).
function renderMode(store) {
  const s = store.training, chosen = mode(), trained = ran(s.plan);
  for (const el of $("training").querySelectorAll("[data-mode]")) {
    el.hidden = !el.dataset.mode.split(" ").includes(el.closest("#train-after") ? trained : chosen);
  }
  for (const r of document.querySelectorAll("input[name=train-mode]")) r.disabled = busy(store);
  $("train-new-box").disabled = s.running;
  const t = store.tokenizer;
  $("train-vocab-note").textContent = t?.json ? `(${t.result.vocab.toLocaleString("en")} tokens)` : "(none trained yet)";
  const opt = $("train-preset").selectedOptions[0];
  const vocab = vocabSource() === "file" ? null : t?.result?.vocab;
  $("train-preset-note").textContent = opt && vocab
    ? `${presetParams(opt.dataset.shape, vocab).toLocaleString("en")} parameters with this vocabulary` : "";
}

// A preset's parameters with a vocabulary of n (lab.format.untrained Shape.n_params: the embedding, tied to the head,
// each layer's two norms, Q K V O, gate up down, and the final norm; as many key/value heads as query heads).
function presetParams(shape, n) {
  const [layers, width, , ffn] = shape.split(",").map(Number);
  return n * width + layers * (2 * width + 4 * width * width + 3 * width * ffn) + width;
}

function renderSource(store) {
  const s = store.training;
  $("train-file-note").textContent = s.file ? `${s.file.text.length.toLocaleString("en")} characters` : "";
  const n = store.messages.filter((m) => m.content.trim()).length;
  $("train-chat-note").textContent = `(${n} message${n === 1 ? "" : "s"} so far)`;
}

// The adapter file on the engine: what it holds, or the one being read.
function renderAdapterFile(store) {
  const s = store.training, f = s.fromFile, line = $("train-adapter-info");
  $("train-adapter-file").disabled = !store.loaded || busy(store) || store.generating;
  line.dataset.state = s.reading ? "reading" : f ? "on" : "";
  if (s.reading) { line.textContent = `reading ${s.reading}…`; return; }
  if (!f) { line.textContent = ""; return; }
  const ranks = f.ranks.length > 1 ? `ranks ${f.ranks[0]} to ${f.ranks.at(-1)}` : `rank ${f.ranks[0]}`;
  const mem = Object.values(f.memory).reduce((a, b) => a + b, 0);
  line.textContent = `${f.file}${f.name ? ` (${f.name})` : ""}: ${f.pairs} matrices at ${ranks}, α ${f.alpha}, `
    + `${f.params.toLocaleString("en")} parameters (${f.types.join(", ")}), ${fmtBytes(mem)} on the GPU`
    + (f.ignored ? `; ${f.ignored} norm tensor${f.ignored === 1 ? "" : "s"} skipped, as llama.cpp skips them` : "");
}

function renderWiped(s) {
  const w = s.wiped, line = $("train-wiped");
  line.hidden = !w;
  line.dataset.before = w ? w.before : "";
  line.dataset.after = w ? w.after : "";
  line.dataset.state = !w ? "" : w.after ? "failed" : "wiped";
  // a new chat before Forget wipes the training's own buffers: the report counts those still holding data
  const model = { new: "the new model's", full: "the trained model's" }[w?.of];
  line.textContent = !w ? "" : w.after
    ? `Forget did NOT wipe the ${w.of === "file" ? "adapter's" : "training's"} buffers: ${w.after} non-zero words remain`
    : (w.of === "file"
      ? `Forget wiped the adapter file's ${w.buffers} buffers (its A and B, and its step scratch): `
      : model
        ? `Forget wiped ${model} weights and what the training left in its buffers (gradients, optimizer state, the `
          + `text's activations), ${w.buffers} buffers holding data in all, and unloaded it: `
        : `Forget wiped the training's ${w.buffers} buffers (the adapter, its gradients and optimizer state, the `
          + "text's activations): ") + `${w.before.toLocaleString("en")} non-zero words read back as zero.`
      + (w.of === "full" ? " Load the file again to start over." : "");
}

export function renderTraining(store) {
  const s = store.training;
  const line = $("train-refusal"), why = s.error || refusal(store);
  line.hidden = !why;
  line.textContent = why || "";
  line.dataset.kind = s.error ? "error" : why ? "refusal" : "";
  if (s.limits) $("train-ctx").max = String(s.limits.max_ctx);
  $("train-start").disabled = !canStart(store);
  $("train-stop").disabled = !s.running;
  for (const id of ["train-rank", "train-steps", "train-lr", "train-ctx", "train-batch", "train-optimizer", "train-file"]) {
    $(id).disabled = s.running;
  }
  renderMode(store);
  renderSource(store);
  renderStatus(store);
  renderCurve(s);
  renderFacts(s);
  renderAfter(store);
  renderAdapterFile(store);
  renderWiped(s);
}

// ---- its place in the page (web/cards.js): a new chat keeps the adapter (it goes on for the new chat too); Forget,
// another model and a lost GPU drop it with everything the card shows of it.
export const card = {
  key: "training",
  fresh: freshTraining,
  render: renderTraining,
  wire: (store, worker, page) => wireTraining(store, worker, page.render),
  loaded: (store, stats) => { store.training.limits = stats.training; },
  summary: (store) => status(store).text || (!store.training.trained ? "nothing trained yet"
    : { new: "a new model, trained here, is loaded", full: "the loaded model's every weight is trained here",
        lora: "an adapter is on the model" }[ran(store.training.plan)]),
  forgetting: (store, worker) => dropTraining(store.training, worker),
  forgotten: (store, report) => trainingForgotten(store.training, report),
  // the model the card's own run is making replaces the one before: the run goes on
  dropped: (store, worker, how) => {
    if (!(how?.made && store.training.making)) dropTraining(store.training, worker);
    store.training.limits = null;
  },
};
