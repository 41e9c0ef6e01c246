"""`lab bench MODEL --backend wllama`: the browser peer, measured the way the lab's page is (CPython only).

wllama (npm @wllama/wllama 3.13.0, llama.cpp b12211 in wasm with its WebGPU backend) is what a page would use
instead of the lab. Its bench page (scripts/peer: index.html, peer.js, and the package in scripts/peer/node_modules,
installed by `npm ci` there) is served by the lab's server only for this bench (create_app's peer_dir, at
/peer/), never by the lab page (shared/DESIGN.md, invariant 10). The server, the browser and its flags are
lab/host/bench/browser.py's, so the same Chromium with the same adapter runs both.

What it measures, as `lab bench --backend browser` does: the load (file input to a loaded model, and MB/s of the
file), then for each prompt length one greedy turn of decode_tokens tokens: TTFT and prefill tok/s of the
prompt, decode tok/s at its context. Each figure is given twice: wllama's own (`timings`, llama-server's
prompt_ms / predicted_ms) as `tok_s`, and the page's wall clock (`wall_tok_s`, `ttft_ms`: the call to the first
streamed token). Then the greedy ids of a fixed prompt (the llama.cpp fixtures' first raw prompt when the file is
the fixtures', compared there with llama.cpp's CPU run on the file and on its F32 copy), and which path ran:
llama.cpp logs `offloaded N/N layers to GPU` only when its WebGPU backend took the layers; without `shader-f16` on
the adapter it runs on the CPU (wasm) without an error, so `path` is "webgpu" only when that line names every
layer.

How the turns differ from the lab's, and why:
- Prompts are raw completions, not chat turns: wllama's completion takes text only (an id array is refused), so
  each prompt is prose fitted to an exact token count (BOS included when the model adds one) with the lab's
  tokenizer, which is held to llama.cpp's (tests/fixtures); wllama 3.13 has no tokenize call. The count wllama
  reports (`prompt_n`) is recorded beside the one asked for. "Context 0" is a one-word prompt (and the BOS).
- Greedy (temperature 0, top_k 1), the prompt cache off (`cache_prompt`), end-of-generation ignored, so each
  turn prefills its whole prompt and decodes exactly decode_tokens.
- Timed turns never sample a token whose bytes are not valid UTF-8 on their own (a logit bias of -inf on a few
  hundred ids): random-weight files (lab/host/synthetic/sameshape.py) otherwise make llama.cpp emit invalid UTF-8, which
  wllama's JSON layer rejects mid-turn. Concatenations of valid pieces stay valid; the bias costs one pass over
  that list per token. The greedy-ids call runs without it.
- Before each timed turn, short decodes for warm_gpu_s (at least one), as the lab warms its GPU.

It does not measure GPU memory (no browser reports it) or what wllama does with an id prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from lab.format import gguf
from lab.host.bench.browser import ADAPTER_JS, PASSAGE, BenchError, browser_page, resolve_browser
from lab.text.tokenizer import from_metadata

ROOT = Path(__file__).resolve().parents[3]
PEER = ROOT / "scripts" / "peer"
WASM = PEER / "node_modules" / "@wllama" / "wllama" / "esm" / "wasm" / "wllama.wasm"
FIXTURES = ROOT / "tests" / "fixtures"
GREEDY_PROMPT, GREEDY_TOKENS = "The capital of France is", 48    # the fixtures' first raw prompt and length
BOOT_TIMEOUT_S = 60


def _fit(tok, n: int) -> str:
    """Prose whose completion prompt is exactly n tokens as llama.cpp tokenizes it (BOS added when the model adds
    one; so at least one word and the BOS): PASSAGE's words cut at a token boundary. Each word is at least one
    token, so n words are enough."""
    bos = 1 if tok.add_bos else 0
    want = max(n - bos, 1)
    words = " ".join(PASSAGE[i % len(PASSAGE)] for i in range(want + 1))
    ids = tok.encode(words)
    text = tok.decode(ids[:want])
    # A cut inside a word can re-tokenize differently; then drop characters until the count is right.
    while text and len(tok.encode(text)) > want:
        text = text[:-1]
    if len(tok.encode(text)) != want:
        raise BenchError(f"no prose of exactly {n} tokens found for this tokenizer")
    return text


def _not_utf8(tok, n_vocab: int) -> list[int]:
    """Ids whose bytes are not valid UTF-8 on their own (byte tokens, pieces of a multi-byte character)."""
    bad = []
    for i in range(n_vocab):
        try:
            tok.token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)
    return bad


def _fixtures(path: Path) -> dict[str, dict]:
    """llama.cpp's greedy runs of the fixtures' first raw prompt when `path` is the fixtures' very file: "cpu" on
    the file as it is (tests/fixtures/NAME.json: quantized dot products, f16 KV cache, as wllama computes) and "f32"
    on its F32 copy (NAME.f32.json: the function the lab computes). Empty for any other file."""
    found = {}
    digest = None
    for f in sorted(FIXTURES.glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        meta = d.get("meta", {}) if isinstance(d, dict) else {}
        if meta.get("model_file") != path.name:
            continue
        if digest is None:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 24), b""):
                    h.update(block)
            digest = h.hexdigest()
        if digest == meta.get("model_sha256"):
            kind = "f32" if "f32_copy" in meta else "cpu"
            found[kind] = next(p for p in d["prompts"] if not p["chat"])
    return found


def _path(offloaded: dict | None) -> str:
    """The path wllama ran: "webgpu" when llama.cpp put every layer on its GPU backend, else "cpu" (no offload line:
    no GPU device at all)."""
    return "webgpu" if offloaded and offloaded["layers"] == offloaded["of"] else "cpu"


def bench_wllama(path, *, prompts=(32,), decode_tokens: int = 8, chromium: str | None = None,
                 args: list[str] | None = None, n_ctx: int | None = None, warm_gpu_s: float = 0) -> dict:
    """Load `path` into wllama through the peer page's file input, then one greedy turn per prompt length
    (exactly that many prompt tokens, decode_tokens decoded), each after warm_gpu_s of short decodes (at least
    one), then the greedy ids of the fixed prompt. `chromium`, `args`: as bench_browser.browser_command() says.
    `n_ctx`: wllama's KV cache (default as the lab's browser bench: the largest prompt, the decode and slack, or
    the lab's default context if larger)."""
    from playwright.sync_api import Error as PlaywrightError

    from lab.settings import DEFAULT_CTX
    if not WASM.exists():
        raise BenchError(f"{WASM.relative_to(ROOT)} is missing: run `npm ci` in scripts/peer")
    chromium, args = resolve_browser(chromium, args)
    n_ctx = n_ctx or max(DEFAULT_CTX, max(prompts) + decode_tokens + 64)
    path = Path(path)
    header = gguf.read_file(path)
    if "tokenizer.ggml.model" not in header.metadata:
        raise BenchError(f"{path.name} has no tokenizer: wllama's completion takes text only")
    tok = from_metadata(header.metadata)
    texts = {n: _fit(tok, n) for n in prompts}
    ban = _not_utf8(tok, len(tok.tokens))
    refs = _fixtures(path)
    greedy_prompt = refs["cpu"]["prompt"] if "cpu" in refs else GREEDY_PROMPT
    greedy_tokens = len(refs["cpu"]["ids"]) if "cpu" in refs else GREEDY_TOKENS
    load_avg = [round(x, 2) for x in os.getloadavg()]
    with browser_page(path, chromium, args, peer_dir=PEER) as (page, url, errors):
        page.goto(url + "/peer/")
        page.wait_for_function("window.peerBench !== undefined", timeout=BOOT_TIMEOUT_S * 1e3)
        adapter = page.evaluate(ADAPTER_JS)

        page.set_input_files('[data-testid="model-file"]', str(path))
        t0 = time.perf_counter()
        loaded = page.evaluate("o => peerBench.load(o)", {"n_ctx": n_ctx})
        load_wall = time.perf_counter() - t0
        ctx = loaded["context"]
        features = (adapter or {}).get("features", [])
        out = {"backend": "wllama", "model": str(path), "arch": header.metadata.get("general.architecture"),
               "browser": f"Chromium {page.context.browser.version}", "chromium_args": list(args),
               "adapter": " ".join(filter(None, ((adapter or {}).get("vendor"),
                                                 (adapter or {}).get("architecture")))) or None,
               "features": features, "adapter_info": adapter, "shader_f16": "shader-f16" in features,
               "path": _path(loaded["offloaded"]), "offloaded": loaded["offloaded"],
               "libllama": loaded["libllama"], "multithread": loaded["multithread"],
               "threads": loaded["threads"], "cross_origin_isolated": loaded["cross_origin_isolated"],
               "hardware_concurrency": loaded["hardware_concurrency"],
               "n_ctx": ctx["n_ctx"], "n_batch": ctx["n_batch"], "n_ubatch": ctx["n_ubatch"],
               # file input to a loaded model, llama.cpp's warm-up run included
               "load_wall_s": round(load_wall, 2),
               "load_mb_s": round(loaded["file_bytes"] / 1e6 / (loaded["load_ms"] / 1e3), 1),
               "load_log": loaded["log"], "banned_tokens": len(ban), "warm_gpu_s": warm_gpu_s,
               "prefill": {}, "decode": {}, "timings": {}, "warm": {}}
        for want in prompts:
            out["warm"][want] = page.evaluate("o => peerBench.warm(o)", {"ms": warm_gpu_s * 1e3, "ban": ban})
            r = page.evaluate("o => peerBench.turn(o)",
                              {"prompt": texts[want], "max_tokens": decode_tokens, "ban": ban})
            t = r["timings"]
            ntok, gen = t["prompt_n"], t["predicted_n"]
            out["prefill"][want] = {"prompt_tokens": ntok, "asked": want, "reused": t["cache_n"],
                                    "tok_s": round(t["prompt_per_second"], 1),
                                    "wall_tok_s": round(ntok / (r["ttft_ms"] / 1e3), 1),
                                    "ttft_ms": round(r["ttft_ms"], 1), "prompt_ms": round(t["prompt_ms"], 1)}
            # A turn that ends before decode_tokens sampled an end-of-generation token despite ignore_eos's
            # -inf bias: its logits were NaN (a same-shape SmolLM2 on wllama's CPU path after any prompt of 4 or
            # more tokens, measured on SwiftShader). Its decode figure would time nothing, so it is left out.
            full = gen == decode_tokens
            out["decode"][ntok] = {"tok_s": round(t["predicted_per_second"], 1) if full else None,
                                   "generated": gen, "finish_reason": r["finish_reason"],
                                   "wall_tok_s": round((gen - 1) / (r["decode_ms"] / 1e3), 1) if full else None}
            out["timings"][want] = {**t, "page_ttft_ms": r["ttft_ms"], "page_decode_ms": r["decode_ms"],
                                    "page_wall_ms": r["wall_ms"], "chunks": r["chunks"]}
        try:
            g = page.evaluate("o => peerBench.greedy(o)",
                              {"prompt": greedy_prompt, "max_tokens": greedy_tokens})
            ids = [c["id"] for c in g["choices"][0]["logprobs"]["content"]]
            out["greedy"] = {"prompt": greedy_prompt, "ids": ids}
            for kind, ref in refs.items():     # the leading ids wllama shares with each llama.cpp run
                ref = ref["ids"]
                same = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b), min(len(ids), len(ref)))
                out["greedy"][f"llama_cpp_{kind}"] = {"ids": ref, "same_prefix": same}
        except PlaywrightError as exc:     # random weights: llama.cpp's invalid UTF-8, refused by wllama
            out["greedy"] = {"prompt": greedy_prompt, "error": str(exc).splitlines()[0][:300]}
        out["log_warnings"] = [x for x in page.evaluate("peerBench.log()")
                               if x.startswith(("warn:", "error:"))]
        out["page_errors"] = errors
    out["load_avg"] = {"start": load_avg, "end": [round(x, 2) for x in os.getloadavg()]}
    return out
