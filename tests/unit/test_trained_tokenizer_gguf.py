"""A trained vocabulary written into a GGUF (`tokenizer.ggml.*`, `TrainedBPE.gguf()` through lab/format/writer.py,
standard library only so that the page's worker writes it too) tokenizes as llama.cpp tokenizes it:
tests/fixtures/trained_tokenizer.json holds llama.cpp's ids (scripts/make_trained_tokenizer_fixture.py,
llama-cpp-python, not in CI) for vocabularies trained on the same text; here the lab trains them again, checks it
made the same merges, writes the GGUF, reads it back with lab.format.gguf and encodes the same texts. The file's bytes
are gguf-py's GGUFWriter's for the same keys (the writer llama.cpp's own converters use), so what llama.cpp opened from
one it opens from the other."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from lab.format import gguf
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
    path = tmp_path / "vocab.gguf"
    path.write_bytes(trained.gguf())
    md = gguf.read_file(path).metadata
    assert md["tokenizer.ggml.tokens"] == trained.tokens and md["tokenizer.ggml.pre"] == entry["pre"]
    tok = from_metadata(md)
    for case in entry["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        assert tok.decode(case["ids"]) == case["text"]


def gguf_py_vocab(trained, path) -> bytes:
    """The same vocabulary through gguf-py's GGUFWriter, key by key (the oracle; gguf-py needs numpy, so the lab's
    own writer stands in for it wherever the page runs)."""
    import gguf as gguf_py
    md = trained.metadata()
    w = gguf_py.GGUFWriter(str(path), "llama")
    w.add_name("llm-lab trained tokenizer (vocabulary only)")
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    w.add_tokenizer_pre(md["tokenizer.ggml.pre"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_types(md["tokenizer.ggml.token_type"])
    w.add_token_merges(md["tokenizer.ggml.merges"])
    w.add_add_bos_token(md["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.eos_token_id" in md:
        w.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
        w.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.mark.parametrize("specials", [("<|endoftext|>",), ()], ids=["one-special", "no-special"])
def test_the_gguf_is_gguf_py_s_byte_for_byte(specials, tmp_path):
    trained = train(CORPUS, 700, specials=specials)
    assert trained.gguf() == gguf_py_vocab(trained, tmp_path / "oracle.gguf")
