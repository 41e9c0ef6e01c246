"""The hybrids' configs as llama.cpp's loaders read them: lfm2 (layer kinds from the per-layer attention.head_count_kv,
l_cache, the final norm stored as token_embd_norm) and qwen35 (delta-net layers from the interval or the per-layer
array, the ssm.* sizes, the text-only IMROPE sections, each head's [q | gate] rows as views, the multi-token-prediction
blocks skipped and said), and every malformed or unsupported file refused with a message that names the key or
tensor. Headers are made in memory from lab.host.synthetic.arch's tables (no file, no weights)."""

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


# -- qwen35 ----------------------------------------------------------------------------------------------------------
def qwen35(md: dict | None = None, **kw):
    return header("qwen35", md=md, **kw)


def test_qwen35_config():
    c = model.from_gguf(qwen35())
    assert c.delta == (True, True, False, True, True, False) and c.delta_layers == (0, 1, 3, 4) == c.conv_layers
    assert c.attention_layers == (2, 5) and c.l_cache == 4 and not c.shortconv
    assert (c.ssm_k_heads, c.ssm_v_heads, c.ssm_head_dim, c.ssm_inner) == (2, 4, 64, 256)
    assert c.conv_channels == 2 * 2 * 64 + 256 and c.delta_width == c.conv_channels + 256 + 2 * 4
    assert c.qk_norm and c.rope_neox and c.attn_gate and c.n_rot == 16 and c.ffn_norm == "post_attention_norm.weight"
    assert c.delta_state_bytes() == 4 * 4 * 64 * 64 * 4 and c.conv_state_bytes() == 4 * 3 * c.conv_channels * 4
    stored, t = model.stored_tensors(c), model.expected_tensors(c)
    assert stored["blk.2.attn_q.weight"] == (256, 2 * 4 * 64) and "blk.2.attn_q.weight" not in t
    # the engine reads each head's [q | gate] rows as two views of the one tensor
    assert t["blk.2.attn_q.weight#q0"] == t["blk.2.attn_q.weight#g3"] == (256, 64)
    assert t["blk.0.ssm_conv1d.weight"] == (4, c.conv_channels) and t["blk.0.ssm_a"] == (4,)
    assert model.is_flat("blk.0.ssm_conv1d.weight") and "blk.2.ssm_a" not in t and "blk.0.attn_q.weight" not in stored
    h = qwen35()
    views = model.tensor_views(c, {x.name: x for x in h.tensors})
    q = {x.name: x for x in h.tensors}["blk.2.attn_q.weight"]
    rb = 4 * 256
    assert [views[f"blk.2.attn_q.weight#{p}{i}"].offset - q.offset for i in range(4) for p in "qg"] == \
        [k * 64 * rb for k in range(8)]
    # the explicit per-layer array instead of the interval: the same layers, or others (whose tensors then miss)
    same = [True, True, False, True, True, False]
    assert model.from_gguf(qwen35({"qwen35.attention.recurrent_layers": same})).delta == tuple(same)
    with pytest.raises(ModelError, match=r"tensor blk.1.attn_q.weight is missing"):
        model.from_gguf(qwen35({"qwen35.attention.recurrent_layers": [True, False, True, True, True, False]}))


def test_qwen35_multi_token_prediction_blocks_are_skipped_and_said():
    """A file with nextn_predict_layers = 1 holds a block past the model's own: the config runs the 6 layers, reads
    none of the MTP block's tensors, and says so (Config.skipped); a recurrent MTP block is refused."""
    extra = tuple(TensorInfo(f"blk.6.{n}", (256, 256), 0, 0, 4 * 256 * 256)
                  for n in ("nextn.eh_proj.weight", "attn_q.weight", "ffn_up.weight"))
    c = model.from_gguf(qwen35({"qwen35.block_count": 7, "qwen35.nextn_predict_layers": 1}, add=extra))
    assert c.n_layer == 6 and c.mtp_layers == 1 and not any(k.startswith("blk.6.") for k in model.expected_tensors(c))
    assert len(c.skipped) == 1 and "blk.6" in c.skipped[0] and "multi-token-prediction" in c.skipped[0]
    assert model.from_gguf(qwen35()).skipped == []
    with pytest.raises(ModelError, match=r"tensor blk.6.nextn.eh_proj.weight is not one a qwen35 model reads here \(qwen35.block_count = 6\)"):
        model.from_gguf(qwen35(add=extra))
    with pytest.raises(ModelError, match=r"a multi-token-prediction block \(after layer 5\) must not be recurrent"):
        model.from_gguf(qwen35({"qwen35.block_count": 7, "qwen35.nextn_predict_layers": 1,
                                "qwen35.attention.recurrent_layers": [True, True, False, True, True, False, True]},
                               add=extra))


