"""The messages between the page and the worker: every type named once here, with what it carries and what answers it.

lab/worker/router.py routes by the names in INCOMING, and tests/unit/test_worker_protocol.py fails when a routed type
is not catalogued here, a catalogued one is not routed, or the worker posts a type OUTGOING does not list. The page
(web/main.js, web/worker.js) spells the same strings.

An id-answered question (tests and benchmarks ask them): the page sends {type, id, ...}; the worker answers
{type, id, ...fields}, or {type, id, error: "Kind: message"} when it fails, so the asker's promise settles either way.
`answered` declares a handler one. Any other handler's failure reaches the page as error {where: type, message, seq}.

What it does not know: how any message is handled (router.py and the modules it routes to).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

INCOMING: dict[str, str] = {      # type -> what it carries and asks, and what answers it
    # the product
    "init": "open the GPU device and run the self-test -> gpu, selftest",
    "load": "{file, n_ctx?, int8?, kv? (\"f16\" or \"f32\"), seq}: read the header, validate, budget, upload "
            "(web/worker.js labUpload) "
            "-> model-info, loaded",
    "chat": "{messages, settings, max_new, kv_view? (\"live\": the memory card's columns with each token, \"end\": "
            "its picture at the turn's end, absent: none)}: one turn -> prompt, token..., kv-view..., memory-view..., "
            "done",
    "reset": "{head?}: new chat: the conversation dropped and wiped as Forget wipes it, less the user's files (the "
             "retrieval index and its tuned embedder's parameters, a trained adapter's parameters); the model kept "
             "-> reset",
    "probe-embedding": "{id (a token id), index}: its embedding row and neighbours -> embedding",
    "probe-inspect": "{start, end, attention, residual, lens}: the panels' pass over the conversation -> inspection",
    "forget": "{skip?, head?}: wipe and check every conversation buffer (skip: tests, one buffer left; head: the "
              "memory card's {layer, head}, redrawn from the read-back) -> forget",
    "unload": "{log? (tests: its progress to the console, counts only)}: the tab is closing (pagehide): every "
              "conversation buffer cleared, read back and destroyed with the model, the Python copies dropped "
              "-> unloaded (the page may be gone by then)",
    "memory-head": "{layer, head}: one delta-net head's recurrent state for the memory card -> memory-head",
    "kv-picture": "{}: the memory card's whole picture as the session holds it, for a card opened after turns it "
                  "missed -> kv-view, memory-view (a hybrid)",
    "probe-rope": "{pos, layer, seq}: the RoPE card's q, k and probabilities (lab/worker/rope.py) -> rope",
    "verify": "{file, seq}: the verification card's replay (lab/worker/verify.py) -> verify-progress, verify",
    "verify-kernels": "{seq}: the verification card's kernel fixtures -> verify-kernels",
    "perplexity": "{text, n_ctx, seq}: the perplexity card (lab/worker/perplexity.py); its cancel is stop "
                  "-> perplexity-progress..., perplexity",
    "retrieval-index": "{files, window, stride, seq}: the retrieval card's index of the user's text files, replacing "
                       "the old one (lab/worker/retrieval.py); its cancel is stop -> retrieval-plan, "
                       "retrieval-progress..., retrieval-ready",
    "retrieval-ask": "{question, k, compare, settings, max_new, seq}: the k nearest windows, the packed prompt and "
                     "its answer, and with compare the answer without passages (same settings and seed) "
                     "-> retrieval-hits, retrieval-token..., retrieval-answer",
    "retrieval-recall": "{queries, seed, seq}: recall@1 and @5 of the index on random crops of its files; its cancel "
                        "is stop -> retrieval-progress..., retrieval-recall",
    "retrieval-drop": "{seq}: the index dropped (the card's Clear) -> retrieval-dropped",
    "retrieval-tune": "{stage (crops | query | both), steps, pairs, rank, full, lr, queries, seq}: the retrieval "
                      "card's embedder tuned contrastively on the indexed files' windows, recall measured before and "
                      "after each stage, then the index embedded again with it (lab/worker/embedder.py); its cancel "
                      "is stop -> retrieval-tune-plan, retrieval-tune-progress..., retrieval-tune-table..., "
                      "retrieval-tune-done (retrieval-dropped, then error, when it fails after its start)",
    "retrieval-tune-switch": "{on, seq}: the tuned adapter on or off for the card's search, the index embedded again "
                             "-> retrieval-tune-progress..., retrieval-tune-switch",
    "retrieval-tune-download": "{seq}: the tuned adapter as a llama.cpp adapter GGUF (every weight tuned: the model) "
                               "-> retrieval-tune-download",
    "experiment-tokens": "{texts {name: text}, seq}: the Experiments card's prompts as tokens, while typed "
                         "(lab/worker/experiments.py) -> experiment-tokens",
    "experiment": "{kind (ablate | patch | steer | attribute), its inputs, confirm, seq}: one experiment on the "
                  "loaded model, the chat's KV cache set aside and put back; a sweep over ASK_S waits for confirm; its "
                  "cancel is stop -> experiment-plan, then experiment-progress..., experiment-token... (steer), "
                  "experiment-result",
    "router": "{seq}: the Router card's reading of a mixture of experts' routing over the conversation, the chat's "
              "KV cache set aside and put back (lab/worker/routing.py) -> router",
    "router-ablate": "{layer, expert, max_new, seq}: one expert of a routed layer left out of the weighted sum, the "
                     "next token's distribution and the greedy continuation of the conversation with and without it "
                     "-> router-ablation",
    "train": "{text, rank, steps, lr, ctx, batch, optimizer, full, chat, seq}: the Training card's run, a new LoRA "
             "adapter on the text (chat true: a .jsonl of chat turns, its assistant's tokens alone trained), or (full "
             "true) every weight of the loaded F32 model trained in place, its weights the "
             "user's data from then on (lab/worker/training.py); its cancel is stop -> train-plan, "
             "train-progress..., train-done",
    "train-compare": "{prompt, max_new, chat, system, seq}: greedy replies without and with the adapter (chat: to "
                     "the prompt as a user's turn) -> train-token..., "
                     "train-compare",
    "train-adapter": "{seq}: the adapter as a llama.cpp adapter GGUF -> train-adapter",
    "train-switch": "{on, seq}: the adapter on or off for the chat, the panels and the cards -> train-switch",
    "train-adapter-file": "{file, seq}: a llama.cpp LoRA adapter file (a File) checked against the model and put on "
                          "it as the Training card's adapter, in place of the one before -> train-adapter-file",
    "train-new": "{tokenizer (a lab tokenizer JSON file, as text), tokenizer_name, text, preset, steps, lr, ctx, "
                 "batch, optimizer, seed, seq, load_seq}: the Training card's other mode, a llama model trained from "
                 "scratch (lab/worker/scratch.py): everything checked, then the model before unloaded, the new one "
                 "drawn, loaded and trained; its cancel is stop -> model-info, loaded (both with load_seq), "
                 "train-plan, train-progress..., train-done",
    "train-model": "{seq}: the model trained here (from scratch, or every weight of a file's), as a GGUF of F32 "
                   "tensors llama.cpp loads -> train-model",
    "grounded-set": "{seq}: the retrieval card's indexed files made into a grounded set by rule (answers quoted, "
                    "rows to decline; lab/worker/grounded.py) -> grounded-set",
    "grounded-eval": "{held (a held-out .jsonl), max_new, seq}: each held-out row's greedy reply without and with the "
                     "Training card's adapter, scored; its cancel is stop -> grounded-row..., grounded-eval",
    "tokenizer-train": "{files (Files) | text (the chat's), vocab, seq}: the Tokenizer card's training, a byte-level "
                       "BPE vocabulary on the user's text, no model needed (lab/worker/tokenizer.py); its cancel is "
                       "stop -> tokenizer-progress..., tokenizer-done",
    # tests and benchmarks (lab/worker/hooks.py); "answered": an id-answered question
    "kv-rows": "{id, positions}: raw K/V rows in base64, read without the KV panel's kernel (answered)",
    "state-bytes": "{id}: every conv and delta-net state's and snapshot's raw bytes in base64, read without the "
                   "memory card's code (answered)",
    "last-logits": "{id, ids}: the logits after prefilling raw ids, base64 (answered)",
    "train-grads": "{id, T, rank, alpha, params, windows}: a training step's LoRA gradients and loss with the adapter "
                   "set to params (base64); drops the conversation and the Training card's run (answered)",
    "greedy-ids": "{id, ids, n, session?}: n greedy ids after raw ids, no template, no stop; session: as a turn of the "
                  "worker's Session, reusing what the last turn left (answered)",
    "kernel-check": "{id, cases}: kernel cases through lab/instruments/kernelcheck.py, base64 both ways (answered)",
    "weight-bytes": "{id, name, offset, size}: a tensor's bytes read back from the GPU, base64 (answered)",
    "profile": "{id?, t, pos, families, reps, warm_ms}: GPU time of a step by timestamp queries, on random ids; "
               "drops the conversation (answered)",
    "warm": "{ms}: the GPU kept busy before a measured turn; drops the conversation -> warm",
    "ffi-cost": "{n}: what one Python->JS call, one small to_js and one idle read-back cost -> ffi-cost",
}
# The routing table's keys: IN.INIT is "init", IN.PROBE_ROPE is "probe-rope"; a name not in INCOMING fails at import.
IN = SimpleNamespace(**{name.upper().replace("-", "_"): name for name in INCOMING})

OUTGOING: dict[str, str] = {      # type -> what it carries
    "gpu": "{info}: the adapter's summary",
    "selftest": "{result}: the self-test's checks",
    "model-info": "{summary, seq, made?}: the header's summary and the memory budget, for the model card; made (a "
                  "model trained from scratch, its shape): the model before is gone",
    "loaded": "{seq, stats}: the load's timings, sizes and what the panels need to know of the model (stats.made: "
              "its weights were drawn here, not uploaded)",
    "prompt": "{ids, pieces}: the rendered prompt",
    "token": "{id, piece, text, index, kv_used}: one generated token",
    "kv-view": "{start, end, n_layer, norms, ms}: the KV panel's new columns",
    "done": "{result}: the turn's ids, text and timings, kv_used, and reuse_note (what a hybrid's turn continued from)",
    "reset": "{report, kv, memory, unloaded (false)}: the conversation is gone: the wipe's proof (None without a device) and the KV "
             "caches and a hybrid's states as read back after it, as forget's",
    "embedding": "{index, id, piece, values, norm, neighbours, per_layer: null or gemma4's {values, norms, n_layer, "
                 "width, table_bytes}, ...}",
    "inspection": "{n, start, end, attention, residual, lens, pieces, ...}",
    "unloaded": "{report, left}: the unload's wipe (every conversation buffer read back after its clear) and the "
                "conversation buffers left after the model's were destroyed (the device's zeroed read-back ones)",
    "forget": "{report, kv, memory, unloaded}: the wipe's proof, and the KV caches and a hybrid's states as read back "
              "after it; unloaded: the model's weights were the user's (trained here, from scratch or in place), "
              "wiped with the rest, and it is gone",
    "memory-view": "{pos, state_pos, conv {start, end, layers, values} | null, delta (norms [n_delta, H]) | null, "
                   "snaps (the positions the snapshots hold) | null, ms}: "
                   "a hybrid's states for the memory card",
    "memory-head": "{layer, head, pos, values}: one delta-net head's state [d_k, d_v]",
    "rope": "{seq, n, pos, layer, q, k, probs, ...}: see lab/worker/rope.py",
    "verify-progress": "{seq, model, prompt, steps}: a reference was found; the replay starts",
    "verify": "{seq, hash, result | null, kv_used?}",
    "verify-kernels": "{seq, rows, adapter, buffers}",
    "perplexity-progress": "{seq, chunk, chunks, ppl, n_tokens}",
    "perplexity": "{seq, result}",
    "retrieval-plan": "{seq, files [{name, tokens}], refused [{name, message}], windows, tokens, tokenize_s}: what the "
                      "index will hold, before any GPU work",
    "retrieval-progress": "{seq, what (index | recall), done, total, seconds, eta_s}",
    "retrieval-ready": "{seq, built {windows, done, seconds, windows_per_s, stopped}, files, windows}",
    "retrieval-hits": "{seq, hits [{rank, file, window, start_token, end_token, score, text}], prompt (the packed "
                      "prompt as the model reads it), prompt_tokens}",
    "retrieval-token": "{seq, which (rag | plain), piece}: one generated token of an answer",
    "retrieval-answer": "{seq, rag, plain | null}: the answers' text and timings (lab.engine.session.Result)",
    "retrieval-recall": "{seq, recall {queries, recall_at_1, recall_at_5, seconds, crop, seed}}",
    "retrieval-dropped": "{seq}: the index is gone",
    "retrieval-tune-plan": "{seq, stages, steps, pairs, window, windows (the training's), tokens, rank (null: every "
                           "weight), full, lr, params, queries, memory {what: bytes}}: the run, before its first "
                           "measurement",
    "retrieval-tune-progress": "{seq, phase (measure | train | index), row (measure: the table's row it measures), "
                               "stage (train), done, total, loss (train), seconds}",
    "retrieval-tune-table": "{seq, columns, rows [[name, recall@1, recall@5 (24-token crops), recall@1, recall@5 "
                            "(12)]]}: the table so far (lab/instruments/embedder.py rows)",
    "retrieval-tune-done": "{seq, table, stopped, diverged, steps_done, seconds, built (the index embedded again), "
                           "tuned (an embedder is kept), full, on, params, labels (its buffers')}",
    "retrieval-tune-switch": "{seq, on, built | null}: the index is embedded with (or without) the tuned adapter",
    "retrieval-tune-download": "{seq, size, full, bytes (the GGUF's size bytes, padded to whole words)}",
    "experiment-tokens": "{seq, tokens {name: [piece, ...]}}: each prompt's tokens, BOS included where the "
                         "vocabulary adds one",
    "experiment-plan": "{seq, kind, runs, seconds_per_run, estimate_s, ask, ask_s, slow, fit_layers, fit_runs}: the "
                       "sweep's size and time before it starts (ask: it waits for confirm; fit_layers: the layers "
                       "that fit in ask_s)",
    "experiment-progress": "{seq, done, total, seconds, eta_s}",
    "experiment-token": "{seq, which (steered | plain), piece}: one generated token of a steering reply",
    "experiment-result": "{seq, kind, result (lab/instruments/experiments.py's dict, with the prompts' pieces), "
                         "pieces {id: piece}}",
    "router": "{seq, layers, n_expert, k, gating, tokens (pieces), experts, weights (f32 [layers, t, k]; experts "
              "holds ids), entropy (f32 [layers, t], bits), load, share ([layer][expert]), mean_entropy, seconds}",
    "router-ablation": "{seq, layer, expert, top5_before, top5_after, kl_bits, greedy_before, greedy_after, "
                       "first_change, seconds, tokens, n_expert, pieces {id: piece}}",
    "train-plan": "{seq, tokens, windows, train, held, ctx, batch, steps, rank (null: every weight), lr, optimizer, "
                  "params, targets, full (every weight trained), made (a model from scratch: its shape) | null, memory {adapter | model, "
                  "gradients, optimizer, tokens, activations: bytes}, labels (its buffers')}: the run's windows and "
                  "what it trains, before the first step",
    "train-progress": "{seq, step (0: before training), steps, loss | null, held | null, lr, seconds, tokens_per_s, "
                      "eta_s}",
    "train-done": "{seq, steps_done, steps, stopped, diverged, held_before, held_after, ppl_before, ppl_after, "
                  "seconds, tokens_per_s, memory}",
    "train-token": "{seq, which (without | with), piece}: one generated token of a reply",
    "train-compare": "{seq, prompt_tokens, without, with: {text, tokens, stop}}",
    "train-adapter": "{seq, size, bytes (the GGUF's size bytes, padded to whole words)}",
    "train-switch": "{seq, on}: the adapter is on (or off) for what runs next",
    "train-model": "{seq, size, bytes (the GGUF's size bytes, padded to whole words)}",
    "train-adapter-file": "{seq, file, name, size, pairs, ranks, alpha, params, types, ignored, memory {adapter, "
                          "activations: bytes}, labels (its buffers')}: the file's adapter is on",
    "grounded-set": "{seq, files, train, held (.jsonl texts), rows, refusals, held_rows, held_refusals}",
    "grounded-row": "{seq, which (without | with), done, total, answerable, refused, grounding}: one held-out reply",
    "grounded-eval": "{seq, without, with (each {refuses_when_it_should, refuses_when_it_should_not, grounding, "
                     "rows_should_refuse, rows_should_answer, replies_grounded} or null), stopped}",
    "tokenizer-progress": "{seq, phase (count | merge | measure), done, total, seconds}",
    "tokenizer-done": "{seq, result (lab/worker/tokenizer.py summary), json (the CLI's --out file, as text), gguf (the "
                      "vocabulary-only GGUF, padded to whole words), gguf_size}",
    "error": "{where, message, seq?}: where is the type of the message whose handling failed, device (the GPU was "
             "lost) or boot (web/worker.js)",
    "kv-rows": "{id, kvd, n_layer, layers, rows}",
    "state-bytes": "{id, conv {layer: base64}, delta {layer: base64}, snapshots [base64], held}",
    "last-logits": "{id, logits}",
    "train-grads": "{id, loss, grads}",
    "greedy-ids": "{id, ids, reused?, stop?}",
    "kernel-check": "{id, results, adapter, buffers {before, after}}",
    "weight-bytes": "{id, bytes}",
    "profile": "{id, t, pos, rows [{family, dispatches, gpu_us, ...}]}",
    "warm": "{steps}",
    "ffi-cost": "{n, call_us, to_js_us, read_ms}",
}

# web/worker.js takes these itself, since Python is busy (a load, a turn) when they matter.
BY_WORKER_JS: dict[str, str] = {
    "stop": "in: end the turn, the perplexity run, the retrieval card's build, recall or answer, its tuning or the "
            "training at their next step, or the tokenizer's training at its next slice of merges (labStopRequested)",
    "cancel-load": "in: stop every load asked for so far at its next chunk",
    "memory": "in and out: the wasm heap's size and the call counts",
    "count-calls": "in: start counting WebGPU and lab* calls (lab bench --backend browser)",
    "status": "out: boot progress",
    "booted": "out: Python is ready",
    "load-progress": "out: {seq, done, total, seconds, mb_s, eta_s, wasm_heap_growth} during labUpload",
}


def answered(ask):
    """Declare an id-answered question: `ask(msg, w)` returns the answer's fields, which go out as {type, id,
    ...fields} under the question's type and id; an exception goes out as {type, id, error: "Kind: message"}."""
    @functools.wraps(ask)
    async def handler(msg: dict, w) -> None:
        reply = {"type": msg["type"], "id": msg.get("id")}
        try:
            fields = await ask(msg, w)
        except Exception as exc:  # answered under the question's id, so the asker's promise settles
            w.post({**reply, "error": f"{type(exc).__name__}: {exc}"})
            return
        w.post({**reply, **fields})
    handler.answers_by_id = True     # these answer under the question's own type (tests/unit/test_worker_protocol.py)
    return handler
