"""`lab bench`: speed measured, never asserted (CPython, native backend).

    lab bench MODEL.gguf | --synthetic NAME                     load MB/s, prefill and decode tok/s, TTFT
                         (smollm2, qwen2.5, gemma3, llama3.2-1b, llama3.1-8b, smollm3, lfm2-350m,
                          lfm2-1.2b, qwen3.5-0.8b, qwen3.5-2b: lab/host/synthetic/releases.py SPECS)
    lab bench kernels                                           matvec GB/s and prefill GEMM GFLOP/s per type
                      [--types Q4_K,..] [--shapes 14336x4096,..] and shape of KERNEL_SHAPES, or only these (both:
                      [--wg 64,128,..]                            every type at every shape); each matvec workgroup
                                                                  size asked

Decode is timed as the chat loop runs it (lab.engine.session: greedy steps submitted AHEAD at a time, then
one read-back of their ids), and also one step and one 4-byte read-back at a time.
"Weight bytes per token" counts every matrix once (decode reads each weight once per token), so
weight bytes x tok/s is the effective bandwidth.
"""

from __future__ import annotations

import asyncio
import random
import resource
import sys
import time

from lab import gpu, ops
from lab.engine.engine import Engine, read_host_values
from lab.engine.session import Session
from lab.format import gguf
from lab.format.model import from_gguf
from lab.host.native import open_native
from lab.instruments import profile
from lab.settings import Settings

KERNEL_SHAPES = [   # (type, rows, cols): the real models' matrices
    ("Q4_1", 1536, 576), ("Q4_1", 576, 1536), ("Q8_0", 49152, 576),                  # SmolLM2
    ("Q5_0", 4864, 896), ("Q6_K", 896, 4864), ("Q4_K", 896, 4864), ("Q8_0", 151936, 896),  # Qwen2.5
    ("Q5_0", 2048, 640), ("Q4_K", 640, 1024), ("Q8_0", 262144, 640),                # Gemma 3
    ("F16", 4096, 4096), ("BF16", 4096, 4096), ("F32", 4096, 4096), ("Q5_1", 4096, 4096),
] + [(t, r, c) for t in ("Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_XS", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
                          "TQ2_0", "TQ1_0", "MXFP4", "NVFP4", "IQ2_XXS", "IQ3_XXS", "IQ2_XS", "IQ2_S", "IQ3_S",
                          "IQ1_S", "IQ1_M", "Q1_0", "Q2_0")
     for r, c in ((14336, 4096), (4096, 14336))]     # an 8B's FFN (gate/up, down): the bandwidth marks


def _now() -> float:
    return time.perf_counter()


def _sync(engine: Engine) -> None:
    engine.device.read_sync(engine.scratch.ids, 0, 4)


def _engine(device, path, header, cfg, **kw) -> Engine:
    """A native engine of the file at `path` with its config (built once, from_gguf) and the few tensors it reads as
    values (llama 3's rope_freqs) passed as `lab generate` passes them."""
    return Engine(device, header, cfg, host_values=read_host_values(path, header, cfg), **kw)


