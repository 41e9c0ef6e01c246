"""The 2026 architectures held to llama.cpp over longer runs (tests/fixtures/long/<spec>.json, from
scripts/make_long_fixtures.py): on the synthetic F32 lfm2, qwen35, smollm3 and gemma4 files, natively (lavapipe), 48
greedy ids after each of three prompts, and a two-turn chat whose second turn reuses what the first left (KV rows, and
a hybrid's conv rings and delta-net states) and must still give llama.cpp's 48 ids, which llama.cpp computed from a
fresh context over the whole second prompt. Compared up to llama.cpp's first near-tie (top-2 gap under NEAR_TIE: F32
on both sides, summation order apart; gemma's f16 GELU table moves its logits by up to 5e-3) or an end-of-generation
id (where a turn stops); a prompt whose first steps are near-ties counts for little, so at least two of the three must
compare 40 ids or more. The page runs the same: tests/browser/test_arch_page.py. The three prompts run with --slow
(about 50 s a spec on lavapipe on a slow day: 3 minutes of the default run); the two-turn chat, 48 ids a turn, runs by
default."""

from __future__ import annotations

import asyncio
import json

import pytest

from lab.engine.engine import Engine, read_host_values
from lab.engine.load import validate
from lab.engine.session import Session
from lab.format import gguf
from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from lab.settings import Settings
from tests.conftest import FIXTURES, LONG_SPECS

NEAR_TIE = 0.01
SPECS = LONG_SPECS


def fixture(spec: str) -> dict:
    return json.loads((FIXTURES / "long" / f"{spec}.json").read_text())


def compared(got: list[int], want: list[int], gaps: list[float], eog=frozenset()) -> int:
    """How many leading ids must agree: up to llama.cpp's first near-tie, and through an end-of-generation id."""
    n = next((i for i, g in enumerate(gaps) if g < NEAR_TIE), len(want))
    stop = next((i for i, t in enumerate(want[:n]) if t in eog), None)
    return n if stop is None else stop


@pytest.fixture(scope="module", params=SPECS)
def made(request, device):
    path = synthetic_arch.build(request.param, "f32", cache_dir() / "synthetic")
    header = gguf.read_file(path)
    cfg, tok = validate(header)
    eng = Engine(device, header, cfg, n_ctx=192, host_values=read_host_values(path, header, cfg))
    eng.weights.upload_file(path)
    yield request.param, eng, tok
    eng.close()


@pytest.mark.slow
def test_48_greedy_ids_after_each_of_three_prompts(made):
    spec, eng, _ = made
    long = 0
    for p in fixture(spec)["prompts"]:
        ids, out = p["prompt_ids"], []
        eng.step(ids, 0)
        for i in range(len(p["greedy"])):
            out.append(asyncio.run(eng.argmax()))
            if i + 1 < len(p["greedy"]):
                eng.step(None, len(ids) + i)
        n = compared(out, p["greedy"], p["top2_gap"])
        long += n >= 40
        assert out[:n] == p["greedy"][:n], (spec, p["text"])
    assert long >= 2, spec


def test_a_two_turn_chat_reuses_the_states_and_is_llama_cpps(made):
    spec, eng, tok = made
    chat = fixture(spec)["chat"]
    session = Session(eng, tok)
    r1 = asyncio.run(session.generate(chat["turn1_ids"], Settings(greedy=True), len(chat["turn1_greedy"])))
    n1 = compared(r1.ids, chat["turn1_greedy"], chat["turn1_gaps"], tok.eos_ids)
    assert r1.ids[:n1] == chat["turn1_greedy"][:n1] and n1 == len(chat["turn1_greedy"]), (spec, r1.ids)
    r2 = asyncio.run(session.generate(chat["turn2_ids"], Settings(greedy=True), len(chat["turn2_greedy"])))
    # the second turn ran only what the first did not: its own text (and, for qwen35, what followed the snapshot)
    assert r2.reused >= len(chat["turn1_ids"]) and r2.prefilled == len(chat["turn2_ids"]) - r2.reused, (spec, r2.reused)
    n2 = compared(r2.ids, chat["turn2_greedy"], chat["turn2_gaps"], tok.eos_ids)
    assert n2 >= 40 and r2.ids[:n2] == chat["turn2_greedy"][:n2], (spec, n2, r2.ids[:n2], chat["turn2_greedy"][:n2])
