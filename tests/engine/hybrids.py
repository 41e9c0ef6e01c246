"""What the newer architectures' engine tests share (test_hybrid.py for lfm2, test_qwen35.py, test_gemma4.py): an engine
on a device of its own over a synthetic F32 file, the prompt, a greedy turn, and every traced tensor of a prefill and
the decode step after it against the numpy reference."""

from __future__ import annotations

import asyncio

import numpy as np

from lab.engine.engine import Engine
from lab.engine.load import validate
from lab.engine.session import Session
from lab.format import gguf
from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from lab.host.native import open_native
from lab.host.reference import Reference
from lab.settings import Settings

TRACE_TOL = 1e-4        # relative to the tensor's largest |value|: f32 summation order (measured ~1e-6)
TEXT = ("The old lighthouse keeper climbed the stairs every evening, counting the steps: one hundred and twelve. "
        "Nobody knew why he still did it.")


def run(coro):
    return asyncio.run(coro)


def synthetic(spec: str):
    return synthetic_arch.build(spec, "f32", cache_dir() / "synthetic")


def engine_on(path, n_ctx: int):
    """(engine, tokenizer) on a device of its own, so that Forget's registry holds this engine's buffers only."""
    header = gguf.read_file(path)
    cfg, tok = validate(header)
    eng = Engine(open_native(), header, cfg, n_ctx=n_ctx, logits_all=True)
    eng.weights.upload_file(path)
    return eng, tok


def prompt_ids(tok) -> list[int]:
    return tok.encode(TEXT, add_bos=tok.add_bos)


def greedy_chat(eng, tok, prompt, n, session=None):
    session = session or Session(eng, tok)
    return session, run(session.generate(prompt, Settings(greedy=True), n))


def traced_names_matching_the_reference(eng, tok, path) -> set[str]:
    """Prefill from 0 and then one decode step, every traced tensor of both against the numpy reference (its own
    states carried between the two calls, as the engine's are); returns the names compared."""
    ids = prompt_ids(tok)
    ref = Reference(path)
    ref.forward(ids[:-1], trace=True)
    want_prefill = dict(ref.trace)
    ref.forward(ids[-1:], start_pos=len(ids) - 1, trace=True)
    want_decode = dict(ref.trace)
    names = set()
    u32 = {tr.name for tr in eng.plan_for(True).trace if tr.dtype == "u32"}    # the chosen experts: equal, id for id
    for got, want in ((run(eng.traced(ids[:-1], 0)), want_prefill),
                      (run(eng.traced(ids[-1:], len(ids) - 1)), want_decode)):
        for name, raw in got.items():
            if name in u32:
                assert np.array_equal(np.frombuffer(raw, np.uint32), np.asarray(want[name]).reshape(-1)), name
                names.add(name)
                continue
            w = np.asarray(want[name], np.float32).reshape(-1)
            g = np.frombuffer(raw, np.float32)
            if name in ("result_output", "result_norm"):
                w = w[-len(g):]             # the engine's head row(s) are the reference's last
            err = float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30))
            assert err <= TRACE_TOL, f"{name}: {err:.3g}"
            names.add(name)
    return names