def within_model(contexts, n_ctx_train: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept, skipped): the decode contexts up to the model's own (`n_ctx_train`, its context_length) and those past
    it, which the bench skips as scripts/device_llamacpp.sh skips llama-bench's depths past it. A context at the
    limit runs: its timed decode steps go up to 2 x decode + 18 positions past it (bench_model's n_ctx), as
    llama-bench's at `-d` the limit go n_gen past it (its context is depth + n_gen: llama.cpp warns and runs)."""
    return tuple(c for c in contexts if c <= n_ctx_train), tuple(c for c in contexts if c > n_ctx_train)


def gpu_memory(device, file_weight_bytes: int, buffers=None) -> dict:
    """The GPU memory the lab holds (MB): the device's peak over the run, and what `buffers` (default: every live
    one) hold now, by kind. Weights are resident once: the stacked QKV and gate/up rows are the file's own bytes
    moved, so `weights` equals the file's tensor bytes (`file_weights`)."""
    mb = lambda n: round(n / 1e6, 1)
    held = device.buffers if buffers is None else buffers
    live = lambda pred: sum(b.size for b in held if pred(b))
    kv = lambda b: b.label.startswith(("k cache", "v cache"))
    return {"peak": mb(device.peak_bytes), "weights": mb(live(lambda b: b.kind == gpu.WEIGHTS)),
            "file_weights": mb(file_weight_bytes), "kv_cache": mb(live(kv)),
            "scratch_and_other": mb(live(lambda b: b.kind != gpu.WEIGHTS and not kv(b)))}


def bench_model(path, *, prompts=(128, 512), contexts=(0, 512, 2048), decode_tokens=32, max_batch=None,
                disable=(), seed=0, warm_gpu_s: float = 0, kv: str = "f32") -> dict:
    """`warm_gpu_s`: the GPU kept busy that long before each timed prefill and decode (lab.instruments.profile.warm).
    `kv`: the KV cache's element type (Engine's kv: "f32" or "f16").
    Contexts past the model's own are skipped with a line on stderr (`within_model`), listed as "skipped_contexts"."""
    header = gguf.read_file(path)
    cfg = from_gguf(header)
    contexts, skipped = within_model(contexts, cfg.n_ctx_train)
    for c in skipped:
        print(f"lab bench: context {c:,} skipped: past the model's own context of {cfg.n_ctx_train:,} tokens "
              f"(its context_length)", file=sys.stderr)
    device = open_native(disable=tuple(disable))
    # the KV cache: each context's prompt, then the chat's decode, one by one, and _decode_split's steps
    n_ctx = max(max(contexts, default=0) + 2 * decode_tokens + 18, max(prompts) + 1)
    t0 = _now()
    engine = _engine(device, path, header, cfg, n_ctx=n_ctx, kv=kv, **({"max_batch": max_batch} if max_batch else {}))
    t1 = _now()
    nbytes = engine.weights.upload_file(path)
    _sync(engine)
    t2 = _now()
    rng = random.Random(seed)
    vocab = engine.cfg.n_vocab
    out = {"model": str(path), "arch": engine.cfg.arch, "adapter": device.info.name,
           "features": sorted(device.info.features), "weight_bytes": nbytes, "build_s": round(t1 - t0, 3),
           "upload_s": round(t2 - t1, 3), "load_mb_s": round(nbytes / 1e6 / (t2 - t1), 1),
           "max_batch": engine.max_batch, "dispatches_per_decode_token": engine.dispatches_per_step(1),
           "dispatches_per_decode_token_past_whole": engine.dispatches_per_step(1, pos=engine.whole_keys),
           "compute_passes_per_decode_token": 1, "warm_gpu_s": warm_gpu_s, "n_ctx": n_ctx, "kv_type": kv,
           "n_ctx_train": cfg.n_ctx_train, "skipped_contexts": list(skipped), "prefill": {}, "decode": {}}

    def prefill(n: int) -> float:
        ids = [rng.randrange(vocab) for _ in range(n)]
        t = _now()
        for pos in range(0, n, engine.max_batch):
            engine.step(ids[pos:pos + engine.max_batch], pos)
        _sync(engine)
        return _now() - t

    def warm() -> None:
        if warm_gpu_s:
            asyncio.run(profile.warm(engine, warm_gpu_s * 1e3))

    prefill(min(prompts))                        # warm-up: pipelines compiled, caches hot
    for n in prompts:
        warm()
        s = prefill(n)
        out["prefill"][n] = {"tok_s": round(n / s, 1), "ttft_ms": round(s * 1e3, 1)}
        if "timestamp-query" in device.info.features and n <= engine.max_batch:   # the step alone, on the GPU
            out["prefill"][n]["gpu_step_ms"] = round(asyncio.run(profile.whole_step(engine, n, 0)) * 1e3, 3)
    for c in contexts:
        # as the chat runs it (lab.engine.session: greedy steps AHEAD at a time, one read-back per block)
        session = Session(engine, None)
        prompt = [rng.randrange(vocab) for _ in range(max(c, 1))]
        warm()
        res = asyncio.run(session.generate(prompt, Settings(greedy=True), decode_tokens + 1))
        s = res.decode_s / res.decode_steps
        # and one step, one read-back at a time: what the blocks buy
        pos = len(session.cached)
        t = _now()
        for i in range(decode_tokens):
            engine.step(None, pos + i)
            _sync(engine)
        s1 = (_now() - t) / decode_tokens
        out["decode"][c] = {"tok_s": round(1 / s, 1), "ms_per_token": round(s * 1e3, 3),
                            "weight_gb_s": round(nbytes / s / 1e9, 1), "one_by_one_tok_s": round(1 / s1, 1),
                            **_decode_split(engine, pos + decode_tokens)}
    out["peak_host_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["gpu_memory_mb"] = gpu_memory(device, nbytes)
    engine.close()
    return out


def _decode_split(engine: Engine, pos: int, n: int = 8) -> dict:
    """Where a decode step's time goes: the CPU's share (write the step, encode the pass, submit) and the
    GPU's (one pass, by timestamp queries where the adapter has them). Steps at pos, pos+1, ..."""
    t = _now()
    for i in range(n):
        engine.step(None, pos + i)
    cpu = (_now() - t) / n
    _sync(engine)
    out = {"cpu_submit_ms": round(cpu * 1e3, 3)}
    if "timestamp-query" in engine.device.info.features and hasattr(engine.device, "time_pass"):
        out["gpu_pass_ms"] = round(asyncio.run(profile.whole_step(engine, 1, pos + n, reps=n)) * 1e3, 3)
    return out


def profile_step(path, *, t: int = 1, context: int = 0, max_batch: int | None = None, disable=(),
                 warm_gpu_s: float = 0, kv: str = "f32") -> list[dict]:
    """GPU time of one step of t tokens (1: decode, more: prefill) by kernel family (lab.instruments.profile), after warm_gpu_s
    of GPU work, with a KV cache of element type `kv`."""
    header = gguf.read_file(path)
    device = open_native(disable=tuple(disable))
    pos = max(context, 1) if t == 1 else context
    engine = _engine(device, path, header, from_gguf(header), n_ctx=pos + t + 16, max_batch=max(t, max_batch or 1),
                     kv=kv)
    if warm_gpu_s:
        asyncio.run(profile.warm(engine, warm_gpu_s * 1e3))
    profile.prime(engine, t, pos)
    out = asyncio.run(profile.by_family(engine, t, pos))
    engine.close()
    return out


def _kernel_time(device, plan, y, reps: int, timestamps: bool) -> float:
    """Seconds one of the `reps` dispatches of `plan` takes: GPU time of the pass by timestamp queries (no submit or
    read-back in the figure), else the wall clock around a submit and a read-back."""
    device.run(plan)
    device.read_sync(y, 0, 4)
    if timestamps:
        return asyncio.run(profile.median_pass(device, plan, reps=5)) / reps
    t0 = _now()
    device.run(plan)
    device.read_sync(y, 0, 4)
    return (_now() - t0) / reps


def bench_kernels(shapes=KERNEL_SHAPES, repeat: int = 20, tokens: int = 64, disable=(), wgs=(None,)) -> list[dict]:
    """Matvec GB/s (weight bytes / time) and prefill GEMM GFLOP/s for each (type, rows, cols) and matvec workgroup
    size of `wgs` (None: lab.ops.matmul.matvec_wg's choice): `repeat` dispatches of one kernel in one pass, timed by
    timestamp queries where the adapter has them (else by the wall clock around submit and read-back, which small
    shapes then cannot amortize)."""
    import numpy as np

    from lab.format.ggml import BY_NAME
    from lab.gpu.shaders import KernelCache
    from lab.host.synthetic.releases import random_blocks
    from lab.ops.matmul import matmul, matvec, matvec_wg
    from lab.ops.weights import alloc_weight, upload_weight
    device = open_native(disable=tuple(disable))
    timestamps = "timestamp-query" in device.info.features
    kc = KernelCache(device)
    step = ops.make_step(device)
    rng = np.random.default_rng(0)
    rows_out = []
    for type_name, rows, cols in shapes:
        t = BY_NAME[type_name]
        if type_name in ("F16", "BF16"):
            raw = rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
            if type_name == "BF16":
                raw = (rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(
                    np.uint16).view(np.uint8)
        else:
            raw = random_blocks(type_name, rows, cols, rng)
        w = alloc_weight(device, f"bench {type_name} {rows}x{cols}", t, rows, cols)
        upload_weight(device, w, raw.tobytes())
        x = device.buffer(4 * cols * tokens, gpu.CONVERSATION, "x")
        y = device.buffer(4 * rows * tokens, gpu.CONVERSATION, "y")
        device.write(x, rng.standard_normal(cols * tokens).astype(np.float32).tobytes())
        device.run([], writes=[(step, 0, ops.step_bytes(0, tokens, 1))])
        mm = [op.at(tokens) for op in matmul(device, kc, w, x, y, step, max_tokens=tokens)] * max(1, repeat // 4)
        gemm = None
        for wg in wgs:
            mv = [op.at(1) for op in matvec(device, kc, w, x, y, step, wg=wg)] * repeat
            res = {"type": type_name, "rows": rows, "cols": cols, "weight_bytes": w.rows * w.row_bytes,
                   "wg": wg or matvec_wg(cols, rows, device.info.software, type_name, device.info.swiftshader)}
            s = _kernel_time(device, mv, y, repeat, timestamps)
            res["matvec_us"] = round(s * 1e6, 1)
            res["matvec_gb_s"] = round(res["weight_bytes"] / s / 1e9, 2)
            if gemm is None:    # the GEMM does not depend on the matvec's workgroup: timed once
                gemm = _kernel_time(device, mm, y, max(1, repeat // 4), timestamps)
            res["matmul_us"] = round(gemm * 1e6, 1)
            res["matmul_gflop_s"] = round(2 * rows * cols * tokens / gemm / 1e9, 1)
            rows_out.append(res)
        for b in (x, y, *(p.buffer for p in w.parts)):
            device.destroy(b)
    return rows_out
