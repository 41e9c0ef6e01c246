"""A trained vocabulary written into a GGUF (`tokenizer.ggml.*`, lab/host/tokenizer_gguf.py) tokenizes as llama.cpp
tokenizes it: tests/fixtures/trained_tokenizer.json holds llama.cpp's ids (scripts/make_trained_tokenizer_fixture.py,
llama-cpp-python, not in CI) for vocabularies trained on the same text; here the lab trains them again, checks it
made the same merges, writes the GGUF, reads it back with lab.format.gguf and encodes the same texts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from lab.format import gguf
from lab.host.tokenizer_gguf import write_vocab_gguf
from lab.text.tokenizer import from_metadata
from lab.text.tokenizer.train import train

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "trained_tokenizer.json").read_text(encoding="utf-8"))
CORPUS = [(ROOT / "tests" / "fixtures" / "constitution.txt").read_text(encoding="utf-8")[:FIXTURE["corpus_chars"]],
          FIXTURE["corpus_extra"]]


@pytest.mark.parametrize("entry", FIXTURE["vocabularies"], ids=lambda e: f"{e['pre']}-{e['vocab']}")
def test_the_trained_gguf_tokenizes_as_llama_cpp(entry, tmp_path):
    trained = train(CORPUS, entry["vocab"], pre=entry["pre"])
    merges = "\n".join(f"{a} {b}" for a, b in trained.merges).encode()
    assert hashlib.sha256(merges).hexdigest() == entry["merges_sha256"], "the trainer made other merges"
    path = write_vocab_gguf(trained, tmp_path / "vocab.gguf")
    md = gguf.read_file(path).metadata
    assert md["tokenizer.ggml.tokens"] == trained.tokens and md["tokenizer.ggml.pre"] == entry["pre"]
    tok = from_metadata(md)
    for case in entry["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        assert tok.decode(case["ids"]) == case["text"]
