"""Synthetic GGUFs with exactly the tensor names, shapes and quant types of the real models, filled with
random but valid blocks, so benchmarks run on a GPU machine without copying model files there
(CPython only: numpy and gguf-py's writer).

`SPECS` are the releases `lab bench --synthetic NAME` offers. The first three carry their real files' own per-layer
type mix; the others (Llama 3.2 1B and 3.1 8B, and the 2026 shelf: SmolLM3-3B, LFM2-350M and 1.2B, Qwen3.5-0.8B and
2B, Gemma 4 E2B and E4B, each from its published config.json) are Q4_K_M as llama-quantize writes it: every tensor's
type chosen by `q4_k_m_types`, a port of llama.cpp's rule that tests/engine/test_sameshape_models.py holds to
llama-quantize's own dry run. `SMALL` are small variants of the new architectures (few layers, n_embd 256, 512 tokens)
made by the same code, for tests that must load and run them in seconds. The weights are noise: the output is
gibberish, the timing is the real model's.

A spec gives a release's metadata keys; its tensors' names and shapes are the ones the lab's registry
(lab.format.arches) gives a model of those keys, less the head where it is tied and rope_freqs where nothing needs it,
in the order these files have always had (lab.host.synthetic.layout). Every file's header is read back by the lab
(lab.format.model.from_gguf) before a byte of data is written, so a spec whose keys the lab would refuse fails at once.
`write(..., vocab=True)` adds a placeholder vocabulary so llama.cpp (which refuses a file without one) loads
the same file; `lab bench --synthetic` writes it that way too, so both benchmark the same bytes. The tensors are
written one at a time after the header: peak memory is a small multiple of the largest tensor, not the file
(0.78 GB resident for the 4.9 GB llama3.1-8b). `cached(name)` keeps one under the lab's cache directory.

What it does not know: the tokenizer of any release (the placeholder vocabulary is not one), or how the engine runs
the file.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.format import gguf as gguf_header
from lab.format import model
from lab.format.config import Config
from lab.format.ggml import BY_NAME
from lab.host import models
from lab.host.reference.quant import RANDOM_CODES, put_iq1_m_d
from lab.host.synthetic import layout
from lab.host.synthetic.arch import llama3_factors


@dataclass(frozen=True)
class Spec:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    # role -> type name, or (type, other type, layers with the other): a real file's own mix; or "Q4_K_M": each
    # tensor's type as llama-quantize gives it (q4_k_m_types)
    types: dict | str
    extra: dict          # metadata beyond the shapes: float, int (uint32) or list (array) values
    rope_scaling: tuple | None = None   # llama 3's rope_freqs.weight: (factor, low, high, original context)
    tied: bool = True    # no output.weight: the head is token_embd
    kv_per_layer: tuple[int, ...] = ()  # lfm2: attention.head_count_kv per layer, 0 for a short-conv block
    ff_per_layer: tuple[int, ...] = ()  # gemma4: feed_forward_length per layer (E2B's double-wide shared-KV layers)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def q4_k_m_types(table: list[tuple[str, int, int]], n_layer: int) -> dict[str, str]:
    """The type llama-quantize gives each tensor (name, rows, cols) of an F32 file asked for Q4_K_M, without an
    imatrix or overrides, as src/llama-quant.cpp (vendored in llama-cpp-python 0.3.36) decides it:
    tensor_allows_quantization keeps 1-D tensors, names not ending in "weight", norms, the convs' kernels
    (shortconv.conv, ssm_conv1d) and gemma4's per_layer_model_proj as they are (F32 here); llama_tensor_get_type_impl
    gives output.weight, and the token embeddings (token_embd and gemma4's per_layer_token_embd: one category) when the
    head is tied, Q6_K (Q8_0 for rows not of whole 256-blocks); attn_v and attn_qkv (the
    "attention-v-like" tensors: qwen35's delta-net in-projection counts as one) Q6_K where use_more_bits(i, n) for
    the i-th of the n such tensors, ffn_down Q6_K where use_more_bits(i, n_layer) for the i-th ffn_down; every other
    matrix Q4_K (the ftype's default). The counters run in the order llama-quantize visits tensors: its
    weights_map, sorted by block number, then by name. scripts/make_mixed_fixtures.py records what llama-quantize
    --dry-run says for each spec and tests/engine/test_sameshape_models.py holds this function to it."""
    order = sorted(table, key=lambda t: (_layer(t[0]), t[0]))
    tied = not any(name == "output.weight" for name, _, _ in table)
    v_like = lambda name: "attn_v.weight" in name or "attn_qkv.weight" in name    # noqa: E731
    n_v = sum(v_like(name) for name, _, _ in table)
    i_v = i_down = 0
    out = {}
    for name, rows, cols in order:
        if rows == 1 or not name.endswith("weight") or "_norm.weight" in name or "shortconv.conv" in name \
                or "ssm_conv1d" in name or "per_layer_model_proj" in name:
            out[name] = "F32"
            continue
        if name == "output.weight" or (tied and name in ("token_embd.weight", "per_layer_token_embd.weight")):
            out[name] = "Q6_K" if cols % 256 == 0 else "Q8_0"
            continue
        t = "Q4_K"
        if v_like(name):
            t = "Q6_K" if _use_more_bits(i_v, n_v) else "Q4_K"
            i_v += 1
        elif "ffn_down" in name:
            t = "Q6_K" if _use_more_bits(i_down, n_layer) else "Q4_K"
            i_down += 1
        if cols % 256:
            # llama.cpp would fall back to a 32-block type (tensor_type_fallback); no spec here has such a matrix
            raise ValueError(f"{name}: rows of {cols} values are not whole 256-blocks for {t}")
        out[name] = t
    return out


def _llama3(n_vocab: int, head_dim: int) -> dict:
    return {"general.file_type": 15, "llama.vocab_size": n_vocab, "llama.attention.layer_norm_rms_epsilon": 1e-5,
            "llama.rope.freq_base": 500000.0, "llama.context_length": 131072, "llama.rope.dimension_count": head_dim}


def _smollm3(n_vocab: int, head_dim: int) -> dict:
    return {"general.file_type": 15, "smollm3.vocab_size": n_vocab, "smollm3.attention.layer_norm_rms_epsilon": 1e-6,
            "smollm3.rope.freq_base": 5000000.0, "smollm3.context_length": 65536,
            "smollm3.rope.dimension_count": head_dim}


def _lfm2(n_vocab: int = 65536) -> dict:
    return {"general.file_type": 15, "lfm2.vocab_size": n_vocab, "lfm2.attention.layer_norm_rms_epsilon": 1e-5,
            "lfm2.rope.freq_base": 1000000.0, "lfm2.context_length": 128000, "lfm2.shortconv.l_cache": 3}


def _qwen35(ssm_heads: int) -> dict:
    """Qwen3.5's keys as llama.cpp's converter writes them (conversion/qwen.py: Qwen3NextModel, _Qwen35MRopeMixin):
    head size 256 as key and value length, rope.dimension_count 64 = 256 x partial_rotary_factor 0.25, the sections
    [11, 11, 10, 0], the delta-net's heads (ssm.group_count key heads, ssm.time_step_rank value heads) of
    ssm.state_size 128, ssm.inner_size = value heads x 128, conv kernel 4, full attention every 4th layer."""
    return {"general.file_type": 15, "qwen35.context_length": 262144,
            "qwen35.attention.layer_norm_rms_epsilon": 1e-6, "qwen35.rope.freq_base": 10000000.0,
            "qwen35.attention.key_length": 256, "qwen35.attention.value_length": 256,
            "qwen35.rope.dimension_count": 64, "qwen35.rope.dimension_sections": [11, 11, 10, 0],
            "qwen35.ssm.conv_kernel": 4, "qwen35.ssm.state_size": 128, "qwen35.ssm.group_count": ssm_heads,
            "qwen35.ssm.time_step_rank": ssm_heads, "qwen35.ssm.inner_size": ssm_heads * 128,
            "qwen35.full_attention_interval": 4}


def _gemma4(n_layer: int, full_every: int, shared: int, hd_swa: int = 256, hd_full: int = 512) -> dict:
    """Gemma 4's keys as llama.cpp's converter writes them (conversion: Gemma4Model): heads of 256 on sliding layers
    (key_length_swa, all of them rotated at base 1e4), 512 on full ones (key_length, global_head_dim) with RoPE base
    1e6 over all 512 dims, of which rope_freqs.weight (factor 1 on the first quarter of the pairs, 1e30 on the rest)
    keeps the partial_rotary_factor 0.25 of "proportional" RoPE; a full layer every `full_every`-th (layer_types);
    the last `shared` layers reading earlier layers' K/V; per-layer input embeddings of 256; final soft-cap 30."""
    return {"general.file_type": 15, "gemma4.context_length": 131072, "gemma4.attention.layer_norm_rms_epsilon": 1e-6,
            "gemma4.rope.freq_base": 1000000.0, "gemma4.rope.freq_base_swa": 10000.0,
            "gemma4.attention.key_length": hd_full, "gemma4.attention.value_length": hd_full,
            "gemma4.attention.key_length_swa": hd_swa, "gemma4.attention.value_length_swa": hd_swa,
            "gemma4.rope.dimension_count": hd_full, "gemma4.rope.dimension_count_swa": hd_swa,
            "gemma4.attention.sliding_window": 512,
            "gemma4.attention.sliding_window_pattern": [(il + 1) % full_every != 0 for il in range(n_layer)],
            "gemma4.attention.shared_kv_layers": shared, "gemma4.embedding_length_per_layer_input": 256,
            "gemma4.final_logit_softcapping": 30.0}


def _lfm2_kv(n_head_kv: int, attention=(2, 5, 8, 10, 12, 14), n_layer: int = 16) -> tuple[int, ...]:
    """lfm2.attention.head_count_kv as llama.cpp's converter writes it: the KV heads on attention layers, 0 on conv."""
    return tuple(n_head_kv if il in attention else 0 for il in range(n_layer))


_QWEN_MORE_BITS = (0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21)
_GEMMA_MORE_BITS = (0, 1, 4, 7, 10, 13, 15, 16, 17)
SPECS = {
    "smollm2": Spec("llama", 30, 576, 9, 3, 64, 1536, 49152, {
        "token_embd": "Q8_0", **{r: "Q4_1" for r in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                      "ffn_up", "ffn_down")}},
        {"llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 100000.0, "llama.context_length": 8192, "llama.rope.dimension_count": 64}),
    "qwen2.5": Spec("qwen2", 24, 896, 14, 2, 64, 4864, 151936, {
        "token_embd": "Q5_0", "output": "Q8_0", "attn_q": "Q5_0", "attn_k": "Q5_0",
        "attn_v": ("Q5_0", "Q8_0", _QWEN_MORE_BITS), "attn_output": "Q5_0", "ffn_gate": "Q5_0", "ffn_up": "Q5_0",
        "ffn_down": ("Q4_K", "Q6_K", _QWEN_MORE_BITS)},
        {"qwen2.attention.layer_norm_rms_epsilon": 1e-6, "qwen2.rope.freq_base": 1000000.0, "qwen2.context_length": 32768},
        tied=False),
    "gemma3": Spec("gemma3", 18, 640, 4, 1, 256, 2048, 262144, {
        "token_embd": "Q8_0", "attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": ("Q5_0", "Q8_0", _GEMMA_MORE_BITS),
        "attn_output": "Q4_K", "ffn_gate": "Q5_0", "ffn_up": "Q5_0", "ffn_down": ("Q4_K", "Q6_K", _GEMMA_MORE_BITS)},
        {"gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.rope.freq_base": 1000000.0, "gemma3.context_length": 32768, "gemma3.attention.sliding_window": 512,
         "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256}),
    # Llama 3.2 1B (tied head) and Llama 3.1 8B in Q4_K_M, with their rope_scaling as rope_freqs.weight
    "llama3.2-1b": Spec("llama", 16, 2048, 32, 8, 64, 8192, 128256, "Q4_K_M", _llama3(128256, 64),
                        rope_scaling=(32.0, 1.0, 4.0, 8192)),
    "llama3.1-8b": Spec("llama", 32, 4096, 32, 8, 128, 14336, 128256, "Q4_K_M",
                        _llama3(128256, 128), rope_scaling=(8.0, 1.0, 4.0, 8192), tied=False),
    # The 2026 shelf, each in Q4_K_M as llama-quantize writes it from the release's own config.json:
    # SmolLM3-3B (HuggingFaceTB/SmolLM3-3B config.json, as quoted by several ports: hidden_size 2048,
    # num_hidden_layers 36, num_attention_heads 16, num_key_value_heads 4, head_dim 128, intermediate_size 11008,
    # vocab_size 128256, rope_theta 5e6, rms_norm_eps 1e-6, max_position_embeddings 65536, tie_word_embeddings true,
    # no_rope_layer_interval 4: no key, llama.cpp's smollm3 loader fixes the NoPE step at 4)
    "smollm3": Spec("smollm3", 36, 2048, 16, 4, 128, 11008, 128256, "Q4_K_M", _smollm3(128256, 128)),
    # LFM2-350M and LFM2-1.2B (LiquidAI config.json: hidden_size 1024 / 2048, num_hidden_layers 16, num_attention_heads
    # 16 / 32, num_key_value_heads 8, full_attn_idxs [2, 5, 8, 10, 12, 14] (layer_types: the rest "conv"),
    # conv_L_cache 3, norm_eps 1e-5, rope_theta 1e6, vocab_size 65536, max_position_embeddings 128000, tied
    # embeddings; block_ff_dim 6656 / 12288 with block_auto_adjust_ff_dim, block_multiple_of 256, multiplier 1.0,
    # which llama.cpp's converter (conversion/lfm2.py) writes as feed_forward_length 256 * ceil(int(2/3 x) / 256):
    # 4608 / 8192). Head size 64 = hidden / heads.
    "lfm2-350m": Spec("lfm2", 16, 1024, 16, 8, 64, 4608, 65536, "Q4_K_M", _lfm2(), kv_per_layer=_lfm2_kv(8)),
    "lfm2-1.2b": Spec("lfm2", 16, 2048, 32, 8, 64, 8192, 65536, "Q4_K_M", _lfm2(), kv_per_layer=_lfm2_kv(8)),
    # Qwen3.5-0.8B and Qwen3.5-2B (Qwen config.json, text_config: hidden_size 1024 / 2048, num_hidden_layers 24,
    # intermediate_size 3584 / 6144, num_attention_heads 8, num_key_value_heads 2, head_dim 256, partial_rotary_factor
    # 0.25, rope_theta 1e7, mrope_section [11, 11, 10], full_attention_interval 4 (layer_types: three
    # linear_attention, then full_attention), linear_num_key_heads 16, linear_num_value_heads 16,
    # linear_key_head_dim = linear_value_head_dim 128, linear_conv_kernel_dim 4, rms_norm_eps 1e-6, vocab_size 248320,
    # max_position_embeddings 262144, tie_word_embeddings true). Checked: the 0.8B's layers, widths, heads, head size,
    # rope_theta and vocabulary against apxml.com's and fitmygpu.com's model pages; the 2B's 24 layers against
    # llama.cpp's qwen35 loader (24 layers: 0.8B at n_embd 1024, else 2B). Not found in a second source: the delta-net
    # head counts of both and the 2B's attention heads and FFN width (the project's brief gives them). Without the
    # multi-token-prediction block the checkpoints carry: llama.cpp skips it unless asked to draft with it, and the
    # lab skips it, so it changes no timing.
    "qwen3.5-0.8b": Spec("qwen35", 24, 1024, 8, 2, 256, 3584, 248320, "Q4_K_M", _qwen35(16)),
    "qwen3.5-2b": Spec("qwen35", 24, 2048, 8, 2, 256, 6144, 248320, "Q4_K_M", _qwen35(16)),
    # Gemma 4 E2B and E4B (google/gemma-4-E2B / E4B config.json, text_config, as quoted alike by several ports'
    # tests: hidden_size 1536 / 2560, num_hidden_layers 35 / 42, num_attention_heads 8, num_key_value_heads 1 / 2,
    # head_dim 256, global_head_dim 512, layer_types four / five sliding_attention then a full_attention, repeated,
    # sliding_window 512, intermediate_size 6144 / 10240 with use_double_wide_mlp true / false (E2B's 20 shared-KV
    # layers are 12288 wide), num_kv_shared_layers 20 / 18, hidden_size_per_layer_input 256, vocab_size 262144,
    # rope_parameters full 1e6 proportional with partial_rotary_factor 0.25, sliding 1e4, final_logit_softcapping 30,
    # rms_norm_eps 1e-6, tie_word_embeddings true; llama.cpp's gemma4 loader: 35 layers E2B, 42 E4B). The shared
    # layers are written without K/V projections of their own (the lab skips them where a file has them; llama.cpp
    # loads them and never reads them), so the timing is that of the layers both engines run.
    "gemma4-e2b": Spec("gemma4", 35, 1536, 8, 1, 512, 6144, 262144, "Q4_K_M", _gemma4(35, 5, 20),
                       ff_per_layer=(6144,) * 15 + (12288,) * 20),
    "gemma4-e4b": Spec("gemma4", 42, 2560, 8, 2, 512, 10240, 262144, "Q4_K_M", _gemma4(42, 6, 18)),
}
# Small variants of the new architectures, built by the same code (layout, types, header check, blocks) for the tests
# of the default run: few layers (smollm3: layer 3 without RoPE; lfm2: 4 conv blocks and 2 attention layers; qwen35:
# 3 delta-net layers and 1 attention layer; gemma4: 6 layers [S S F | S S F], the last 3 reading layers 1 and 2,
# heads of 64 and 128), n_embd 256, a vocabulary of 512.
SMALL = {
    "smollm3-small": Spec("smollm3", 4, 256, 4, 1, 64, 512, 512, "Q4_K_M", _smollm3(512, 64)),
    "lfm2-small": Spec("lfm2", 6, 256, 4, 2, 64, 512, 512, "Q4_K_M", _lfm2(512), kv_per_layer=_lfm2_kv(2, (2, 5), 6)),
    "qwen35-small": Spec("qwen35", 4, 256, 2, 1, 256, 512, 512, "Q4_K_M", _qwen35(2)),
    "gemma4-small": Spec("gemma4", 6, 256, 4, 1, 128, 512, 512, "Q4_K_M", _gemma4(6, 3, 3, 64, 128)),
}

# Byte offsets of the f16 scale fields in each block: set to small finite values so every block is valid.
# MXFP4's and NVFP4's scales are 8-bit codes (none here): drawn from the kernel tests' sane range (RANDOM_CODES, where
# the range is explained), as random codes would reach inf. IQ1_M has no f16 field (none here): its d, spread over
# four nibbles, is written by put_iq1_m_d.
_SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
           "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,),
           "TQ1_0": (52,), "TQ2_0": (64,), "MXFP4": (), "NVFP4": (), "IQ2_XXS": (0,), "IQ3_XXS": (0,),
           "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_S": (0,), "IQ1_S": (0,), "IQ1_M": (), "Q1_0": (0,), "Q2_0": (0,),
           "F16": None, "F32": None}


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw bytes (uint8, rows x row_bytes) of valid blocks: random quants, f16 scales in [1e-3, 2e-2)."""
    t = BY_NAME[type_name]
    if type_name == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32)
    nb = cols // t.block
    raw = rng.integers(0, 256, size=(rows * nb, t.nbytes), dtype=np.uint8)
    for off in _SCALES[type_name]:
        scale = rng.uniform(1e-3, 2e-2, size=rows * nb).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    for off, count, lo, hi in RANDOM_CODES.get(type_name, ()):
        raw[:, off:off + count] = rng.integers(lo, hi, (rows * nb, count), dtype=np.uint8)
    if type_name == "IQ1_M":
        put_iq1_m_d(raw, rng.uniform(1e-3, 2e-2, size=rows * nb))
    return raw.reshape(rows, nb * t.nbytes)


def _role_type(spec: Spec, role: str, il: int) -> str:
    t = spec.types[role]
    if isinstance(t, tuple):
        base, more, layers = t
        return more if il in layers else base
    return t


def add_vocab(w, n_vocab: int) -> None:
    """A placeholder SentencePiece vocabulary of n_vocab tokens (<unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>,
    ChatML's <|im_start|> and <|im_end|>, SentencePiece's space "▁", then t262, t263, ...): enough for llama.cpp to
    load the file, and for the lab's tokenizer and chat (the ChatML format, found by those two tokens) to turn any
    conversation into tokens and back, so the page can load the file and chat with it (`lab bench --backend browser`:
    gibberish at the real model's speed). Not a tokenizer anyone chats with."""
    specials = ["<unk>", "<s>", "</s>"]
    n_bytes = min(256, n_vocab - 6)
    chat = ["<|im_start|>", "<|im_end|>"]
    head = specials + [f"<0x{b:02X}>" for b in range(n_bytes)] + chat + ["\u2581"]
    w.add_tokenizer_model("llama")
    w.add_token_list(head + [f"t{i}" for i in range(len(head), n_vocab)])
    w.add_token_scores([0.0] * n_vocab)
    # unknown, control, control, bytes, control, control, then normal ("▁" first)
    w.add_token_types([2, 3, 3] + [6] * n_bytes + [3, 3] + [1] * (n_vocab - 3 - n_bytes - 2))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


# A plain attention layer's tensors in these files' order (every other block's: lab.host.synthetic.layout): the
# matrices, then the norms, the Q/K/V biases and the Q/K norms
_PLAIN_LAYER = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                "ffn_up.weight", "ffn_down.weight", "attn_norm.weight", "ffn_norm.weight", "post_attention_norm.weight",
                "post_ffw_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight",
                "attn_k_norm.weight")


def _head(cfg: Config) -> tuple[str, ...]:
    """The tensors outside blocks in file order: layout's, but rope_freqs first where it scales every layer's RoPE
    (Config.rope_freqs; the one of the full layers alone, rope_freqs_full, keeps its place)."""
    order = layout.head(cfg)
    if cfg.rope_freqs:
        return ("rope_freqs.weight",) + tuple(name for name in order if name != "rope_freqs.weight")
    return order


def _block(cfg: Config, il: int) -> tuple[str, ...]:
    return layout.block_order(cfg, il, _PLAIN_LAYER)


def _keys(spec: Spec) -> dict:
    """The metadata keys of spec's file beyond general.architecture and general.name, in the order they are written."""
    return {**layout.size_keys(spec), **spec.extra}


def _layout(spec: Spec) -> tuple[Config, list[tuple[str, str, int, int]]]:
    """The Config of spec's file and (name, role, rows, cols) of every tensor in file order: the names and shapes the
    registry gives a model of the spec's keys (cols: ne0, the contiguous row; 1-D tensors have rows 1); role "" for a
    tensor that is F32 in every file (the vectors: norms, biases, rope_freqs, qwen35's dt and A; the conv kernels),
    else its name within the block (the key of spec.types)."""
    cfg, shapes = layout.registry(spec.arch, _keys(spec), spec.n_vocab, tied=spec.tied,
                                  rope_scaling=spec.rope_scaling is not None)
    out = []
    for name, shape in layout.in_order(cfg, shapes, _head, _block):
        cols, rows = shape if len(shape) == 2 else (shape[0], 1)
        stem = name.split(".", 2)[2] if name.startswith("blk.") else name
        role = "" if len(shape) == 1 or model.is_flat(name) else stem.removesuffix(".weight").replace(".", "_")
        out.append((name, role, rows, cols))
    return cfg, out


def _table(spec: Spec) -> tuple[Config, list[tuple[str, str, int, int]]]:
    """The Config of spec's file and (name, type, rows, cols) of every tensor in file order; 1-D tensors have rows 1."""
    cfg, tensors = _layout(spec)
    if spec.types == "Q4_K_M":
        types = q4_k_m_types([(name, rows, cols) for name, _, rows, cols in tensors], spec.n_layer)
        return cfg, [(name, types[name], rows, cols) for name, _, rows, cols in tensors]
    return cfg, [(name, _role_type(spec, role, _layer(name)) if role else "F32", rows, cols)
                 for name, role, rows, cols in tensors]


def tensor_table(spec: Spec) -> list[tuple[str, str, int, int]]:
    """(name, type, rows, cols) of every tensor in file order; 1-D tensors have rows 1."""
    return _table(spec)[1]


def _start(spec: Spec, label: str, path: Path, vocab: bool):
    """A gguf-py writer of `spec` at `path` with the header and tensor table written and flushed (the data not yet),
    the file's Config and that table; the header is read back and checked by lab.format.model.from_gguf, so a file the
    lab would refuse (a tensor missing, misnamed or misshaped for the architecture) is never written."""
    import gguf
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(f"synthetic {label}")
    layout.put(w, _keys(spec))
    if vocab:
        add_vocab(w, spec.n_vocab)

    cfg, table = _table(spec)
    for tname, type_name, rows, cols in table:
        if type_name == "F32":
            w.add_tensor_info(tname, (rows, cols) if rows > 1 else (cols,), np.dtype(np.float32), 4 * rows * cols)
        else:
            t = BY_NAME[type_name]
            row_bytes = cols // t.block * t.nbytes      # byte shape (rows, row_bytes), as gguf-py takes raw blocks
            w.add_tensor_info(tname, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes,
                              raw_dtype=gguf.GGMLQuantizationType[type_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.flush()
    model.from_gguf(gguf_header.read(Path(path).read_bytes()))
    return w, cfg, table


def spec(name: str) -> Spec:
    """The spec of a real release (SPECS) or of a small variant (SMALL)."""
    return SPECS[name] if name in SPECS else SMALL[name]


def header(s: Spec, path: Path, vocab: bool = False) -> gguf_header.Header:
    """The header of spec `s`'s file alone, written at `path` (no tensor data: cheap at any size), as the lab
    reads it."""
    w, _, _ = _start(s, "header", path, vocab)
    w.close()
    return gguf_header.read(Path(path).read_bytes())


def write(name: str, path: Path, seed: int = 0, vocab: bool = False) -> Path:
    """Write the synthetic file of spec `name` (SPECS or SMALL). vocab: add the placeholder vocabulary llama.cpp
    needs (the page's chat cannot use it: `lab bench --backend browser` refuses files without a tokenizer and takes
    the real header instead, lab/host/synthetic/sameshape.py). The header and tensor table go first (checked by the lab's
    from_gguf), then each tensor's bytes as they are made."""
    s = spec(name)
    rng = np.random.default_rng(seed)
    w, cfg, table = _start(s, name, path, vocab)
    for tname, type_name, rows, cols in table:
        if tname == "rope_freqs.weight" and cfg.rope_freqs_full:
            # proportional RoPE: the first quarter of the pairs turn (factor 1), the rest never (1e30)
            data = np.array([1.0] * (cols // 4) + [1e30] * (cols - cols // 4), np.float32)
        elif tname.endswith("layer_output_scale.weight"):
            data = np.ones((rows, cols), np.float32)        # a block's output multiplier: noise would compound
        elif tname == "rope_freqs.weight":
            factor, low, high, orig = s.rope_scaling
            data = llama3_factors(2 * cols, cfg.rope_base, factor, low, high, orig)
        elif tname.endswith(".ssm_a"):
            # qwen35's A is stored as -exp(A_log) (the converter's own transform): always negative, so each token's
            # decay exp(softplus(alpha + dt) * A) is below 1 and the random model's delta-net state stays finite
            data = -np.exp(rng.standard_normal((rows, cols), dtype=np.float32))
        else:
            data = random_blocks(type_name, rows, cols, rng)
        w.write_tensor_data(data)
    w.close()
    return path


def cached(name: str, vocab: bool = True) -> Path:
    """Spec `name`'s file (seed 0) under lab.host.models.cache_dir() / "synthetic", written once (atomically: two
    builders at once never share a half-written file) and reused while the spec and its tensor table are the same
    (their hash is in the file name, so an edited spec or layout never reads a stale file)."""
    s = spec(name)
    # "bytes, chatml, space": the placeholder vocabulary the page can chat with (add_vocab): files cached before it
    # are not reused
    key = hashlib.sha256(repr((s, tensor_table(s), vocab and "bytes, chatml, space")).encode()).hexdigest()[:12]
    path = models.cache_dir() / "synthetic" / f"spec-{name}-{key}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        write(name, tmp, vocab=vocab)
        tmp.replace(path)
    return path
