"""`lab bench MODEL --backend browser`: the page's own speed, measured by driving the real page (CPython only).

The lab's server runs in a thread (uvicorn, as in tests/browser), headless Chromium opens the page through
Playwright, loads MODEL through the file input and chats through the prompt box, as a user would. What it
reports is what the worker reports to the page: `loaded` (upload MB/s, the engine's dispatches per token),
`done` (TTFT, prefill and decode tok/s), and the worker's call counters (web/worker.js, `count-calls`):

- Python->JS calls per decode token: every call Python makes through pyodide.ffi to a WebGPU method, a lab*
  helper (labEncode, labStopRequested) or postMessage, counted by wrappers in the worker and differenced
  between consecutive `token` messages (one decode step each). Not counted: attribute reads on JS proxies,
  `to_js` conversions and typed-array constructors (`Uint8Array.new`), which Pyodide does without calling
  a JS function of ours; `ffi_cost` prices a call and a small `to_js` instead.
- Dispatches and compute passes per decode token: the same counters, on the JS side of labEncode.
- mapAsync wait per token: from the read-back's call until its promise settles, i.e. the GPU's work on
  the step plus the round trip to Chromium's GPU process.
- Peak wasm heap: wasm memory never shrinks, so its size at the end is its peak.

- The adapter: asked for by the page itself (`navigator.gpu.requestAdapter`, high performance, as the worker
  asks), with its info (vendor, architecture), every feature and the limits the kernels care about.

The browser and its flags are options (`chromium`, `args`; the CLI's --chromium / --chromium-flags /
--chromium-flag, or LAB_CHROMIUM / LAB_CHROMIUM_FLAGS), so the same command runs on SwiftShader here and on a
GPU's adapter elsewhere (scripts/device_browser.sh). A file without a tokenizer is refused (the page chats);
lab/host/synthetic/sameshape.py makes same-shape files that keep the real header and tokenizer.
"""

from __future__ import annotations

import base64
import os
import shlex
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from lab.format import gguf
from lab.text import chat
from lab.text.tokenizer import from_metadata

# Debian's Chromium, WebGPU on SwiftShader: the defaults, which tests/browser/conftest.py launches with too.
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--enable-unsafe-webgpu", "--no-sandbox", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync", "--use-vulkan=swiftshader", "--use-webgpu-adapter=swiftshader"]
ENV_CHROMIUM, ENV_FLAGS = "LAB_CHROMIUM", "LAB_CHROMIUM_FLAGS"


def browser_command(chromium: str | None = None, flags: str | None = None, extra=(), env=None) -> tuple[str, list[str]]:
    """The browser binary and its flags: an explicit value, else the environment (LAB_CHROMIUM, and
    LAB_CHROMIUM_FLAGS as one shell-quoted string that replaces the whole default set), else Debian's Chromium
    on SwiftShader. `extra` flags are appended to whichever set won (e.g. a Dawn toggle to try)."""
    env = os.environ if env is None else env
    path = chromium or env.get(ENV_CHROMIUM) or CHROMIUM
    text = flags if flags is not None else env.get(ENV_FLAGS)
    # An empty LAB_CHROMIUM_FLAGS is "unset", not "no flags": a browser without --enable-unsafe-webgpu would
    # silently have no WebGPU on Linux.
    args = shlex.split(text) if text else list(ARGS)
    return path, args + list(extra)


# Asked in the page (main thread), as the worker asks: what the adapter is and offers, beyond the features
# the lab requests (lab/gpu/browser.py FEATURES), so a report says e.g. whether shader-f16 is missing.
ADAPTER_JS = """async () => {
  const a = await navigator.gpu?.requestAdapter({powerPreference: 'high-performance'});
  if (!a) return null;
  const i = a.info, limits = {};
  for (const k of ['maxStorageBufferBindingSize', 'maxBufferSize', 'maxComputeWorkgroupStorageSize',
                   'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX', 'maxComputeWorkgroupsPerDimension',
                   'maxStorageBuffersPerShaderStage']) limits[k] = a.limits[k];
  return {vendor: i.vendor, architecture: i.architecture, device: i.device, description: i.description,
          isFallbackAdapter: i.isFallbackAdapter ?? null, subgroupMinSize: i.subgroupMinSize ?? null,
          subgroupMaxSize: i.subgroupMaxSize ?? null, features: [...a.features].sort(), limits};
}"""
BOOT_TIMEOUT_S = 180
WARMUP = "Hi"

