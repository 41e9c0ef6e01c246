"""Fuzzing the tokenizers of the three real models (Hypothesis) with arbitrary Unicode: lone surrogates (text
from JavaScript), NUL, invalid UTF-8 bytes read from a file (`lab tokenize` reads with surrogateescape),
special-token spellings, whitespace runs, digits, every script.

Properties, for any str s:
* encode(s) never raises, gives ids in 0..n_vocab-1 and never a control token (special parsing is off);
* where the vocabulary has a token for every byte of s's UTF-8 (qwen2.5 and gemma3: always), decode(encode(s))
  == s, after the two documented changes: a lone surrogate becomes U+FFFD (as llama.cpp does with invalid
  UTF-8), and for SentencePiece (gemma3) U+2581 decodes as a space (it is SentencePiece's own spelling of
  one). SmolLM2's byte-level vocabulary has no token for the bytes 0x04 0x06 0x13 0x14 0x16 0x1D and the
  lead bytes 0xF1 0xF2 (planes 4-11): such characters are dropped, as llama.cpp drops them;
* the stream decoder, fed the ids one at a time, gives the same text; piece() works on every id given.

Settings: tests/unit/fuzzkit.py (LAB_FUZZ_EXAMPLES=N for a deep run).
"""

from __future__ import annotations

import functools

from hypothesis import event, given
from hypothesis import strategies as st

from lab.text.tokenizer import Tokenizer, from_metadata
from lab.text.tokenizer.base import clean_text
from lab.text.tokenizer.bpe import BYTE_TO_CHAR
from tests.unit.fuzzkit import fuzz_settings, real_metadata

MODELS = ["smollm2", "qwen2.5", "gemma3"]
SPELLINGS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>",
             "<pad>", "<0x41>", "<unused0>", "<tool_call>", "[multimodal]", "<mask>", "\u2581", "\u0120", "\u010a",
             "\x00", "\ufffd", "\ufeff", "\u200d", "\r\n", "\r", "\n\n\n", "\t \t", "  ", "'s", "'LL", "1234567",
             "\U0001F468\u200d\U0001F469", "\ud800", "\udc80", "\udfff", "é", "e\u0301", "日本語", "\u0645\u0631"]


@functools.cache
def tokenizer(name: str) -> Tokenizer:
    return from_metadata(real_metadata(name))


# Any code point (surrogates included), the spellings above, and files with invalid UTF-8.
CHARS = st.one_of(st.characters(codec=None, exclude_categories=()), st.characters(categories=["Cs"]),
                  st.characters(max_codepoint=0x7F), st.sampled_from(SPELLINGS))
TEXT = st.one_of(st.lists(CHARS, max_size=40).map("".join),
                 st.binary(max_size=60).map(lambda b: b.decode("utf-8", "surrogateescape")))


@functools.cache
def bytes_without_token(name: str) -> frozenset[int]:
    tok = tokenizer(name)
    if tok.model != "gpt2":
        return frozenset()           # SentencePiece: <0x00>..<0xFF> are required at load (lab.text.tokenizer.spm)
    return frozenset(b for b in range(256) if BYTE_TO_CHAR[b] not in tok.token_to_id)


def expected(tok: Tokenizer, s: str) -> str:
    s = clean_text(s)
    return s.replace("\u2581", " ") if tok.model == "llama" else s


@fuzz_settings(300)
@given(name=st.sampled_from(MODELS), s=TEXT)
def test_encode_decode_round_trip(name, s):
    tok = tokenizer(name)
    ids = tok.encode(s)
    assert all(type(i) is int and 0 <= i < tok.vocab_size for i in ids)
    assert not [i for i in ids if tok.is_control(i)], [tok.tokens[i] for i in ids if tok.is_control(i)]
    if bytes_without_token(name).isdisjoint(clean_text(s).encode()):
        assert tok.decode(ids) == expected(tok, s)
    else:
        event("a byte without a token")
    dec = tok.stream_decoder()
    assert "".join(dec.feed(i) for i in ids) + dec.flush() == tok.decode(ids)
    for i in ids:
        tok.piece(i)
    with_bos = tok.encode(s, add_bos=True)
    assert with_bos == ([tok.bos_id] if tok.bos_id is not None else []) + ids


@fuzz_settings(200)
@given(name=st.sampled_from(MODELS), s=TEXT)
def test_special_parsing_on_stays_in_the_vocabulary(name, s):
    """The chat template's own text is parsed with special tokens on: still total, still in range."""
    tok = tokenizer(name)
    ids = tok.encode_segments([(s, True)])
    assert all(0 <= i < tok.vocab_size for i in ids)
    if bytes_without_token(name).isdisjoint(clean_text(s).encode()):
        assert tok.decode(ids, special=True) == expected(tok, s)


@fuzz_settings(200)
@given(name=st.sampled_from(MODELS), ids=st.lists(st.integers(0, 1 << 18), max_size=30))
def test_any_ids_decode(name, ids):
    """Any id sequence a sampler can produce decodes; partial UTF-8 sequences become U+FFFD, never an error."""
    tok = tokenizer(name)
    ids = [i % tok.vocab_size for i in ids]
    text = tok.decode(ids)
    dec = tok.stream_decoder(special=True)
    streamed = "".join(dec.feed(i) for i in ids) + dec.flush()
    assert streamed == tok.decode(ids, special=True)
    assert isinstance(text, str)
