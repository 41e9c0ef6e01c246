"""gemma4's config as llama_model_gemma4::load_arch_hparams reads it: sliding layers from the per-layer pattern array
with their own head size, rotated dims and base; per-layer KV heads and FFN widths; the shared-KV tail and which layer's
cache each of its layers reads; the per-layer embedding tables; out_scale; the full layers' rope_freqs; and every
malformed or unsupported file (the mixture-of-experts size above all) refused with a message that names the key or
tensor. Headers are made in memory from lab.host.synthetic.arch's tables (no file, no weights)."""

from __future__ import annotations

import pytest

from lab.format import model
from lab.format.checks import ModelError
from lab.format.gguf import TensorInfo
from lab.host.synthetic import arch as sa
from tests.unit.test_arch_config import N_VOCAB, header

SPEC = sa.SPECS["gemma4"]


def gemma4(md: dict | None = None, **kw):
    per_layer = {"gemma4.attention.head_count_kv": list(SPEC.kv_per_layer),
                 "gemma4.feed_forward_length": list(SPEC.ff_per_layer)}
    return header("gemma4", md={**per_layer, **(md or {})}, **kw)


def test_gemma4_config():
    c = model.from_gguf(gemma4())
    assert c.sliding == (True, True, False, True, False, True, False) and c.sliding_window == 8
    assert [c.head_dim_of(il) for il in range(7)] == [64, 64, 128, 64, 128, 64, 128] and c.head_dim == 128
    assert [c.n_rot_of(il) for il in (0, 2)] == [64, 128] and (c.rope_base, c.rope_base_local) == (1e6, 1e4)
    assert [c.n_head_kv_of(il) for il in range(7)] == [2, 2, 1, 2, 1, 2, 1] and c.n_head_kv == 2
    assert [c.n_ff_of(il) for il in range(7)] == [256] * 5 + [512] * 2 and c.n_ff == 512
    # layers 5 (sliding) and 6 (full) read the caches of 3 and 4, the last own layers of their kind
    assert [c.kv_source(il) for il in range(7)] == [0, 1, 2, 3, 4, 3, 4] and not c.has_kv(5)
    assert c.kv_bytes_per_token() == 2 * 4 * (2 * 64 + 2 * 64 + 128 + 2 * 64 + 128)
    assert c.attn_scale == 1.0 and c.embd_scale == 16.0 and c.final_softcap == 15.0 and c.attn_softcap == 0.0
    assert c.qk_norm and c.v_norm and c.post_norms and c.gelu and c.rope_neox and c.tied_output and c.out_scale
    assert c.rope_freqs_full and not c.rope_freqs and c.n_embd_per_layer == 32
    assert [t.name for t in model.host_tensors(c, gemma4())] == ["rope_freqs.weight"] + [
        f"blk.{il}.layer_output_scale.weight" for il in range(7)]
    t = model.expected_tensors(c)
    assert t["per_layer_token_embd.weight"] == (224, N_VOCAB) and t["per_layer_model_proj.weight"] == (256, 224)
    assert t["blk.0.attn_q.weight"] == (256, 256) and t["blk.2.attn_q.weight"] == (256, 512)
    assert t["blk.2.attn_k.weight"] == (256, 128) and t["blk.3.attn_v.weight"] == (256, 128)
    assert t["blk.6.ffn_down.weight"] == (512, 256) and t["blk.0.inp_gate.weight"] == (256, 32)
    assert t["blk.0.proj.weight"] == (32, 256) and "blk.4.layer_output_scale.weight" not in t
    assert "blk.5.attn_k.weight" not in t and "blk.6.attn_k_norm.weight" not in t and "rope_freqs.weight" not in t
    assert "shared_kv_layers" in c.skipped[0]


def test_gemma4_shared_layers_own_kv_weights_are_skipped_not_refused():
    """A release's shared-KV layers may still hold attn_k / attn_v: llama.cpp loads them (TENSOR_NOT_REQUIRED) and never
    reads them; so does this lab (not uploaded). Any other extra tensor is still refused."""
    k5 = TensorInfo("blk.5.attn_k.weight", (256, 128), 0, 0, 4 * 256 * 128)
    assert "blk.5.attn_k.weight" not in model.expected_tensors(model.from_gguf(gemma4(add=(k5,))))
    k2 = TensorInfo("blk.2.attn_qkv.weight", (256, 768), 0, 0, 4 * 256 * 768)
    with pytest.raises(ModelError, match="tensor blk.2.attn_qkv.weight is not one a gemma4 model reads"):
        model.from_gguf(gemma4(add=(k2,)))