# Words for prompts of a chosen length: plain prose, so the tokenizer sees ordinary text.
PASSAGE = ["The", "river", "ran", "past", "the", "old", "mill", "and", "under", "the", "stone", "bridge,", "where", "children", "threw", "sticks", "into", "the", "water", "and", "watched", "them", "race", "toward", "the", "sea.", "In", "spring", "the", "banks", "filled", "with", "yellow", "flowers,", "and", "in", "autumn", "the", "leaves", "turned", "the", "current", "red", "and", "gold."]

# Records the worker's messages as the page receives them, before main.js runs (`window.__labBench`).
RECORDER = Path(__file__).resolve().parents[3] / "web" / "bench.js"


class BenchError(RuntimeError):
    """The page reported an error, or never answered."""


def _prompt_text(tok, md: dict, n: int) -> str:
    """A user message whose chat-rendered prompt has about n tokens (at least the template's own): the fewest
    words that reach n. The length grows with the words, so a doubling then a bisection find them in
    O(log n) renders (a prompt of 2,048 tokens one word at a time took ~1,500 renders)."""
    def text(k: int) -> str:
        return " ".join(PASSAGE[i % len(PASSAGE)] for i in range(k))

    def reaches(k: int) -> bool:
        return len(chat.render_chat(tok, md, [{"role": "user", "content": text(k)}])) >= n

    hi = 1
    while not reaches(hi):
        hi *= 2
    lo = hi // 2                      # reaches(lo) is False, or lo == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return text(hi)


def _serve(model: Path, **app_options):
    """The lab's server on a free port in a thread; `app_options` go to create_app (lab/host/bench/wllama.py
    passes peer_dir)."""
    import uvicorn

    from server.app import create_app
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(model, **app_options), host="127.0.0.1", port=port,
                                        log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started:
        if time.time() > deadline or not thread.is_alive():
            raise BenchError("the lab's server did not start")
        time.sleep(0.05)
    return srv, thread, f"http://127.0.0.1:{port}"


def resolve_browser(chromium: str | None, args: list[str] | None) -> tuple[str, list[str]]:
    """The Chromium binary and flags a page driver launches: the ones given, else `browser_command`'s defaults."""
    default_path, default_args = browser_command()
    return chromium or default_path, default_args if args is None else list(args)


@contextmanager
def browser_page(path, chromium: str, args: list[str], **app_options):
    """The lab's server for `path` in a thread and one fresh page of headless Chromium: yields (page, the server's
    URL, the page's errors as they come: uncaught exceptions and console errors); everything is closed after."""
    from playwright.sync_api import sync_playwright
    srv, thread, url = _serve(Path(path), **app_options)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=list(args))
            try:
                page = browser.new_context().new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                yield page, url, errors
            finally:
                browser.close()
    finally:
        srv.should_exit = True
        thread.join(10)


