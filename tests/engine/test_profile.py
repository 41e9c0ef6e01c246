"""`lab bench --profile` and the page's `profile` message (lab/instruments/profile.py): a step's GPU time by kernel family, from
timestamp queries. Speeds are never asserted; what is: the families partition the step's dispatches exactly (none
lost, none counted twice), every timed pass took GPU time, and the labels drop only the tuning constants."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from lab.engine.engine import Engine, EngineError, read_host_values
from lab.format import gguf
from lab.format.model import from_gguf
from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from lab.instruments import profile


def test_family_keeps_what_changes_the_function_only():
    assert profile.family("matvec:main WG=64 DQ=2 ACT=silu BIAS=// IN=in_norm") == \
        "matvec:main ACT=silu BIAS=// IN=in_norm"
    assert profile.family("attention:decode_whole SG=1") == "attention:decode_whole"


@pytest.fixture(scope="module")
def engine(device):
    if "timestamp-query" not in device.info.features:
        pytest.skip("this adapter has no timestamp queries")
    path = synthetic_arch.build("llama3", "f32", cache_dir() / "synthetic")
    header = gguf.read_file(path)
    cfg = from_gguf(header)
    eng = Engine(device, header, cfg, n_ctx=64, max_batch=16, host_values=read_host_values(path, header, cfg))
    eng.weights.upload_file(path)
    rng = random.Random(0)
    eng.step([rng.randrange(cfg.n_vocab) for _ in range(16)], 0)
    yield eng
    eng.close()


@pytest.mark.parametrize("t,pos", [(16, 0), (1, 20)], ids=["prefill", "decode"])
def test_families_partition_the_step_and_each_took_gpu_time(engine, t, pos):
    rows = asyncio.run(profile.by_family(engine, t, pos, reps=3))
    whole, fams = rows[0], rows[1:]
    assert whole["family"] == "whole step"
    assert whole["dispatches"] == engine.dispatches_per_step(t, pos=pos)
    assert sum(r["dispatches"] for r in fams) == whole["dispatches"]
    assert len({r["family"] for r in fams}) == len(fams)
    assert any(r["family"].startswith("matmul" if t > 1 else "matvec") for r in fams)
    assert all(r["gpu_us"] > 0 for r in rows), rows
    assert asyncio.run(profile.whole_step(engine, t, pos, reps=3)) > 0


def test_warm_keeps_the_gpu_busy_for_its_time(engine):
    """`--warm-gpu` (lab bench, both backends): steps back to back until the time is up, each one awaited."""
    t0 = time.perf_counter()
    steps = asyncio.run(profile.warm(engine, 300))
    assert steps >= 1 and time.perf_counter() - t0 >= 0.3
    assert asyncio.run(profile.warm(engine, 0)) == 0


@pytest.mark.parametrize("spec", ["llama3", "lfm2", "qwen35"])
def test_a_step_past_the_states_is_primed_and_timed(device, spec):
    """The page's bench times a decode at a context after its 512-token prefill: on a hybrid (lfm2's short-conv
    states; qwen35's conv and delta-net states), a step at that position is refused (the states hold 32, not 12: a
    recurrent state cannot be cut back at all, and a conv ring of 18 rows no further than 16), so `prime` fills the ids
    by a step at 0 and the plan at the position is timed on the states as they are; a step past the context is refused
    as a chat's would be. The page's own path: tests/browser/test_hybrid_page.py test_the_bench_profile_of_a_hybrid."""
    if "timestamp-query" not in device.info.features:
        pytest.skip("this adapter has no timestamp queries")
    path = synthetic_arch.build(spec, "f32", cache_dir() / "synthetic")
    header = gguf.read_file(path)
    cfg = from_gguf(header)
    eng = Engine(device, header, cfg, n_ctx=64, max_batch=32, host_values=read_host_values(path, header, cfg))
    try:
        eng.weights.upload_file(path)
        asyncio.run(profile.warm(eng, 1))               # 32-token steps at 0: the states hold 32
        if cfg.recurrent:
            with pytest.raises(EngineError, match="cannot be cut back"):
                eng.step([1], 12)
        profile.prime(eng, 1, 12)
        rows = asyncio.run(profile.by_family(eng, 1, 12, reps=2))
        assert rows[0]["dispatches"] == eng.dispatches_per_step(1, pos=12) and all(r["gpu_us"] > 0 for r in rows)
        with pytest.raises(EngineError, match="past the context"):
            profile.prime(eng, 1, 64)
    finally:
        eng.close()
