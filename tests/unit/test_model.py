"""Configs from real GGUF headers, and clear errors for files this engine cannot run."""

from __future__ import annotations

import dataclasses

import pytest

from lab.format import gguf, model


def test_smollm2_config(smollm2_path):
    cfg = model.from_gguf(gguf.read_file(smollm2_path))
    assert (cfg.arch, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == ("llama", 30, 576, 9, 3, 64)
    assert (cfg.n_ff, cfg.n_vocab, cfg.n_rot) == (1536, 49152, 64)
    assert cfg.tied_output and not cfg.rope_neox and not cfg.qkv_bias and cfg.rope_base == 100000.0
    assert cfg.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 4


def test_qwen_config(qwen_path):
    cfg = model.from_gguf(gguf.read_file(qwen_path))
    assert (cfg.arch, cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == ("qwen2", 24, 14, 2, 64)
    assert cfg.qkv_bias and cfg.rope_neox and not cfg.tied_output and cfg.n_vocab == 151936


def test_gemma_config(gemma_path):
    cfg = model.from_gguf(gguf.read_file(gemma_path))
    assert (cfg.arch, cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == ("gemma3", 18, 4, 1, 256)
    assert cfg.qk_norm and cfg.post_norms and cfg.gelu and cfg.rope_neox and cfg.tied_output
    assert cfg.sliding_window == 512 and cfg.n_vocab == 262144
    assert [il for il, s in enumerate(cfg.sliding) if not s] == [5, 11, 17]
    assert cfg.embd_scale == pytest.approx(640 ** 0.5) and cfg.rope_base_local == 10000.0


def _edit(header, md=None, tensors=None):
    return dataclasses.replace(header, metadata={**header.metadata, **(md or {})},
                               tensors=tensors if tensors is not None else header.tensors)


def test_bad_models_name_the_cause(smollm2_path):
    h = gguf.read_file(smollm2_path)
    with pytest.raises(model.ModelError, match="unsupported architecture 'mamba'"):
        model.from_gguf(_edit(h, {"general.architecture": "mamba"}))
    missing = [t for t in h.tensors if t.name != "blk.3.ffn_up.weight"]
    with pytest.raises(model.ModelError, match="blk.3.ffn_up.weight is missing"):
        model.from_gguf(_edit(h, tensors=missing))
    bad = [dataclasses.replace(t, shape=(576, 1024)) if t.name == "blk.7.attn_q.weight" else t for t in h.tensors]
    with pytest.raises(model.ModelError, match=r"blk.7.attn_q.weight has shape \[576, 1024\]"):
        model.from_gguf(_edit(h, tensors=bad))
    iq = [dataclasses.replace(t, type_id=15) if t.name == "blk.2.ffn_down.weight" else t for t in h.tensors]
    with pytest.raises(model.ModelError, match="blk.2.ffn_down.weight has type Q8_K"):
        model.from_gguf(_edit(h, tensors=iq))
    with pytest.raises(model.ModelError, match="llama.embedding_length is missing"):
        md = dict(h.metadata)
        del md["llama.embedding_length"]
        model.from_gguf(dataclasses.replace(h, metadata=md))
    with pytest.raises(model.ModelError, match="not a multiple"):
        model.from_gguf(_edit(h, {"llama.attention.head_count_kv": 4}))