class _Page:
    """The lab page and the worker messages it has received."""

    def __init__(self, page) -> None:
        self.page = page

    def count(self) -> int:
        return self.page.evaluate("__labBench.messages.length")

    def wait(self, kind: str, since: int, timeout_s: float) -> dict:
        """The first `kind` message at index >= since; an `error` message raises."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout
        try:
            self.page.wait_for_function("([kind, n]) => __labBench.arrived(kind, n)", arg=[kind, since],
                                        timeout=timeout_s * 1e3, polling=200)
        except PlaywrightTimeout as exc:
            raise BenchError(f"no `{kind}` message from the worker within {timeout_s:.0f} s") from exc
        for m in self.since(since):
            if m["type"] == "error":
                raise BenchError(f"the page reported an error ({m.get('where')}): {m.get('message')}")
            if m["type"] == kind:
                return m
        raise AssertionError("unreachable")

    def since(self, n: int) -> list[dict]:
        return self.page.evaluate("n => __labBench.since(n)", n)

    def post(self, msg: dict) -> None:
        """A message to the worker directly, not through a page control (the page has none for these)."""
        self.page.evaluate("m => __labBench.post(m)", msg)

    def ask(self, msg: dict, reply: str, timeout_s: float) -> dict:
        n = self.count()
        self.post(msg)
        return self.wait(reply, n, timeout_s)

    def send(self, text: str, max_new: int, timeout_s: float) -> dict:
        """Type a prompt, press Enter, and wait for the turn's `done`; returns it with the page's readouts."""
        p = self.page
        n = self.count()
        p.fill('[data-testid="max-tokens"]', str(max_new))
        p.fill('[data-testid="prompt"]', text)
        p.press('[data-testid="prompt"]', "Enter")
        done = self.wait("done", n, timeout_s)
        prompt = next(m for m in self.since(n) if m["type"] == "prompt")
        p.wait_for_function("!document.querySelector('[data-testid=send]').disabled", timeout=30_000)
        shown = p.evaluate("document.querySelectorAll('[data-testid=token]').length")
        return {"done": done["result"], "prompt_ids": len(prompt["ids"]),
                "page_prompt_tokens": shown - len(done["result"]["ids"]),
                "page_timings": p.locator('[data-testid="timings"]').inner_text()}

    def new_chat(self) -> None:
        """The page's New chat, then a worker `reset`: the page keeps the KV cache for prefix reuse, and a
        measured prefill must start from an empty cache."""
        self.page.click('[data-testid="new-chat"]')
        # The reset waits its turn behind what panels ask of the worker after a reply (minutes on a busy CPU adapter).
        self.ask({"type": "reset"}, "reset", 300)


def _per_token(marks: list[dict]) -> dict:
    """Calls and waits per decode step, from the counter snapshots taken at each generated token."""
    steps = len(marks) - 1
    if steps < 1:
        return {}
    a, b = marks[0], marks[-1]

    def diff(side: str) -> dict:
        names = set(a[side]) | set(b[side])
        return {k: round((b[side].get(k, 0) - a[side].get(k, 0)) / steps, 2) for k in sorted(names)
                if b[side].get(k, 0) != a[side].get(k, 0)}

    py, js_, wait = diff("python"), diff("js"), diff("wait_ms")
    return {"steps": steps, "ms_per_token": round((b["ms"] - a["ms"]) / steps, 1),
            "python_js_calls_per_token": round(sum(py.values()), 2), "python_js_calls": py,
            "dispatches_per_token": js_.get("GPUComputePassEncoder.dispatchWorkgroups", 0),
            "compute_passes_per_token": js_.get("GPUCommandEncoder.beginComputePass", 0)
            + py.get("GPUCommandEncoder.beginComputePass", 0),
            "map_wait_ms_per_token": round(wait.get("GPUBuffer.mapAsync", 0), 1)}


def _gpu_profile(lab: _Page, stats: dict, out: dict, reps: int, timeout_s: float) -> dict:
    """The page's steps timed on its GPU (the worker's `profile`): whole steps and kernel families, by the step's
    tokens at its position: {"prefill 512 @0": rows, "decode @31": rows, ...}. Each is asked after a warm-up of steps
    at 0, which leave a hybrid's conv and delta-net states at max_batch, past a decode's position, and no step takes
    them back there (issue #45): the worker primes the ids by a step at 0 and times the plan at the position
    (lab/instruments/profile.py prime), the same dispatches a chat's step there runs, on a dense model as on a
    hybrid."""
    t = min(max(v["prompt_tokens"] for v in out["prefill"].values()), stats["max_batch"])
    positions = sorted(int(n) for n in out["decode"])
    res = {}
    for name, steps, pos in ((f"prefill {t} @0", t, 0), *((f"decode @{p}", 1, p) for p in dict.fromkeys(
            (positions[0], positions[-1])))):
        # warmed first: the turns' pauses have let the clocks drop, and the first passes would time their ramp
        m = lab.ask({"type": "profile", "t": steps, "pos": pos, "families": True, "reps": reps, "warm_ms": 1000},
                    "profile", timeout_s)
        if "error" in m:
            raise BenchError(f"the page could not time its {name}: {m['error']}")
        res[name] = m["rows"]
    return res


def bench_browser(path, *, prompts=(32,), decode_tokens: int = 8, warmup: bool = True,
                  chromium: str | None = None, args: list[str] | None = None, turn_timeout_s: float = 1800,
                  n_ctx: int | None = None, int8: bool = False, profile: int = 0, warm_gpu_s: float = 0,
                  kv: str = "f32") -> dict:
    """Load `path` through the page's file input, then for each prompt length one greedy turn of
    decode_tokens decode steps (after a short warm-up turn that compiles the pipelines).
    `chromium` and `args` (Chromium's flags) default as browser_command() says (e.g. ARGS +
    ["--enable-dawn-features=..."] to try Dawn toggles). `n_ctx`: the KV cache the page loads the model with
    (default: the largest prompt plus the decode and some slack, or the page's own if that is larger). `kv`: the
    load's KV cache type ("f16": the page's "KV cache in f16" box; `kv_type` in the JSON says what the page made).
    `warm_gpu_s`: the GPU kept busy that long right before each measured turn (the worker's `warm`), as a native
    benchmark's steps follow each other: an idle GPU lowers its clocks, and the turn after a pause then measures the
    clock's ramp (a 512-token prefill up to 5x slower on the H200). 0: turns as a user types them.
    `profile` (passes per median, 0: none): after the turns, the GPU time of the page's steps by timestamp queries
    (`gpu` in the JSON): the whole prefill step of the largest prompt (up to the page's step) and decode at the
    shortest and the longest turn's context, each by kernel family too (lab/instruments/profile.py, the same code as the
    native `--profile`)."""

    from lab.settings import DEFAULT_CTX
    chromium, args = resolve_browser(chromium, args)
    n_ctx = n_ctx or max(DEFAULT_CTX, max(prompts) + decode_tokens + 64)
    path = Path(path)
    header = gguf.read_file(path)
    if "tokenizer.ggml.model" not in header.metadata:
        raise BenchError(f"{path.name} has no tokenizer: the browser backend runs the page's chat, so it needs a "
                         f"real GGUF file (synthetic models have none; use the native backend for them)")
    tok = from_metadata(header.metadata)
    load_avg = [round(x, 2) for x in os.getloadavg()]
    with browser_page(path, chromium, args) as (page, url, errors):
        page.add_init_script(f"window.__labBenchCtx = {int(n_ctx)};")
        if int8:
            page.add_init_script("window.__labBenchInt8 = true;")
        if kv != "f32":
            page.add_init_script(f"window.__labBenchKv = '{kv}';")
        page.add_init_script(path=RECORDER)
        page.goto(url + "/")
        lab = _Page(page)
        selftest = lab.wait("selftest", 0, BOOT_TIMEOUT_S)["result"]
        gpu_info = lab.wait("gpu", 0, 10)["info"]
        adapter = page.evaluate(ADAPTER_JS)
        if not selftest["ok"]:
            raise BenchError(f"the page's GPU self-test failed: {selftest}")
        heap_boot = lab.ask({"type": "memory"}, "memory", 30)["wasm_heap"]

        n = lab.count()
        t0 = time.perf_counter()
        page.set_input_files('[data-testid="model-file"]', str(path))
        stats = lab.wait("loaded", n, turn_timeout_s)["stats"]
        load_wall = time.perf_counter() - t0
        heap_load = lab.ask({"type": "memory"}, "memory", 30)["wasm_heap"]
        ffi = lab.ask({"type": "ffi-cost", "n": 2000}, "ffi-cost", 60)

        if warmup:
            lab.send(WARMUP, 2, turn_timeout_s)
            lab.new_chat()
        out = {"backend": "browser", "model": str(path), "arch": header.metadata.get("general.architecture"),
               "browser": f"Chromium {page.context.browser.version}", "chromium_args": list(args),
               "adapter": gpu_info["name"], "features": gpu_info["features"], "adapter_info": adapter,
               "n_ctx": stats.get("n_ctx"), "int8_prefill": stats.get("int8_prefill"), "kv_type": stats.get("kv_type"),
               "weight_bytes": stats["weight_bytes"], "build_s": stats["build_s"],
               "upload_s": stats["upload_s"], "load_mb_s": stats["upload_mb_s"],
               "load_wall_s": round(load_wall, 2),      # file input to `loaded`: header, engine, upload
               "dispatches_per_decode_token": stats["dispatches_per_token"],
               "ffi_cost": {"call_us": ffi["call_us"], "to_js_us": ffi["to_js_us"],
                            "idle_read_ms": ffi["read_ms"]},
               "warmup": warmup, "warm_gpu_s": warm_gpu_s, "prefill": {}, "decode": {}}
        for i, want in enumerate(prompts):
            if i:
                lab.new_chat()
            if warm_gpu_s:
                lab.ask({"type": "warm", "ms": warm_gpu_s * 1e3}, "warm", 60 + warm_gpu_s)
            lab.post({"type": "count-calls"})       # counters from zero, wrappers on
            turn = lab.send(_prompt_text(tok, header.metadata, want), decode_tokens + 1, turn_timeout_s)
            marks = lab.ask({"type": "memory"}, "memory", 30)["calls"]["marks"]
            r, ntok = turn["done"], turn["page_prompt_tokens"]
            if turn["prompt_ids"] != ntok:
                raise BenchError(f"the page shows {ntok} prompt tokens, the worker sent {turn['prompt_ids']}")
            out["prefill"][want] = {"prompt_tokens": ntok, "prefilled": r["prefilled"], "reused": r["reused"],
                                    "tok_s": r["prefill_tok_s"], "ttft_ms": round(r["ttft_s"] * 1e3, 1)}
            out["decode"][ntok] = {"tok_s": r["decode_tok_s"], "generated": len(r["ids"]), "stop": r["stop"],
                                   "weight_gb_s": round(stats["weight_bytes"] * r["decode_tok_s"] / 1e9, 3),
                                   **_per_token(marks), "page_timings": turn["page_timings"]}
        if profile:
            out["gpu"] = _gpu_profile(lab, stats, out, profile, turn_timeout_s)
        peak = lab.ask({"type": "memory"}, "memory", 30)["wasm_heap"]
        out["wasm_heap_mb"] = {"after_boot": round(heap_boot / 2**20, 1),
                               "after_load": round(heap_load / 2**20, 1), "peak": round(peak / 2**20, 1)}
        out["page_errors"] = errors
    out["load_avg"] = {"start": load_avg, "end": [round(x, 2) for x in os.getloadavg()]}
    return out


def _loaded(page, url: str, path, timeout_s: float) -> tuple[_Page, dict]:
    """The lab page opened with the worker's messages recorded, its GPU self-test passed, and `path` loaded through
    its file input, as a user loads a model: (the page's messages, the adapter the page got)."""
    page.add_init_script(path=RECORDER)
    page.goto(url + "/")
    lab = _Page(page)
    if not lab.wait("selftest", 0, BOOT_TIMEOUT_S)["result"]["ok"]:
        raise BenchError("the page's GPU self-test failed")
    adapter = page.evaluate(ADAPTER_JS)
    n = lab.count()
    page.set_input_files('[data-testid="model-file"]', str(path))
    lab.wait("loaded", n, timeout_s)
    return lab, adapter


def retrieval_page(path, files: list, *, queries: int = 100, seed: int = 0, window: int | None = None,
                   stride: int | None = None, chromium: str | None = None, args: list[str] | None = None,
                   timeout_s: float = 3600) -> dict:
    """`lab retrieval-eval --backend browser`: load `path` through the page's file input, index `files` through the
    retrieval card's own file input and Index button, then measure recall with the worker's `retrieval-recall` (the
    card's button takes no seed). The JSON has the native command's keys, plus the adapter."""
    chromium, args = resolve_browser(chromium, args)
    with browser_page(Path(path), chromium, args) as (page, url, _errors):
        lab, adapter = _loaded(page, url, path, timeout_s)
        if window is not None:
            page.fill('[data-testid="rag-window"]', str(window))
        if stride is not None:
            page.fill('[data-testid="rag-stride"]', str(stride))
        n = lab.count()
        page.set_input_files('[data-testid="rag-files"]', [str(f) for f in files])
        page.click('[data-testid="rag-index"]')
        plan = lab.wait("retrieval-plan", n, timeout_s)
        built = lab.wait("retrieval-ready", n, timeout_s)["built"]
        recall = lab.ask({"type": "retrieval-recall", "queries": queries, "seed": seed, "seq": 0},
                         "retrieval-recall", timeout_s)["recall"]
    return {"model": Path(path).name, "backend": "browser", "adapter": adapter, "files": plan["files"],
            "refused": plan["refused"], "windows": built["windows"], "tokens": plan["tokens"],
            "index_seconds": built["seconds"], "windows_per_s": built["windows_per_s"], "recall": recall}


# The last "train-adapter" message's file bytes as base64: the worker posts them as a Float32Array padded to whole
# words (lab/worker/training.py), read here as the bytes they are, `size` of them.
_ADAPTER_B64 = """n => {
    const m = __labBench.since(n).find((m) => m.type === "train-adapter");
    const u8 = new Uint8Array(m.bytes.buffer, m.bytes.byteOffset, m.size);
    let s = "";
    for (let i = 0; i < u8.length; i += 0x8000) s += String.fromCharCode(...u8.subarray(i, i + 0x8000));
    return btoa(s); }"""


def train_page(path, text: str, *, ctx: int, batch: int, steps: int, rank: int, lr: float, optimizer: str,
               chromium: str | None = None, args: list[str] | None = None, timeout_s: float = 3600,
               adapter_out: Path | None = None) -> dict:
    """`lab train --backend browser`: load `path` through the page's file input and post the Training card's own
    `train` message (lab/worker/training.py: the text's last windows held out, the first ones trained on in order, as
    `lab train` takes them from the start). Returns the native command's keys where the page has them: the losses,
    tokens/s over the steps after the first (the first pays for the pipelines' first dispatches, as natively; the time
    in the steps alone, from the card's running figure, its held-out evaluations left out), the first step's seconds,
    the memory; plus the card's own tokens/s (every step) and the held-out losses, and the adapter. `adapter_out`:
    where the trained adapter goes, as the card's download makes it (its "train-adapter" message)."""
    chromium, args = resolve_browser(chromium, args)
    with browser_page(Path(path), chromium, args) as (page, url, _errors):
        lab, adapter = _loaded(page, url, path, timeout_s)
        n = lab.count()
        lab.post({"type": "train", "text": text, "rank": rank, "steps": steps, "lr": lr, "ctx": ctx, "batch": batch,
                  "optimizer": optimizer, "seq": 1})
        done = lab.wait("train-done", n, timeout_s)
        msgs = lab.since(n)
        if adapter_out is not None and not any(m["type"] == "error" for m in msgs):
            k = lab.count()
            lab.post({"type": "train-adapter", "seq": 2})
            lab.wait("train-adapter", k, timeout_s)
            Path(adapter_out).write_bytes(base64.b64decode(page.evaluate(_ADAPTER_B64, k)))
    failed = next((m for m in msgs if m["type"] == "error"), None)
    if failed or done["steps_done"] < steps:
        raise BenchError(f"the page's training stopped: {failed or done}")
    plan = next(m for m in msgs if m["type"] == "train-plan")
    prog = [m for m in msgs if m["type"] == "train-progress" and m["step"] > 0]
    per_step = batch * ctx
    stepping = [m["step"] * per_step / m["tokens_per_s"] for m in prog]     # seconds in the steps up to each
    after_first = (steps - 1) * per_step / (stepping[-1] - stepping[0]) if steps > 1 else done["tokens_per_s"]
    return {"model": Path(path).name, "backend": "browser", "adapter": adapter, "losses": [m["loss"] for m in prog],
            "tokens_per_s": after_first, "card_tokens_per_s": done["tokens_per_s"], "first_step_s": stepping[0],
            "seconds": done["seconds"], "windows": plan["windows"], "trained_windows": plan["train"],
            "params": plan["params"], "steps": steps, "memory": done["memory"],
            "held_out": {"before": done["held_before"], "after": done["held_after"]},
            **({"out": str(adapter_out)} if adapter_out is not None else {})}


def experiment_page(path, msg: dict, *, repeat: int = 2, chromium: str | None = None, args: list[str] | None = None,
                    timeout_s: float = 3600) -> dict:
    """`lab patch | ablate --backend browser`: load `path` through the page's file input and post the Experiments
    card's own `experiment` message (lab/worker/experiments.py; `confirm` set, so a long sweep does not wait for the
    card's question) `repeat` times: the first run compiles the intervened plans, the later ones are the warm figure.
    Returns the last run's result (the native command's keys), each run's plan and seconds (the sweep's own, as the
    instrument times it, and the whole experiment from message to result), and the adapter."""
    chromium, args = resolve_browser(chromium, args)
    runs = []
    with browser_page(Path(path), chromium, args) as (page, url, _errors):
        lab, adapter = _loaded(page, url, path, timeout_s)
        for i in range(repeat):
            n = lab.count()
            t0 = time.perf_counter()
            lab.post({**msg, "type": "experiment", "confirm": True, "seq": i + 1})
            done = lab.wait("experiment-result", n, timeout_s)
            wall = time.perf_counter() - t0
            plan = next((m for m in lab.since(n) if m["type"] == "experiment-plan"), None)
            runs.append({"plan": plan, "sweep_s": done["result"].get("seconds"),
                         "experiment_s": round(wall, 3), "result": done["result"]})
    last = runs[-1]["result"]
    return {**last, "model": Path(path).name, "backend": "browser", "adapter": adapter,
            "timings": [{k: r[k] for k in ("sweep_s", "experiment_s")} | {"runs": r["result"].get("runs")}
                        for r in runs]}
