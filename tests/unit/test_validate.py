"""lab.format.checks: one check per rule, each refusal naming its key and value; the real models pass; RoPE
scaling read as llama.cpp reads it. Seeds (tiny models with real tokenizer metadata): tests/unit/fuzzkit.py."""

from __future__ import annotations

import dataclasses
import math
import struct

import pytest

from lab.engine.load import validate
from lab.format import checks, gguf
from lab.format.gguf import TensorInfo
from lab.format.model import ModelError
from lab.host import models
from lab.text.tokenizer import TokenizerError
from tests.unit.fuzzkit import seed, seed_header, with_metadata


def edit(name: str, **kv) -> gguf.Header:
    """The seed with keys set (None: removed); `__` in a name stands for a dot."""
    h = seed_header(name)
    md = dict(h.metadata)
    for k, v in kv.items():
        k = k.replace("__", ".")
        if v is None:
            md.pop(k, None)
        else:
            md[k] = v
    return with_metadata(h, md)


def refused(h: gguf.Header, *words: str, kind=ModelError) -> str:
    with pytest.raises(kind) as e:
        validate(h)
    for w in words:
        assert w in str(e.value), e.value
    return str(e.value)


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5", "gemma3"])
def test_real_models_pass(name):
    cfg, tok = validate(gguf.read_file(models.path(name)))
    assert cfg.n_vocab == tok.vocab_size


@pytest.mark.parametrize("key, value, words", [
    ("llama.rope.freq_base", math.nan, ["llama.rope.freq_base = nan", "finite"]),
    ("llama.rope.freq_base", 1.0, ["llama.rope.freq_base = 1.0", "> 1"]),
    ("llama.attention.layer_norm_rms_epsilon", -1e-5, ["llama.attention.layer_norm_rms_epsilon = -1e-05"]),
    ("llama.attention.layer_norm_rms_epsilon", 1e-40, ["epsilon"]),          # subnormal in f32
    ("llama.attention.layer_norm_rms_epsilon", "1e-5", ["must be a number"]),
    ("llama.block_count", 0, ["llama.block_count = 0", "1..4294967295"]),
    ("llama.block_count", True, ["must be an integer"]),
    ("llama.block_count", 1 << 40, ["llama.block_count"]),
    ("llama.embedding_length", 64, ["llama.embedding_length = 64", "token_embd.weight"]),
    ("llama.attention.head_count", 3, ["llama.attention.head_count = 3", "head_count_kv = 2"]),
    ("llama.attention.head_count_kv", 3, ["llama.attention.head_count_kv = 3"]),
    ("llama.feed_forward_length", 128, ["blk.0.ffn_gate.weight", "llama.feed_forward_length = 128"]),
    ("llama.rope.dimension_count", 4, ["llama.rope.dimension_count = 4", "whole head"]),
    ("llama.rope.dimension_count", 7, ["must be even"]),
    ("llama.rope.scaling.type", "yarn", ["llama.rope.scaling.type = 'yarn'", "not supported"]),
    ("llama.rope.scaling.type", "ntk", ["llama.rope.scaling.type = 'ntk'"]),
    ("llama.rope.scaling.factor", -2.0, ["llama.rope.scaling.factor = -2.0"]),
    ("llama.rope.scaling.attn_factor", 0.5, ["llama.rope.scaling.attn_factor = 0.5"]),
    ("llama.expert_count", 8, ["llama.expert_count = 8", "llama.expert_used_count is missing"]),
    ("llama.vocab_size", 1000, ["llama.vocab_size = 1000", "1024 rows"]),
    ("llama.attention.value_length", 16, ["llama.attention.value_length = 16"]),
    ("general.architecture", "mamba", ["unsupported architecture 'mamba'"]),
    ("general.architecture", 5, ["unsupported architecture 5"]),
    ("llama.context_length", None, ["metadata key llama.context_length is missing"]),
])
def test_config_rules(key, value, words):
    refused(edit("smollm2", **{key: value}), *words)


@pytest.mark.parametrize("key, value, words", [
    ("tokenizer.ggml.tokens", None, ["tokenizer.ggml.tokens is missing"]),
    ("tokenizer.ggml.tokens", [], ["tokenizer.ggml.tokens = []: must not be empty"]),
    ("tokenizer.ggml.model", 3, ["tokenizer.ggml.model = 3: must be a string"]),
    ("tokenizer.ggml.model", "bert", ["unsupported tokenizer model 'bert'"]),
    ("tokenizer.ggml.pre", "nope", ["unsupported pre-tokenizer 'nope' (tokenizer.ggml.pre)"]),
    ("tokenizer.ggml.token_type", [1] * 10, ["tokenizer.ggml.token_type has 10 items, tokenizer.ggml.tokens 1024"]),
    ("tokenizer.ggml.bos_token_id", 1024, ["tokenizer.ggml.bos_token_id = 1024", "1024 tokens"]),
    ("tokenizer.ggml.padding_token_id", -1, ["tokenizer.ggml.padding_token_id = -1"]),
    ("tokenizer.ggml.eot_token_id", 2.0, ["tokenizer.ggml.eot_token_id = 2.0: must be an integer"]),
    ("tokenizer.ggml.add_bos_token", 1, ["tokenizer.ggml.add_bos_token = 1: must be a bool"]),
    ("tokenizer.ggml.merges", ["a b", "ab", "c  "], ["tokenizer.ggml.merges", "item 1 is 'ab'"]),
    ("tokenizer.ggml.merges", ["a b", " b"], ["item 1 is ' b'"]),
    ("tokenizer.ggml.merges", None, ["tokenizer.ggml.merges is missing"]),
    ("tokenizer.chat_template", ["x"], ["tokenizer.chat_template = ['x']: must be a string"]),
], ids=lambda v: str(v)[:30])
def test_tokenizer_rules(key, value, words):
    refused(edit("smollm2", **{key: value}), *words, kind=TokenizerError)


