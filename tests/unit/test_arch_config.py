"""Configs of the architectures beyond the three real models (llama 3, Mistral-style llama, qwen3, phi3, gemma2,
gemma3 1B-shaped), read as llama.cpp's loaders read them, and the refusals that name what is not supported.

Headers are made in memory from lab.host.synthetic.arch's tensor tables (no file, no weights): what is tested
is lab.format.model / lab.format.checks, which only ever see the header."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lab.format import gguf, model
from lab.format.checks import ModelError, check_config
from lab.format.gguf import TensorInfo
from lab.host.synthetic import arch as sa

N_VOCAB = 512


def header(spec: str, md: dict | None = None, drop: tuple[str, ...] = (), add: tuple[TensorInfo, ...] = ()):
    s = sa.SPECS[spec]
    a = s.arch + "."
    meta = {"general.architecture": s.arch, a + "block_count": s.n_layer, a + "embedding_length": s.n_embd,
            a + "feed_forward_length": s.n_ff, a + "attention.head_count": s.n_head,
            a + "attention.head_count_kv": s.n_head_kv, a + "attention.layer_norm_rms_epsilon": 1e-6,
            **{a + k: v for k, v in s.extra.items()}}
    meta.update(md or {})
    meta = {k: v for k, v in meta.items() if v is not None}
    tensors, off = [], 0
    for name, _role, shape, _std in sa.tensor_table(s, N_VOCAB):
        if name in drop:
            continue
        n = math.prod(shape)
        tensors.append(TensorInfo(name, tuple(reversed(shape)), 0, off, 4 * n))
        off += 4 * n
    tensors += list(add)
    return gguf.Header(3, meta, tensors, 32, 0, 0, None)


def cfg_of(spec, **kw):
    return model.from_gguf(header(spec, **kw))


def test_llama3_reads_rope_freqs_and_mistral_runs_without_a_window():
    c = cfg_of("llama3")
    assert c.rope_freqs and not c.rope_neox and c.tied_output
    assert [t.name for t in model.host_tensors(c, header("llama3"))] == ["rope_freqs.weight"]
    assert "rope_freqs.weight" not in model.expected_tensors(c)        # the engine reads its values, uploads none
    m = cfg_of("mistral")
    # llama.cpp's llama loader never reads llama.attention.sliding_window: full causal attention
    assert not m.rope_freqs and not m.tied_output and m.sliding_window == 0 and not any(m.sliding)
    assert "attention.sliding_window" not in check_config(header("mistral").metadata, "llama")
    with pytest.raises(ModelError, match=r"rope_freqs.weight has shape \[16\], expected \[32\]"):
        cfg_of("llama3", drop=("rope_freqs.weight",), add=(TensorInfo("rope_freqs.weight", (16,), 0, 0, 64),))


def test_qwen3_phi3_gemma2_gemma3_settings():
    q = cfg_of("qwen3")
    assert q.qk_norm and q.rope_neox and not q.qkv_bias and not q.post_norms and not q.gelu
    p = cfg_of("phi3")
    assert p.fused_qkv and p.fused_gate_up and p.rope_neox and p.sliding_window == 0   # llama.cpp switches phi3 SWA off
    g2 = cfg_of("gemma2")
    assert g2.post_norms and g2.gelu and not g2.qk_norm and g2.tied_output
    assert (g2.attn_softcap, g2.final_softcap, g2.sliding_window) == (2.0, 8.0, 8)
    assert g2.sliding == (True, False, True, False)                     # pattern 2: even layers slide
    assert g2.attn_scale == pytest.approx(1 / 16) and g2.embd_scale == pytest.approx(16.0)
    # absent keys: llama.cpp's gemma2 defaults (window 4096, caps 50 / 30)
    d = cfg_of("gemma2", md={"gemma2.attention.sliding_window": None, "gemma2.attn_logit_softcapping": None,
                             "gemma2.final_logit_softcapping": None})
    assert (d.sliding_window, d.attn_softcap, d.final_softcap) == (4096, 50.0, 30.0)
    assert cfg_of("gemma2", md={"gemma2.rope.freq_base_swa": 500.0}).rope_base_local == 500.0
    g3 = cfg_of("gemma3")
    assert g3.head_dim == 256 and g3.qk_norm and g3.sliding == (True,) * 5 + (False,)
    assert (g3.rope_base, g3.rope_base_local, g3.attn_softcap) == (1e6, 1e4, 0.0)


def test_phi3_views_split_the_fused_rows_gate_first():
    h = header("phi3")
    c = model.from_gguf(h)
    v = model.tensor_views(c, {t.name: t for t in h.tensors})
    qkv, up = (next(t for t in h.tensors if t.name == n) for n in ("blk.1.attn_qkv.weight", "blk.1.ffn_up.weight"))
    rb = 4 * c.n_embd
    assert [(v[f"blk.1.attn_{x}.weight"].offset - qkv.offset) // rb for x in "qkv"] == [0, c.q_dim, c.q_dim + c.kv_dim]
    # ggml_swiglu on a fused row: SiLU of the FIRST n_ff values (the gate), times the second half
    assert v["blk.1.ffn_gate.weight"].offset == up.offset
    assert v["blk.1.ffn_up.weight"].offset == up.offset + c.n_ff * rb
    assert v["blk.1.ffn_up.weight"].shape == (c.n_embd, c.n_ff)
    assert set(model.expected_tensors(c)) <= set(v)


@pytest.mark.parametrize("kind", ["yarn", "longrope"])
def test_rope_scaling_types_refused_by_name(kind):
    with pytest.raises(ModelError, match=f"llama.rope.scaling.type = '{kind}'.*RoPE scaling type '{kind}' is not "
                                         f"supported"):
        cfg_of("llama3", md={"llama.rope.scaling.type": kind})
    with pytest.raises(ModelError, match="not a RoPE scaling type llama.cpp knows"):
        cfg_of("llama3", md={"llama.rope.scaling.type": "llama3"})


def test_linear_scaling_runs_and_none_ignores_the_factor():
    assert cfg_of("qwen3", md={"qwen3.rope.scaling.type": "linear", "qwen3.rope.scaling.factor": 4.0}).rope_scale == 0.25
    assert cfg_of("qwen3", md={"qwen3.rope.scaling.type": "none", "qwen3.rope.scaling.factor": 4.0}).rope_scale == 1.0


@pytest.mark.parametrize("which", ["long", "short"])
def test_phi3_long_context_factors_refused(which):
    extra = TensorInfo(f"rope_factors_{which}.weight", (32,), 0, 0, 128)
    with pytest.raises(ModelError, match=f"rope_factors_{which}.weight: long-context RoPE factors"):
        cfg_of("phi3", add=(extra,))


def test_unknown_architecture_and_foreign_tensors_refused():
    with pytest.raises(ModelError, match="unsupported architecture 'phi2'.*llama, smollm3, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, lfm2"):
        model.from_gguf(dataclasses.replace(header("phi3"), metadata={**header("phi3").metadata,
                                                                       "general.architecture": "phi2"}))
    # rope_freqs on an arch llama.cpp does not read it for, and gemma2's output.weight: refused, not ignored
    with pytest.raises(ModelError, match="rope_freqs.weight is not one a qwen3 model reads"):
        cfg_of("qwen3", add=(TensorInfo("rope_freqs.weight", (32,), 0, 0, 128),))
    with pytest.raises(ModelError, match="output.weight is not one a gemma2 model reads"):
        cfg_of("gemma2", add=(TensorInfo("output.weight", (256, N_VOCAB), 0, 0, 4 * 256 * N_VOCAB),))
    # phi3 without its fused tensor: named
    with pytest.raises(ModelError, match="blk.0.attn_qkv.weight is missing"):
        cfg_of("phi3", drop=("blk.0.attn_qkv.weight",))
