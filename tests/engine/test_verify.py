"""The verification card natively (lab/instruments/verify.py through lab/host/verify_native.py on wgpu-py): the fixed prompt of
each model's reference prefilled through the engine, and its final logits and 16-token greedy continuation (decode
steps reading the prefill's KV cache) compared with llama.cpp's (reference/, scripts/make_verify_fixtures.py).

Against exact arithmetic (llama.cpp on an F32 copy, F32 KV cache) every verdict must pass: max |diff| and RMS within
1e-3 of the logits' own magnitude (measured ~1e-5 on SmolLM2: only the f32 summation order differs), the same argmax,
the same 16 tokens. Against llama.cpp's quantized CPU path the max |diff| must stay under the loose bound and the
argmax agree (its top-2 gap is far from a near-tie for these prompts); the continuation is compared and reported.
Each model takes a minute or two on lavapipe (a prefill and 17 decode steps plus the load): qwen2.5 and gemma3 run with
--slow. The kernel fixtures (reference/kernels.json) run here too, through the same pure-Python comparison as the
worker's.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from lab.host.verify_native import verify_file, verify_kernels
from lab.instruments import verify

MODELS = [pytest.param("smollm2", "smollm2_path"),
          pytest.param("qwen2.5", "qwen_path", marks=pytest.mark.slow),
          pytest.param("gemma3", "gemma_path", marks=pytest.mark.slow),
          # the hybrids, on their synthetic F32 files (the replay's decode steps carry their conv and recurrent states)
          pytest.param("lfm2", "lfm2_path"),
          pytest.param("qwen35", "qwen35_path")]


@pytest.fixture
def lfm2_path():
    from lab.host.synthetic import arch as synthetic_arch
    from lab.host.models import cache_dir
    return synthetic_arch.build("lfm2", "f32", cache_dir() / "synthetic")


@pytest.fixture
def qwen35_path():
    from lab.host.synthetic import arch as synthetic_arch
    from lab.host.models import cache_dir
    return synthetic_arch.build("qwen35", "f32", cache_dir() / "synthetic")


@pytest.mark.parametrize("name,path_fixture", MODELS)
def test_replay_matches_llama_cpp(name, path_fixture, device, request):
    path = request.getfixturevalue(path_fixture)
    result = asyncio.run(verify_file(device, path))
    assert result is not None, f"no reference for {path.name}'s content: regenerate reference/"
    assert result["model"] == name
    rows = {(r["reference"], r["check"]): r for r in result["rows"]}
    for r in result["rows"]:
        print(f"{name} {r['reference']:5} {r['check']:10} {r['value']:60} {r['verdict']}", file=sys.stderr)
    print(f"{name}: replay {result['replay_s']} s, compare {result['compare_s']} s", file=sys.stderr)
    for check in ("max |diff|", "RMS diff", "argmax", "greedy 16"):
        assert rows[("exact", check)]["verdict"] == "pass", rows[("exact", check)]
    mx = rows[("exact", "max |diff|")]["number"]
    assert mx < 1e-3 * 40, mx                                  # logits here are at most ~40 in magnitude
    assert rows[("exact", "argmax")]["number"] == 1.0
    assert rows[("exact", "greedy 16")]["number"] == 16.0
    assert rows[("quant", "max |diff|")]["verdict"] == "pass"
    assert rows[("quant", "max |diff|")]["number"] <= verify.QUANT_MAX
    assert rows[("quant", "argmax")]["verdict"] == "pass"
    assert rows[("quant", "greedy 16")]["verdict"] in ("pass", "reported")
    assert result["ok"]


def test_kernel_fixtures_natively(device):
    before = len(device.buffers)
    rows = asyncio.run(verify_kernels(device))
    assert len(device.buffers) == before, "the kernel checks left buffers behind"
    bad = [(r["name"], r["error"], r["tolerance"]) for r in rows if not r["pass"]]
    assert not bad, bad
    assert len(rows) >= 20


def test_replay_leaves_the_chat_alone(device, smollm2_path):
    """A turn, the card's run, the same turn again: the same greedy ids. The replay overwrote the KV cache; without the
    session's reset the second turn would reuse all but the last prompt token of that overwritten cache."""
    from lab.engine.engine import Engine
    from lab.engine.session import Session
    from lab.format import gguf
    from lab.host.verify_native import _read, index
    from lab.settings import Settings
    from lab.text import chat
    from lab.text.tokenizer import from_metadata
    header = gguf.read_file(smollm2_path)
    tok = from_metadata(header.metadata)
    engine = Engine(device, header, n_ctx=256)
    try:
        engine.weights.upload_file(smollm2_path)
        session = Session(engine, tok)
        prompt = chat.render_chat(tok, header.metadata, [{"role": "user", "content": "What is the capital of France?"}])

        async def flow():
            first = await session.generate(prompt, Settings(greedy=True), 4)
            entry = verify.find(index(), verify.file_content_hash(smollm2_path))
            result = await verify.run(engine, tok, entry, _read, chat_session=session)
            again = await session.generate(prompt, Settings(greedy=True), 4)
            return first, result, again
        first, result, again = asyncio.run(flow())
        assert result["ok"]
        assert again.reused == 0 and again.prefilled == len(prompt)
        assert again.ids == first.ids, (first.ids, again.ids)
    finally:
        engine.close()
