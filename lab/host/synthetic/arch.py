"""Small synthetic GGUFs of each architecture the lab runs, for parity with llama.cpp without real weights
(CPython only: numpy and gguf-py's writer).

    path = build("gemma2", "q4_k_m", out_dir)      # the same bytes every time (fixed seeds), cached by name

Each `ArchSpec` gives an architecture's metadata keys at small shapes: 4 layers (6 for gemma3, whose pattern puts a
global layer every 6th, and for lfm2, whose first 6 layers hold 4 short-conv blocks and 2 attention layers),
grouped-query attention, head size 64 (256 for the gemmas), n_embd 256 (the K-quants need rows of whole 256-value
blocks). The tensors' names and shapes are the ones the lab's registry (lab.format.arches, llama.cpp's loaders' names:
phi3's fused attn_qkv and [gate | up] ffn_up, the per-head Q/K norms, the gemmas' post-norms, lfm2's short-conv blocks
and its final norm stored as token_embd_norm, ...) gives a model of those keys, less the optional ones the spec's file
leaves out (the head where tied, rope_freqs unless llama 3's, V where K stands for it): lab.host.synthetic.layout, which
also keeps the files' tensor order. What is this module's own: each tensor's role (its type in a mix, `MIXES`), the
std its values are drawn with, and the rules for the values that are not drawn as a matrix (norms, rope_freqs, ...).

Mixture-of-experts files too (a spec with a `Moe`: qwen3moe, a Mixtral-style llama, lfm2moe; docs/moe.md): the
registry gives the layout of the spec's dense architecture, whose FFN on
each routed layer lab.host.synthetic.moe replaces by the router and stacked experts llama.cpp's loaders create (3-D
tensors: [n_expert, rows, cols] here, ne = [cols, rows, n_expert] in the file). The router stays F32 in every mix, and
an expert tensor takes its dense counterpart's type, as llama.cpp's quantizer does.

A real vocabulary: the tokenizer metadata (every `tokenizer.*` key) is copied from one of the three real
models (SmolLM2's gpt2 BPE, Qwen2.5's, Gemma 3's SentencePiece), with `tokenizer.ggml.pre` overridden
where the spec says (llama-bpe for the Llama 3 file). The embedding table then has the real vocabulary's
rows (49152, 151936, 262144).

Weights: float weights drawn from one seed per tensor name (normal, std 1/sqrt(fan-in); norms 1 + 0.1 N),
written as F32, or quantized by gguf.quants (Q8_0: the same model, rounded). gguf-py cannot quantize the
K-quants or the i-quants, so those tensors are random VALID blocks instead (`random_blocks`): random quant
bytes, then each block's f16 scale (d) and minimum scale (dmin) set so that the block has mean ~0 and the
tensor's std, whatever the type's layout (found by dequantizing with d=1/dmin=0 and d=0/dmin=1). The
quantized variants are therefore other models than the F32 one, each checked against llama.cpp on itself.

What it does not know: llama.cpp (scripts/make_arch_fixtures.py runs it on these files) or the engine.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from lab.format import model
from lab.format.config import Config
from lab.host import models
from lab.host.synthetic import layout
from lab.host.synthetic.moe import SIGMOID, Moe, block_order as moe_block_order, moe_keys, with_experts

# byte offsets of a block's f16 d and dmin (None: the type has no dmin)
_D_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, None), "Q2_K": (80, 82), "Q3_K": (108, None),
             "IQ4_NL": (0, None), "IQ4_XS": (0, None), "Q4_0": (0, None), "Q5_0": (0, None)}


@dataclass(frozen=True)
class ArchSpec:
    arch: str
    vocab: str                  # lab.host.models name whose tokenizer metadata is copied
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_embd: int = 256
    tied: bool = True
    extra: dict = field(default_factory=dict)        # "{arch}." keys beyond the shapes
    overrides: dict = field(default_factory=dict)    # tokenizer keys replaced (tokenizer.ggml.pre)
    rope_freqs: bool = False    # llama 3: rope_freqs.weight [head_dim/2] (the scaling factors)
    kv_per_layer: tuple[int, ...] = ()     # lfm2: attention.head_count_kv as an array, 0 for a short-conv layer
    ff_per_layer: tuple[int, ...] = ()     # gemma4: feed_forward_length as an array (double-wide shared-KV layers)
    v_is_k: bool = False                   # gemma4: full layers without attn_v (attention_k_eq_v: V is K's projection)
    # general.name's spec part where the spec's own would trip llama.cpp: it matches general.name against "phi3" /
    # "phi-3" and then looks up Phi-3's own "</s>" token (unordered_map::at on a vocabulary without it)
    label: str = ""
    moe: Moe | None = None      # routed experts (lab.host.synthetic.moe): their keys and tensors replace a dense FFN
    not_run: str = ""           # why the lab refuses this file today, with the issue that asks for it ("": it runs)


def llama3_factors(n_rot: int, base: float, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                   orig_ctx: int = 256) -> np.ndarray:
    """Llama 3's rope_freqs as its HF converter computes them: wavelengths past orig_ctx/low divided by
    `factor`, under orig_ctx/high kept, smoothed between. orig_ctx is small here (Llama 3.1: 8192) so that
    the factors change angles at the few tens of positions a test runs."""
    freqs = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    wavelen = 2 * np.pi / freqs
    out = np.ones_like(freqs)
    for i, w in enumerate(wavelen):
        if w > orig_ctx / low:
            out[i] = factor
        elif w >= orig_ctx / high:
            smooth = (orig_ctx / w - low) / (high - low)
            out[i] = 1.0 / ((1 - smooth) / factor + smooth)
    return out.astype(np.float32)


SPECS: dict[str, ArchSpec] = {
    # Llama 3.x: rope_freqs, tied head (3.2 1B/3B tie), base 500000, llama-bpe pre-tokenizer
    "llama3": ArchSpec("llama", "smollm2", 4, 4, 2, 64, 512, tied=True, rope_freqs=True,
                       extra={"rope.freq_base": 500000.0, "context_length": 8192},
                       overrides={"tokenizer.ggml.pre": "llama-bpe"}),
    # Mistral-style: llama architecture, untied head, GQA 4:1, attention.sliding_window (llama.cpp never reads it)
    "mistral": ArchSpec("llama", "smollm2", 4, 4, 1, 64, 512, tied=False,
                        extra={"rope.freq_base": 1000000.0, "context_length": 32768, "attention.sliding_window": 8}),
    # SmolLM3-3B-shaped: llama's layout, GQA 4:1, base 5e6, tied; 8 layers so that two (3 and 7) have no RoPE
    "smollm3": ArchSpec("smollm3", "smollm2", 8, 4, 1, 64, 512, tied=True,
                        extra={"rope.freq_base": 5000000.0, "context_length": 65536}),
    # Qwen3: Q/K norms per head, no biases, NeoX RoPE, head size 64 with q width 256 + ... (key_length given)
    "qwen3": ArchSpec("qwen3", "qwen2.5", 4, 4, 2, 64, 512, tied=True,
                      extra={"rope.freq_base": 1000000.0, "context_length": 40960, "attention.key_length": 64,
                             "attention.value_length": 64}),
    # Phi-3: fused QKV and [gate | up]; its sliding_window key is read and switched off by llama.cpp
    "phi3": ArchSpec("phi3", "smollm2", 4, 4, 2, 64, 512, tied=False, label="phi",
                     extra={"rope.freq_base": 10000.0, "context_length": 4096, "rope.dimension_count": 64,
                            "attention.sliding_window": 8}),
    # Gemma 2: soft-caps small enough to bind on random weights, window 8 (prompts cross it), pattern 2
    "gemma2": ArchSpec("gemma2", "gemma3", 4, 2, 1, 256, 512, tied=True,
                       extra={"rope.freq_base": 10000.0, "context_length": 8192, "attention.key_length": 256,
                              "attention.value_length": 256, "attention.sliding_window": 8,
                              "attn_logit_softcapping": 2.0, "final_logit_softcapping": 8.0}),
    # Gemma 3 1B-shaped: head 256, 6 layers (5 sliding at base 10000, 1 global at 1e6)
    "gemma3": ArchSpec("gemma3", "gemma3", 6, 2, 1, 256, 512, tied=True,
                       extra={"rope.freq_base": 1000000.0, "context_length": 32768, "attention.key_length": 256,
                              "attention.value_length": 256, "attention.sliding_window": 8}),
    # LFM2-350M / 1.2B-shaped (LiquidAI's config.json: layer_types conv, conv, full_attention, conv, conv,
    # full_attention, ... (full_attn_idxs 2, 5, 8, 10, 12, 14 of 16), conv_L_cache 3, 16 query heads over 8 (350M) or
    # 32 over 8 (1.2B) KV heads of 64, rope_theta 1e6, norm_eps 1e-5, tied embeddings): its first 6 layers, 4 short-conv
    # blocks and 2 GQA attention layers, with n_head x head_dim = n_embd as lfm2 needs
    "lfm2": ArchSpec("lfm2", "smollm2", 6, 4, 2, 64, 512, tied=True, kv_per_layer=(0, 0, 2, 0, 0, 2),
                     extra={"rope.freq_base": 1000000.0, "context_length": 128000, "shortconv.l_cache": 3}),
    # Qwen3.5-shaped (0.8B / 2B config.json: gated delta-net layers with a full-attention layer every 4th, 16 key and
    # 16 value heads of 128, conv kernel 4; attention 8 query heads over 2 KV heads of 256 with an output gate, 25% of
    # each head rotated by IMROPE with sections [11, 11, 10], rope_theta 1e7, rms eps 1e-6, tied embeddings): 6 layers
    # with an interval of 3 (layers 2 and 5 attend: a recurrent layer after an attention layer, and the key other
    # than the default), 2 key heads under 4 value heads (the broadcast of q and k over value heads), heads of 64
    # (value width 256: whole K-quant blocks for ssm_out), attention 4 query heads over 1 KV head of 64 with 16 rotated
    # dims in sections [3, 3, 2, 0]; SmolLM2's vocabulary (the 49,152-row table keeps the F32 file at 60 MB, and the
    # device runs can build it from the one real model they carry)
    "qwen35": ArchSpec("qwen35", "smollm2", 6, 4, 1, 64, 512, tied=True,
                       extra={"rope.freq_base": 10000000.0, "context_length": 262144, "attention.key_length": 64,
                              "attention.value_length": 64, "rope.dimension_count": 16,
                              "rope.dimension_sections": [3, 3, 2, 0], "full_attention_interval": 3,
                              "ssm.conv_kernel": 4, "ssm.state_size": 64, "ssm.group_count": 2,
                              "ssm.time_step_rank": 4, "ssm.inner_size": 256}),
    # Gemma 4 E2B / E4B-shaped (google/gemma-4-E2B config.json: sliding layers with heads of 256 over 1 KV head and a
    # full layer every 5th with heads of 512 (global_head_dim) whose RoPE is "proportional" (25% of the pairs rotate:
    # rope_freqs 1 then 1e30), the last 20 of 35 layers reading the K/V of the last two layers that have their own
    # (num_kv_shared_layers), double-wide FFNs on those, per-layer token embeddings of 256 per layer, final logit
    # soft-cap 30, attention scale 1, sliding base 1e4 / full 1e6): 7 layers [S S F S F | S F], the last two sharing
    # layers 3 (sliding) and 4 (full); sliding heads of 64 over 2 KV heads, full heads of 128 over 1 KV head (per-layer
    # head_count_kv); n_ff 256, 512 on the shared layers; 32 per-layer embedding dims (the [224, 49152] table keeps
    # the F32 file small); a soft-cap of 15 that binds on random weights (8 left llama.cpp near-ties in the first greedy
    # step of the Q4_K_M mix); SmolLM2's vocabulary
    "gemma4": ArchSpec("gemma4", "smollm2", 7, 4, 2, 64, 256, tied=True, kv_per_layer=(2, 2, 1, 2, 1, 2, 1),
                       ff_per_layer=(256, 256, 256, 256, 256, 512, 512),
                       extra={"rope.freq_base": 1000000.0, "rope.freq_base_swa": 10000.0, "context_length": 131072,
                              "attention.key_length": 128, "attention.value_length": 128,
                              "attention.key_length_swa": 64, "attention.value_length_swa": 64,
                              "rope.dimension_count": 128, "rope.dimension_count_swa": 64,
                              "attention.sliding_window": 8,
                              "attention.sliding_window_pattern": [True, True, False, True, False, True, False],
                              "attention.shared_kv_layers": 2, "embedding_length_per_layer_input": 32,
                              "final_logit_softcapping": 15.0}),
}
# The same shape with attention_k_eq_v (as the pages on Gemma 4 describe its full layers): no attn_v on the full
# layers, whose V is then K's projection (llama.cpp: "if v_proj is not present, use k_proj")
SPECS["gemma4kv"] = replace(SPECS["gemma4"], v_is_k=True)

# Mixture-of-experts files (lab.host.synthetic.moe: the router and stacked experts, with the llama.cpp source of each
# fact), held to llama.cpp by their fixtures (docs/moe.md). In each, n_embd (256), an expert's width (512) and a dense
# FFN's width differ, so that a swapped dimension shows in a shape; every width is whole K-quant blocks of 256.
SPECS.update({
    # Qwen3-30B-A3B-shaped (Qwen/Qwen3-30B-A3B config.json: hidden 2048, 48 layers, 32 query heads over 4 KV heads of
    # 128, so q is twice n_embd wide; 128 experts of moe_intermediate_size 768, 8 a token, norm_topk_prob true, no
    # shared experts, intermediate_size 6144, Q/K norms as qwen3, rope_theta 1e6, rms eps 1e-6, untied head).
    # llama.cpp (src/models/qwen3moe.cpp): softmax router, top expert_used_count, weights renormalised (norm_w true),
    # no expert_weights_scale read; experts expert_feed_forward_length wide. Here: 4 layers of 256, 8 query heads over
    # 1 KV head of 64 (the release's 8:1, and q twice n_embd wide as in it), 8 experts of 512, 2 a token;
    # feed_forward_length 1024 = 2 x 512, the release's relation (6144 = 8 x 768; llama.cpp reads it only where
    # expert_feed_forward_length is absent); SmolLM2's vocabulary
    "qwen3moe": ArchSpec("qwen3moe", "smollm2", 4, 8, 1, 64, 1024, tied=False,
                         moe=Moe("qwen3", n_expert=8, n_expert_used=2, n_ff_exp=512),
                         extra={"rope.freq_base": 1000000.0, "context_length": 40960, "attention.key_length": 64,
                                "attention.value_length": 64}),
    # Mixtral-style (Mixtral-8x7B: a llama file with 8 experts of feed_forward_length 14336, 2 a token, 32 query heads
    # over 8 KV heads of 128, rope_theta 1e6, untied head). llama.cpp runs it through the llama graph's MoE branch
    # (src/models/llama.cpp: a layer with ffn_gate_inp; softmax, norm_w true, experts feed_forward_length wide, no
    # expert_feed_forward_length key). Here: 4 layers of 256, 4 query heads over 1 KV head of 64, 8 experts of 512, 2 a
    # token; SmolLM2's vocabulary
    "mixtral": ArchSpec("llama", "smollm2", 4, 4, 1, 64, 512, tied=False,
                        moe=Moe("llama", n_expert=8, n_expert_used=2),
                        extra={"rope.freq_base": 1000000.0, "context_length": 32768}),
    # LFM2-8B-A1B-shaped (transformers' Lfm2MoeConfig, whose defaults are that model's: hidden 2048, 32 query heads over
    # 8 KV heads, intermediate_size 7168 on the num_dense_layers 2 leading dense layers, 32 experts of
    # moe_intermediate_size 1792, 4 a token, use_expert_bias, norm_topk_prob, routed_scaling_factor 1, rope_theta 1e6,
    # norm_eps 1e-5, tied; llama.cpp names the 24-layer model 8B-A1B). llama.cpp's converter (LFM2MoeModel) writes
    # expert_feed_forward_length, leading_dense_block_count and expert_gating_func = 2 (sigmoid); its graph
    # (src/models/lfm2.cpp, build_moe_feed_forward) routes by the file's gating function with exp_probs_b.bias added
    # for the choice only, norm_w true, no expert_weights_scale read. Here: the lfm2 spec's 6 layers (short-conv,
    # short-conv, attention, short-conv, short-conv, attention), the first 2 dense (n_ff 1024, twice an expert; the
    # release's are 4 times), the other 4 routed (both layer kinds) over 8 experts of 512, 2 a token
    "lfm2moe": ArchSpec("lfm2moe", "smollm2", 6, 4, 2, 64, 1024, tied=True, kv_per_layer=(0, 0, 2, 0, 0, 2),
                        moe=Moe("lfm2", n_expert=8, n_expert_used=2, n_ff_exp=512, n_dense_lead=2, gating=SIGMOID,
                                probs_bias=True),
                        extra={"rope.freq_base": 1000000.0, "context_length": 128000, "shortconv.l_cache": 3}),
})

_Q4_K_M = {"token_embd": "Q4_K", "output": "Q6_K", "attn_q": "Q4_K", "attn_k": "Q4_K", "attn_qkv": "Q4_K",
           "attn_v": ("Q4_K", "Q6_K"), "attn_output": "Q4_K", "ffn_gate": "Q4_K", "ffn_up": "Q4_K",
           "ffn_down": ("Q4_K", "Q6_K"), "shortconv_in_proj": "Q4_K", "shortconv_out_proj": "Q4_K",
           "attn_gate": "Q4_K", "ssm_out": "Q4_K", "per_layer_model_proj": "Q4_K", "inp_gate": "Q4_K",
           # rows of 32 and 224 (the synthetic gemma4's per-layer width) are no K-quant block: Q8_0
           "per_layer_token_embd": "Q8_0", "per_layer_proj": "Q8_0"}
# Type mixes: role -> type, or (type, type of the first and last layers) as llama.cpp's _M mixes give
# attn_v and ffn_down more bits there. Mixes whose types the kernels do not read yet are left out by
# `mixes()`, so adding a type to lab.format.ggml.KERNEL_TYPES adds its variant.
MIXES: dict[str, dict] = {
    "f32": {},                    # every tensor F32
    "q8_0": {"*": "Q8_0"},        # every matrix Q8_0, quantized from the F32 weights
    "q4_k_m": _Q4_K_M,
    "q3_k_m": {**_Q4_K_M, "token_embd": "Q3_K", "attn_q": "Q3_K", "attn_k": "Q3_K", "attn_qkv": "Q3_K",
               "ffn_gate": "Q3_K", "ffn_up": "Q3_K", "attn_output": "Q2_K", "attn_v": ("IQ4_XS", "Q6_K"),
               "ffn_down": ("IQ4_NL", "Q6_K")},
}


def mix_types(mix: str) -> set[str]:
    out = {"F32"}
    for v in MIXES[mix].values():
        out.update(v if isinstance(v, tuple) else (v,))
    return out


def mixes() -> list[str]:
    """The mixes whose every type the kernels read (lab.format.ggml.KERNEL_TYPES)."""
    from lab.format.ggml import KERNEL_TYPES
    return [m for m in MIXES if mix_types(m) <= set(KERNEL_TYPES)]


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little")


def _type_for(mix: str, role: str, il: int, n_layer: int) -> str:
    m = MIXES[mix]
    t = m.get(role, m.get(_DENSE_ROLE.get(role, role), m.get("*", "F32")))
    if isinstance(t, tuple):
        return t[1] if il in (0, n_layer - 1) else t[0]
    return t


def random_blocks(type_name: str, rows: int, cols: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Valid blocks of a type gguf-py cannot quantize: random quant bytes, then per block d (and dmin) chosen
    so the block dequantizes to mean ~0 and standard deviation `std`. Returns uint8 [rows, row_bytes]."""
    import gguf
    from gguf.quants import dequantize
    qt = gguf.GGMLQuantizationType[type_name]
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    nb = rows * cols // block
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    d_off, m_off = _D_FIELDS[type_name]

    def with_scales(d: float, m: float) -> np.ndarray:
        r = raw.copy()
        r[:, d_off:d_off + 2] = np.full(nb, d, np.float16).view(np.uint8).reshape(-1, 2)
        if m_off is not None:
            r[:, m_off:m_off + 2] = np.full(nb, m, np.float16).view(np.uint8).reshape(-1, 2)
        return dequantize(r, qt).reshape(nb, block).astype(np.float64)

    a = with_scales(1.0, 0.0)                  # the part of each value d multiplies
    sd = a.std(axis=1)
    d = std / np.where(sd > 0, sd, 1.0)
    if m_off is not None:
        b = with_scales(0.0, 1.0)              # the part dmin multiplies (already signed)
        mb = b.mean(axis=1)
        dmin = np.where(mb != 0, -d * a.mean(axis=1) / np.where(mb != 0, mb, 1.0), 0.0)
        raw[:, m_off:m_off + 2] = dmin.astype(np.float16).view(np.uint8).reshape(-1, 2)
    raw[:, d_off:d_off + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, cols // block * nbytes)


def _tokenizer_fields(name: str):
    from gguf import GGUFReader
    r = GGUFReader(str(models.path(name)))
    return [(k, f) for k, f in r.fields.items() if k.startswith("tokenizer.")]


def _keys(spec: ArchSpec) -> dict:
    """The "{arch}." metadata keys of spec's file, in the order they are written (the experts' last)."""
    return {**layout.size_keys(spec), f"{spec.arch}.attention.layer_norm_rms_epsilon": 1e-6,
            **{f"{spec.arch}.{k}": v for k, v in spec.extra.items()},
            **(moe_keys(spec.moe, spec.arch) if spec.moe else {})}


# Roles named otherwise than their tensors (the mixes and build's value rules use the roles)
_ROLES = {"layer_output_scale": "out_scale", "proj": "per_layer_proj"}
# The std of the roles not drawn as a matrix of their fan-in: the [n_vocab, width] embeddings (tied heads: logits of
# std ~4); qwen35's dt bias and A's log (ssm_a = -exp(A_log)); the experts' selection bias, a quarter of the spread of
# the sigmoid router probabilities on these weights (std 0.21 on the lfm2moe file): it changes 34 of the 108 choices
# of the F32 file's prompt (4 routed layers, 27 positions); qwen2's Q/K/V biases, small next to the projections' outputs
# (std ~1) as trained ones are
_STD = {"token_embd": 0.25, "output": 0.25, "per_layer_token_embd": 0.25, "ssm_dt": 1.0, "ssm_a": 0.5,
        "exp_probs_b": 0.05, "qkv_bias": 0.1}
# Roles F32 in every mix: a conv kernel (rows of a few taps are no quant block), the router (llama.cpp's quantizer
# never quantizes ffn_gate_inp: tensor_allows_quantization in src/llama-quant.cpp), the experts' selection bias and
# qwen2's Q/K/V biases (vectors)
_F32_ROLES = {"shortconv_conv", "ffn_gate_inp", "exp_probs_b", "qkv_bias"}
# An expert tensor takes its dense counterpart's type in a mix (src/llama-quant.cpp tensor_get_category: a name holding
# "ffn_down" is FFN_DOWN, ffn_down_exps too)
_DENSE_ROLE = {"ffn_gate_exps": "ffn_gate", "ffn_up_exps": "ffn_up", "ffn_down_exps": "ffn_down"}


def _role(cfg: Config, name: str, shape: tuple[int, ...]) -> str:
    """A tensor's role: the name within its block (dots as underscores), but "norm" for a norm, "qk_norm" for the Q/K
    norms of a Config whose q.k is unscaled (their values carry the scale), "shortconv_conv" for a conv kernel (F32 in
    every mix: rows of a few taps are no quant block)."""
    stem = name.split(".", 2)[2] if name.startswith("blk.") else name
    if stem in ("attn_q.bias", "attn_k.bias", "attn_v.bias"):     # qwen2's: drawn nonzero, so a bias shows in a test
        return "qkv_bias"
    stem = stem.removesuffix(".weight").removesuffix(".bias")
    if stem in ("attn_q_norm", "attn_k_norm") and cfg.attn_scale == 1.0:
        return "qk_norm"
    if len(shape) == 1 and stem.endswith("norm"):
        return "norm"
    if model.is_flat(name):
        return "shortconv_conv"
    return _ROLES.get(stem, stem.replace(".", "_"))


def _std(role: str, shape: tuple[int, ...]) -> float:
    """The standard deviation a tensor's values are drawn with: _STD's, else a matrix's (or a stack of experts')
    1/sqrt(fan-in); 0 for the other vectors (build draws them by rules of their own)."""
    if role in _STD:
        return _STD[role]
    return 1.0 / np.sqrt(shape[-1]) if len(shape) >= 2 else 0.0


def _block_order(cfg: Config, il: int) -> tuple[str, ...]:
    """A block's file order in a file with experts: the dense one's, the router and experts after ffn_norm."""
    return moe_block_order(layout.block_order(cfg, il))


def _table(spec: ArchSpec, n_vocab: int) -> tuple[Config, list[tuple[str, str, tuple[int, ...], float]]]:
    """The Config of spec's file (a vocabulary of n_vocab) and its tensor_table. A file with experts: the Config and
    table of its dense architecture's file of the same keys (the registry knows no experts), each routed layer's FFN
    then replaced by its router and experts (lab.host.synthetic.moe)."""
    dense = replace(spec, arch=spec.moe.dense, moe=None) if spec.moe else spec
    cfg, shapes = layout.registry(dense.arch, _keys(dense), n_vocab, tied=spec.tied, rope_scaling=spec.rope_freqs,
                                  v_is_k=spec.v_is_k)
    if spec.moe:
        shapes = with_experts(spec.moe, cfg.n_layer, cfg.n_embd, spec.n_ff, shapes)
    out = []
    for name, gguf_shape in layout.in_order(cfg, shapes, layout.head, _block_order if spec.moe else layout.block_order):
        shape = gguf_shape[::-1]
        role = _role(cfg, name, shape)
        out.append((name, role, shape, _std(role, shape)))
    return cfg, out


def tensor_table(spec: ArchSpec, n_vocab: int) -> list[tuple[str, str, tuple[int, ...], float]]:
    """(name, role, numpy shape (rows, cols), (n_expert, rows, cols) or (n,), std) of every tensor, in file order: the
    names and shapes the registry gives a model of the spec's keys (lab.host.synthetic.layout), with a vocabulary of
    n_vocab, and the experts' (lab.host.synthetic.moe)."""
    return _table(spec, n_vocab)[1]


def file_name(name: str, mix: str) -> str:
    return f"synthetic-{name}-{mix}.gguf"


def _values(cfg: Config, mix: str, role: str, il: int, shape: tuple[int, ...], std: float,
            rng: np.random.Generator):
    """(data, raw_dtype) of one tensor as gguf-py's add_tensor takes them: its values drawn by its role, in the type
    the mix gives the role (raw_dtype None: data is float32)."""
    import gguf
    from gguf.quants import quantize
    if role == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32), None
    if role == "qk_norm":   # attention scale 1 (gemma4): q.k of std ~1 rather than ~sqrt(head size), so that the
        # softmax is not one-hot and llama.cpp's float16 GELU table moves the logits by less than F32_TOL
        return ((1.0 + 0.1 * rng.standard_normal(shape)) * shape[0] ** -0.25).astype(np.float32), None
    if role == "rope_freqs" and cfg.rope_freqs_full:   # proportional RoPE: a quarter of the pairs turn
        turn = shape[0] // 4
        return np.array([1.0] * turn + [1e30] * (shape[0] - turn), np.float32), None
    if role == "rope_freqs":
        return llama3_factors(shape[0] * 2, float(cfg.rope_base)), None
    if role == "out_scale":     # layer_output_scale: one multiplier of the block's output, away from 1
        return (0.6 + 0.2 * rng.random(shape)).astype(np.float32), None
    if role in ("ssm_a", "ssm_dt"):     # A = -exp(A_log): every value a decay; dt's bias about N(0, 1)
        v = rng.standard_normal(shape)
        return (-np.exp(std * v) if role == "ssm_a" else std * v).astype(np.float32), None
    ttype = "F32" if role in _F32_ROLES else _type_for(mix, role, il, cfg.n_layer)
    if ttype == "F32":
        return (std * rng.standard_normal(shape)).astype(np.float32), None
    if ttype == "Q8_0":
        q8 = gguf.GGMLQuantizationType.Q8_0
        return quantize((std * rng.standard_normal(shape)).astype(np.float32), q8), q8
    rows = int(np.prod(shape[:-1]))         # a stack of experts: their rows one after another
    blocks = random_blocks(ttype, rows, shape[-1], std, rng)
    return blocks.reshape(*shape[:-1], blocks.shape[-1]), gguf.GGMLQuantizationType[ttype]


