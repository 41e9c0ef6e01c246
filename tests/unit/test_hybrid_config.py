"""lfm2's config as llama.cpp's loader reads it (layer kinds from the per-layer attention.head_count_kv, l_cache, the
final norm stored as token_embd_norm), and every malformed or unsupported file refused with a message that names the
key or tensor. Headers are made in memory from lab.host.synthetic_arch's lfm2 table (no file, no weights)."""

from __future__ import annotations

import dataclasses

import pytest

from lab.format import model
from lab.format.checks import ModelError
from lab.format.gguf import TensorInfo
from tests.unit.test_arch_config import header

KV = [0, 0, 2, 0, 0, 2]


def lfm2(md: dict | None = None, **kw):
    return header("lfm2", md={"lfm2.attention.head_count_kv": KV, **(md or {})}, **kw)


def test_lfm2_config():
    c = model.from_gguf(lfm2())
    assert c.shortconv == (True, True, False, True, True, False) and c.l_cache == 3
    assert c.conv_layers == (0, 1, 3, 4) and c.attention_layers == (2, 5) and c.n_head_kv == 2
    assert c.qk_norm and c.rope_neox and c.tied_output and c.output_norm == "token_embd_norm.weight"
    assert c.kv_bytes_per_token() == 2 * 2 * 2 * 64 * 4 and c.conv_state_bytes() == 4 * 2 * 256 * 4
    t = model.expected_tensors(c)
    assert t["blk.0.shortconv.conv.weight"] == (3, 256) and t["blk.0.shortconv.in_proj.weight"] == (256, 768)
    assert "blk.0.attn_q.weight" not in t and "blk.2.shortconv.in_proj.weight" not in t
    assert model.is_flat("blk.0.shortconv.conv.weight") and not model.is_flat("blk.0.shortconv.in_proj.weight")
    # a scalar head_count_kv is every layer's (llama.cpp's get_key_or_arr): all attention, so conv tensors are extra
    with pytest.raises(ModelError, match="blk.0.attn_q.weight is missing"):
        model.from_gguf(lfm2({"lfm2.attention.head_count_kv": 2}))


@pytest.mark.parametrize("md,match", [
    ({"lfm2.attention.head_count_kv": KV[:5]}, r"lfm2.attention.head_count_kv has 5 items, but lfm2.block_count = 6"),
    ({"lfm2.attention.head_count_kv": [0] * 6}, r"lfm2.attention.head_count_kv = .*every layer is a short-conv"),
    ({"lfm2.attention.head_count_kv": [0, 0, 2, 0, 0, 4]}, r"different KV head counts \(2, 4\)"),
    ({"lfm2.attention.head_count_kv": [0, 0, 2, 0, 0, -1]}, r"lfm2.attention.head_count_kv = .*item 5 is -1"),
    ({"lfm2.attention.head_count_kv": [0, 0, 2.0, 0, 0, 2]}, r"lfm2.attention.head_count_kv = .*array of integers"),
    ({"lfm2.shortconv.l_cache": None}, r"metadata key lfm2.shortconv.l_cache is missing"),
    ({"lfm2.shortconv.l_cache": 1}, r"lfm2.shortconv.l_cache = 1: must be in 2..8"),
    ({"lfm2.shortconv.l_cache": 4}, r"tensor blk.0.shortconv.conv.weight has shape \[3, 256\], expected \[4, 256\] "
                                    r"= \[l_cache, n_embd\] from lfm2.shortconv.l_cache = 4"),
    ({"lfm2.shortconv.l_cache": 3.0}, r"lfm2.shortconv.l_cache = 3.0: must be an integer"),
    ({"lfm2.attention.sliding_window": 8}, r"lfm2.attention.sliding_window = 8: lfm2 with sliding-window"),
    ({"lfm2.attention.causal": False}, r"lfm2.attention.causal = False: bidirectional lfm2"),
    ({"lfm2.attention.key_length": 32, "lfm2.attention.value_length": 32}, r"is not lfm2.embedding_length = 256"),
    ({"general.architecture": "lfm2moe"}, r"general.architecture = 'lfm2moe': LFM2's mixture-of-experts"),
])
def test_bad_lfm2_metadata_is_refused_by_name(md, match):
    with pytest.raises(ModelError, match=match):
        model.from_gguf(lfm2(md))


def test_bad_lfm2_tensors_are_refused_by_name():
    h = lfm2()
    by_name = {t.name: t for t in h.tensors}

    def with_tensor(which, **change):
        t = dataclasses.replace(by_name[which], **change)
        return dataclasses.replace(h, tensors=[t if x.name == which else x for x in h.tensors])

    with pytest.raises(ModelError, match=r"tensor blk.1.shortconv.in_proj.weight has shape \[256, 512\], expected "
                                         r"\[256, 768\] = \[n_embd, bcx_rows\]"):
        model.from_gguf(with_tensor("blk.1.shortconv.in_proj.weight", shape=(256, 512)))
    with pytest.raises(ModelError, match=r"tensor blk.3.shortconv.conv.weight is F16; the short-conv kernel reads it "
                                         r"as F32"):
        model.from_gguf(with_tensor("blk.3.shortconv.conv.weight", type_id=1))
    renamed = with_tensor("token_embd_norm.weight", name="output_norm.weight")
    with pytest.raises(ModelError, match=r"tensor token_embd_norm.weight is missing"):
        model.from_gguf(renamed)
    colbert = dataclasses.replace(h, tensors=h.tensors + [TensorInfo("dense_2_out.weight", (256, 128), 0, 0, 4)])
    with pytest.raises(ModelError, match=r"tensor dense_2_out.weight is not one a lfm2 model reads here"):
        model.from_gguf(colbert)
