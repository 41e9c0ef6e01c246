"""The forward pass defends itself: weights holding NaN or infinity never turn into a token id, and generation
stops with a message that names the first tensor where the values broke (found by replaying the step traced).

The files are the small synthetic Llama 3 in Q8_0 (tests/conftest.py `tiny`: SmolLM2's vocabulary and chat template)
with the f16 scales of a few blocks of one tensor overwritten (tests/conftest.py: poisoned_copy): the header is fine,
the weights are not, as with a bad conversion."""

from __future__ import annotations

import asyncio

import pytest

from lab.engine.engine import EngineError
from lab.engine.session import Session
from lab.format import gguf
from lab.settings import Settings
from lab.text import chat
from lab.text.tokenizer import from_metadata
from tests.conftest import F16_INF, F16_NAN, native_engine, poisoned_copy, tiny

N_CTX = 128


@pytest.fixture(scope="module")
def q8():
    return tiny("q8_0")


def _generate(device, path, settings):
    header = gguf.read_file(path)
    tok = from_metadata(header.metadata)
    eng = native_engine(device, path, n_ctx=N_CTX)
    try:
        session = Session(eng, tok)
        prompt = chat.render_chat(tok, header.metadata, [{"role": "user", "content": "Hi"}])
        return asyncio.run(session.generate(prompt, settings, 4)), session
    finally:
        eng.close()


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_nan_weights_stop_generation_naming_the_layer(device, q8, tmp_path, greedy):
    bad = poisoned_copy(q8, tmp_path / "nan.gguf", "blk.2.ffn_down.weight", F16_NAN)
    with pytest.raises(EngineError, match=r"all NaN or infinite.*first non-finite values appear in l_out-2\b"):
        _generate(device, bad, Settings(greedy=greedy, seed=1))


def test_infinite_embeddings_are_named_at_the_input(device, q8, tmp_path):
    # the first 64 blocks of token_embd are the rows of ids 0-7; the chat template opens with <|im_start|> (id 1)
    bad = poisoned_copy(q8, tmp_path / "inf.gguf", "token_embd.weight", F16_INF)
    with pytest.raises(EngineError, match=r"first non-finite values appear in (inp_embd|attn_norm-0)\b"):
        _generate(device, bad, Settings(greedy=True))


def test_the_same_file_unpoisoned_generates(device, q8, tmp_path):
    ok = poisoned_copy(q8, tmp_path / "ok.gguf", "blk.2.ffn_down.weight", blocks=0)
    result, _ = _generate(device, ok, Settings(greedy=True))
    assert result.ids and all(0 <= i < 49152 for i in result.ids)