def build(name: str, mix: str, out_dir: Path, force: bool = False) -> Path:
    """Write (or reuse) the synthetic GGUF of architecture spec `name` in type mix `mix` under out_dir."""
    return build_spec(SPECS[name], name, mix, out_dir, force)


def build_spec(spec: ArchSpec, name: str, mix: str, out_dir: Path, force: bool = False) -> Path:
    """`build` for a spec outside SPECS (a test's own file: every spec of SPECS needs llama.cpp's fixtures), its
    values drawn from seeds of `name` as build's are."""
    import gguf
    path = Path(out_dir) / file_name(name, mix)
    if path.exists() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")     # two builders at once never share a half-written file
    tok = _tokenizer_fields(spec.vocab)
    n_vocab = len(next(f for k, f in tok if k == "tokenizer.ggml.tokens").contents())
    w = gguf.GGUFWriter(str(tmp), spec.arch)
    w.add_name(f"synthetic {spec.label or name} {mix}")
    w.add_uint32("general.file_type", 0 if mix == "f32" else 7 if mix == "q8_0" else 15)
    layout.put(w, _keys(spec))
    for k, f in tok:
        vt = f.types[0]
        value = spec.overrides.get(k, f.contents())
        w.add_key_value(k, value, vt, f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)

    cfg, table = _table(spec, n_vocab)
    for tname, role, shape, std in table:
        rng = np.random.default_rng(_seed(name, tname))          # per tensor: independent of the mix and order
        il = int(tname.split(".")[1]) if tname.startswith("blk.") else -1
        data, raw_dtype = _values(cfg, mix, role, il, shape, std, rng)
        w.add_tensor(tname, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path
