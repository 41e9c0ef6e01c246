// The browser peer's bench page: wllama (llama.cpp's WebGPU backend in wasm, npm @wllama/wllama) on the GGUF the
// file input holds, driven by lab/host/bench/wllama.py through `window.peerBench`. Bench-only: the lab's server
// serves it at /peer/ only when that bench asks (server/app.py, peer_dir), with its own CSP (wllama's workers are
// Blob URLs) and cross-origin isolation (wllama then takes its multi-thread build by itself).
//
// It knows nothing of prompts or of the lab: Python fits each prompt to its token count and reads the results.
// Every completion is greedy (temperature 0, top_k 1) with the prompt cache off, so each turn prefills its whole
// prompt; timed turns ignore end-of-generation, so they decode exactly max_tokens.
import { Wllama } from './node_modules/@wllama/wllama/esm/index.js';

const WASM = new URL('node_modules/@wllama/wllama/esm/wasm/wllama.wasm', import.meta.url).href;
const LINE_CHARS = 400;     // a log line kept whole up to this: the context info wllama logs holds the whole vocab
const status = document.querySelector('[data-testid="status"]');

// Every line wllama and llama.cpp print, in order: which backend took the layers is only in the load log
// (`load_tensors: offloaded N/N layers to GPU`); without shader-f16 wllama runs on its CPU path without an error.
const lines = [];
const keep = (level) => (...args) => {
  const text = args.map((a) => (typeof a === 'string' ? a : JSON.stringify(a))).join(' ');
  lines.push(`${level}: ${text.slice(0, LINE_CHARS)}`);
};
const logger = { debug: keep('debug'), log: keep('log'), warn: keep('warn'), error: keep('error') };

let wllama = null;

const GREEDY = { temperature: 0, top_k: 1, cache_prompt: false };

// The layers llama.cpp placed on a GPU backend, from its load log: null when it printed no such line.
function offloaded() {
  for (const line of lines) {
    const m = line.match(/offloaded (\d+)\/(\d+) layers to GPU/);
    if (m) return { layers: Number(m[1]), of: Number(m[2]), line };
  }
  return null;
}

// wllama's defaults otherwise (its f16 KV cache, flash attention where llama.cpp picks it, half the cores as threads).
async function load({ n_ctx, n_gpu_layers = 999 }) {
  const file = document.querySelector('[data-testid="model-file"]').files[0];
  if (!file) throw new Error('no file in the input');
  status.textContent = `loading ${file.name}`;
  const t0 = performance.now();
  wllama = new Wllama({ default: WASM }, { logger });
  await wllama.loadModel([file], { n_ctx, n_gpu_layers });
  const load_ms = performance.now() - t0;
  const { metadata, ...context } = wllama.getLoadedContextInfo();
  status.textContent = `loaded ${file.name}`;
  return {
    load_ms, file_bytes: file.size, context, offloaded: offloaded(),
    libllama: Wllama.getLibllamaVersion(), multithread: wllama.isMultithread(), threads: wllama.getNumThreads(),
    cross_origin_isolated: self.crossOriginIsolated, hardware_concurrency: navigator.hardwareConcurrency,
    log: lines.filter((l) => /webgpu|gpu|offload|backend|device|f16|buffer size|CPU|thread/i.test(l)),
  };
}

// One completion of max_tokens after `prompt`, streamed so the first token's arrival is seen: the page's wall
// clock (ttft_ms, from the call to the first chunk; decode_ms, from there to the end) beside wllama's own
// timings. `ban`: token ids never to sample (logit bias -inf), for files whose random weights would otherwise
// make llama.cpp emit invalid UTF-8, which wllama's JSON layer rejects.
async function turn({ prompt, max_tokens, ban = [] }) {
  let first = null, chunks = 0, last = null, text = '';
  const t0 = performance.now();
  await wllama.createCompletion({
    prompt, max_tokens, ignore_eos: true, ...GREEDY, logit_bias: ban.map((id) => [id, false]), stream: true,
    onData: (c) => { first ??= performance.now(); chunks += 1; last = c; text += c.choices?.[0]?.text ?? ''; },
  });
  const t1 = performance.now();
  return { ttft_ms: first - t0, decode_ms: t1 - first, wall_ms: t1 - t0, chunks, text,
           timings: last?.timings ?? null, usage: last?.usage ?? null,
           finish_reason: last?.choices?.[0]?.finish_reason ?? null };
}

// Short decodes until `ms` have passed (at least one), so the timed call after it finds the GPU's clocks up, as
// the lab's `warm` does before its measured turns.
async function warm({ ms, ban = [] }) {
  const t0 = performance.now();
  let n = 0;
  do {
    await wllama.createCompletion({ prompt: 'The', max_tokens: 8, ignore_eos: true, ...GREEDY,
                                    logit_bias: ban.map((id) => [id, false]) });
    n += 1;
  } while (performance.now() - t0 < ms);
  return { calls: n, ms: performance.now() - t0 };
}

// The greedy continuation of `prompt` as token ids (from the per-token probabilities llama.cpp reports), stopping
// at end-of-generation like llama.cpp's own greedy run.
async function greedy({ prompt, max_tokens }) {
  return wllama.createCompletion({ prompt, max_tokens, ...GREEDY, n_probs: 1 });
}

window.peerBench = { load, turn, warm, greedy, log: () => lines.slice() };
status.textContent = 'ready';