def test_gemma4_full_layers_without_attn_v_read_k_as_v():
    """attention_k_eq_v: a full layer without attn_v takes V from K's projection (llama.cpp: "if v_proj is not present,
    use k_proj"); the engine reads attn_k's rows a second time as attn_v (a view of the same file bytes)."""
    h = header("gemma4kv", md={"gemma4.attention.head_count_kv": list(SPEC.kv_per_layer),
                               "gemma4.feed_forward_length": list(SPEC.ff_per_layer)})
    c = model.from_gguf(h)
    assert c.v_is_k == (False, False, True, False, True, False, False)
    assert "blk.2.attn_v.weight" not in model.stored_tensors(c) and "blk.2.attn_v.weight" in model.expected_tensors(c)
    views = model.tensor_views(c, {t.name: t for t in h.tensors})
    k, v = views["blk.2.attn_k.weight"], views["blk.2.attn_v.weight"]
    assert (v.offset, v.nbytes, v.shape) == (k.offset, k.nbytes, k.shape)
    assert model.from_gguf(gemma4()).v_is_k == (False,) * 7


def test_gemma4_without_per_layer_embeddings_or_sharing():
    """The larger dense size (31B) has no per-layer embeddings and no shared-KV tail: both are optional."""
    drop = ("per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight",
            *(f"blk.{il}.{n}" for il in range(7) for n in ("inp_gate.weight", "proj.weight", "post_norm.weight")))
    own = tuple(TensorInfo(f"blk.{il}.{n}", shape, 0, 0, 0) for il, hd, kvh in ((5, 64, 2), (6, 128, 1))
                for n, shape in (("attn_k.weight", (256, kvh * hd)), ("attn_v.weight", (256, kvh * hd)),
                                 ("attn_k_norm.weight", (hd,))))
    c = model.from_gguf(gemma4({"gemma4.embedding_length_per_layer_input": 0, "gemma4.attention.shared_kv_layers": 0},
                               drop=drop, add=own))
    assert c.n_embd_per_layer == 0 and c.kv_from_start == -1 and c.kv_source(6) == 6 and not c.skipped
    assert "blk.6.attn_k.weight" in model.expected_tensors(c)


@pytest.mark.parametrize("md,match", [
    ({"gemma4.expert_count": 128}, r"gemma4.expert_count = 128: gemma4's mixture-of-experts size \(26B-A4B\)"),
    ({"gemma4.attention.sliding_window_pattern": [True] * 6}, r"sliding_window_pattern has 6 items, but gemma4.block"),
    ({"gemma4.attention.sliding_window_pattern": 5}, r"gemma4.attention.sliding_window_pattern = 5: must be an array"),
    ({"gemma4.attention.sliding_window_pattern": None}, r"metadata key gemma4.attention.sliding_window_pattern is miss"),
    ({"gemma4.attention.key_length_swa": None}, r"metadata key gemma4.attention.key_length_swa is missing"),
    ({"gemma4.attention.value_length_swa": 32}, r"value_length_swa = 32 differs from gemma4.attention.key_length_swa"),
    ({"gemma4.rope.dimension_count_swa": 65}, r"gemma4.rope.dimension_count_swa = 65: must be even"),
    ({"gemma4.attention.shared_kv_layers": 3}, r"shared_kv_layers = 3: layers 4.. would read the K/V of layers 2 "
                                               r"\(must slide\) and 3 \(must be full\)"),
    ({"gemma4.attention.head_count_kv": [2, 2, 1, 2, 1, 2]}, r"gemma4.attention.head_count_kv has 6 items"),
    ({"gemma4.attention.head_count_kv": [2, 2, 3, 2, 1, 2, 1]}, r"head_count = 4 is not a multiple of gemma4.attention.head_count_kv = 3"),
    ({"gemma4.feed_forward_length": [256] * 7}, r"tensor blk.5.ffn_gate.weight has shape \[256, 512\], expected "
                                                r"\[256, 256\] = \[n_embd, n_ff@5\]"),
    ({"gemma4.attention.key_length": 64, "gemma4.attention.value_length": 64, "gemma4.rope.dimension_count": 64},
     r"tensor rope_freqs.weight has shape \[64\], expected \[32\] = \[rope_pairs\]"),
    ({"gemma4.embedding_length_per_layer_input": 16}, r"per_layer_token_embd.weight has shape \[224, \d+\], expected "
                                                      r"\[112, \d+\]"),
    ({"gemma4.attention.sliding_window": None}, r"metadata key gemma4.attention.sliding_window is missing"),
])
def test_bad_gemma4_metadata_is_refused_by_name(md, match):
    with pytest.raises(ModelError, match=match):
        model.from_gguf(gemma4(md))


def test_gemma4_moe_and_missing_tensors_are_refused_by_name():
    router = TensorInfo("blk.0.ffn_gate_inp.weight", (256, 128), 0, 0, 0)
    with pytest.raises(ModelError, match=r"tensor blk.0.ffn_gate_inp.weight: gemma4's mixture-of-experts size"):
        model.from_gguf(gemma4(add=(router,)))
    with pytest.raises(ModelError, match=r"rope_freqs.weight is missing \(a gemma4 model's full layers need it"):
        model.from_gguf(gemma4(drop=("rope_freqs.weight",)))
    with pytest.raises(ModelError, match=r"tensor blk.3.attn_k.weight is missing"):
        model.from_gguf(gemma4(drop=("blk.3.attn_k.weight",)))
    with pytest.raises(ModelError, match=r"tensor blk.1.inp_gate.weight is missing"):
        model.from_gguf(gemma4(drop=("blk.1.inp_gate.weight",)))