@pytest.mark.parametrize("md,match", [
    ({"qwen35.ssm.inner_size": 128}, r"qwen35.ssm.inner_size = 128 is not qwen35.ssm.time_step_rank = 4 x "
                                     r"qwen35.ssm.state_size = 64"),
    ({"qwen35.ssm.time_step_rank": 3, "qwen35.ssm.inner_size": 192}, r"time_step_rank = 3 \(value heads\) is not a "
                                                                       r"multiple of qwen35.ssm.group_count = 2"),
    ({"qwen35.ssm.conv_kernel": 9}, r"qwen35.ssm.conv_kernel = 9: must be in 2..8"),
    ({"qwen35.ssm.state_size": 24, "qwen35.ssm.inner_size": 96}, r"qwen35.ssm.state_size = 24: the delta-net kernel"),
    ({"qwen35.ssm.group_count": None}, r"metadata key qwen35.ssm.group_count is missing"),
    ({"qwen35.attention.recurrent_layers": [True] * 5}, r"recurrent_layers has 5 items, but qwen35.block_count = 6"),
    ({"qwen35.attention.recurrent_layers": [True] * 6}, r"every layer is a delta-net layer"),
    ({"qwen35.attention.recurrent_layers": [1, 1, 0, 1, 1, 0]}, r"recurrent_layers = .*must be an array of bools"),
    ({"qwen35.rope.dimension_sections": [3, 3, 1, 1]}, r"rotary pair 5 of 8 falls on the fourth axis"),
    ({"qwen35.rope.dimension_sections": [8]}, r"four section sizes expected"),
    ({"qwen35.rope.dimension_sections": None}, r"metadata key qwen35.rope.dimension_sections is missing"),
    ({"qwen35.full_attention_interval": 2}, r"tensor blk.1.attn_q.weight is missing"),
    ({"general.architecture": "qwen35moe"}, r"general.architecture = 'qwen35moe': Qwen3.5's mixture-of-experts"),
])
def test_bad_qwen35_metadata_is_refused_by_name(md, match):
    with pytest.raises(ModelError, match=match):
        model.from_gguf(qwen35(md))


def test_bad_qwen35_tensors_are_refused_by_name():
    h = qwen35()
    by_name = {t.name: t for t in h.tensors}

    def with_tensor(which, **change):
        t = dataclasses.replace(by_name[which], **change)
        return dataclasses.replace(h, tensors=[t if x.name == which else x for x in h.tensors])

    with pytest.raises(ModelError, match=r"tensor blk.2.attn_q.weight has shape \[256, 256\], expected \[256, 512\] = "
                                         r"\[n_embd, q_gate_rows\]"):
        model.from_gguf(with_tensor("blk.2.attn_q.weight", shape=(256, 256)))
    with pytest.raises(ModelError, match=r"tensor blk.0.ssm_conv1d.weight is F16; the short-conv kernel reads it"):
        model.from_gguf(with_tensor("blk.0.ssm_conv1d.weight", type_id=1))
    with pytest.raises(ModelError, match=r"tensor blk.4.ssm_a is missing"):
        model.from_gguf(dataclasses.replace(h, tensors=[x for x in h.tensors if x.name != "blk.4.ssm_a"]))


@pytest.mark.parametrize("md,tensor,match", [
    ({"general.architecture": "qwen35moe"}, None, r"general.architecture = 'qwen35moe': Qwen3.5's mixture-of-experts"),
    ({"general.architecture": "ernie4_5-moe"}, None, r"'ernie4_5-moe': a mixture-of-experts model"),
    ({"general.architecture": "nemotron_h_moe"}, None, r"'nemotron_h_moe': a mixture-of-experts model"),
    # Mixtral-style llama files run (docs/moe.md), but not half of one: experts without their count a token, a router
    # without experts
    ({"llama.expert_count": 8}, None, r"llama.expert_used_count is missing: llama.expert_count = 8 needs it"),
    ({}, "blk.0.ffn_gate_inp.weight", r"tensor blk.0.ffn_gate_inp.weight: a mixture-of-experts router, but "
                                      r"llama.expert_count is absent or 0"),
    # qwen2 has no experts here
    ({"general.architecture": "qwen2moe"}, None, r"'qwen2moe': a mixture-of-experts model"),
    ({"general.architecture": "clip"}, None, r"general.architecture = 'clip': a multimodal projector \(mmproj\)"),
    ({"clip.has_vision_encoder": True}, None, r"a multimodal projector \(mmproj\) file"),
])
def test_experts_and_projectors_are_refused_by_name(md, tensor, match):
    """Any mixture-of-experts file (by architecture name, expert count or router tensor) and a vision / audio projector
    are refused with the reason, not as an unknown architecture or a missing tensor."""
    add = (TensorInfo(tensor, (256, 8), 0, 0, 4 * 256 * 8),) if tensor else ()
    with pytest.raises(ModelError, match=match):
        model.from_gguf(header("llama3", md=md, add=add))