def test_vocabulary_must_match_the_embedding_rows():
    h = seed_header("smollm2")
    tokens = h.metadata["tokenizer.ggml.tokens"]
    md = {**h.metadata, "tokenizer.ggml.tokens": tokens[:-1], "tokenizer.ggml.token_type":
          h.metadata["tokenizer.ggml.token_type"][:-1]}
    md.pop("llama.vocab_size")
    refused(with_metadata(h, md), "tokenizer.ggml.tokens has 1023 tokens", "token_embd.weight has 1024 rows",
            kind=TokenizerError)


def test_sentencepiece_needs_byte_tokens_and_byte_types_need_byte_spellings():
    h = seed_header("gemma3")
    tokens = list(h.metadata["tokenizer.ggml.tokens"])
    i = tokens.index("<0x80>")
    tokens[i] = "not a byte"
    refused(with_metadata(h, {**h.metadata, "tokenizer.ggml.tokens": tokens}),
            f"tokenizer.ggml.token_type[{i}] = 6", f"tokenizer.ggml.tokens[{i}] = 'not a byte'", kind=TokenizerError)
    types = list(h.metadata["tokenizer.ggml.token_type"])
    types[i] = 1
    refused(with_metadata(h, {**h.metadata, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}),
            "<0x80> is missing", kind=TokenizerError)
    refused(edit("gemma3", tokenizer__ggml__scores=[math.nan] * 2048), "tokenizer.ggml.scores", "NaN",
            kind=TokenizerError)
    refused(edit("gemma3", tokenizer__ggml__token_type=[9] * 2048), "item 0 is 9, not a token type",
            kind=TokenizerError)


def test_duplicate_tokens_are_named():
    h = seed_header("smollm2")
    tokens = list(h.metadata["tokenizer.ggml.tokens"])
    tokens[40] = tokens[30]
    refused(with_metadata(h, {**h.metadata, "tokenizer.ggml.tokens": tokens}), "tokenizer.ggml.tokens has",
            "ids 30 and 40", kind=TokenizerError)


def test_rope_scaling_as_llama_cpp_reads_it():
    """Type "linear" when absent; factor from rope.scaling.factor, else rope.scale_linear; 0 means none;
    type "none" never scales."""
    def scale(**kv):
        return validate(edit("smollm2", **kv)).config.rope_scale
    assert scale() == 1.0
    assert scale(llama__rope__scaling__factor=4.0) == 0.25                       # no type: linear
    assert scale(llama__rope__scale_linear=2.0) == 0.5                           # the older key
    assert scale(llama__rope__scaling__factor=0.0, llama__rope__scale_linear=2.0) == 1.0   # present, 0: none
    assert scale(llama__rope__scaling__type="none", llama__rope__scaling__factor=4.0) == 1.0
    assert scale(llama__rope__scaling__type="linear", llama__rope__scaling__factor=4.0) == 0.25
    # gemma3: llama.cpp leaves the sliding layers unscaled; one scale for all would be wrong: refused.
    refused(edit("gemma3", gemma3__rope__scaling__factor=8.0), "gemma3.rope.scaling.factor = 8.0", "global layers")


def test_unread_tensors_are_refused_by_name():
    # rope_freqs is read for llama (llama 3's factors, tests/unit/test_arch_config.py); qwen2 never reads it
    h = seed_header("qwen2.5")
    extra = TensorInfo("rope_freqs.weight", (4,), 0, h.tensors[-1].offset + h.tensors[-1].nbytes, 16)
    refused(dataclasses.replace(h, tensors=[*h.tensors, extra]), "rope_freqs.weight", "refused rather than ignored")
    h = seed_header("smollm2")
    one_d = [dataclasses.replace(t, shape=(t.shape[0] * t.shape[1],)) if t.name == "token_embd.weight" else t
             for t in h.tensors]
    refused(dataclasses.replace(h, tensors=one_d), "token_embd.weight has shape [32768]")


def test_messages_say_which_keys_made_a_shape():
    msg = refused(edit("smollm2", llama__attention__head_count_kv=None), "blk.0.attn_k.weight")
    assert "llama.attention.head_count_kv absent, so llama.attention.head_count = 4" in msg


def test_show_abbreviates():
    assert checks.show("x" * 100).endswith("... (100 characters)")
    assert checks.show(list(range(10))) == "[0, 1, 2, ...] (10 items)"
    assert checks.show([1, 2]) == "[1, 2]"


def test_the_cli_names_the_key(tmp_path, capsys):
    """`lab generate` validates before it opens a GPU: one line naming the key, exit status 2."""
    from lab.host import cli
    raw = bytearray(seed("smollm2"))
    key = b"llama.rope.freq_base"
    at = raw.index(key) + len(key) + 4           # after the key and its value type (f32)
    raw[at:at + 4] = struct.pack("<f", math.nan)
    path = tmp_path / "nan.gguf"
    path.write_bytes(bytes(raw))
    assert cli.main(["generate", str(path), "--prompt", "hi", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert "llama.rope.freq_base = nan" in err and "Traceback" not in err, err
