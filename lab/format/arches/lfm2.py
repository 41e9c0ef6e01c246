"""lfm2 (LiquidAI's LFM2): a hybrid of short-convolution blocks and GQA attention layers, with per-head Q/K norms,
NeoX RoPE, and the final norm stored under the name token_embd_norm.weight (llama.cpp: LLM_TENSOR_OUTPUT_NORM_LFM2).

A layer is a short-conv block where attention.head_count_kv (an array, one per layer) is 0 (llama.cpp:
`hparams.is_recr`); such a block has no K/V: a depthwise causal conv of l_cache taps over B*x (its state, the last
l_cache - 1 rows, lives between tokens), in_proj to [B | C | x] and out_proj, then the FFN.

lfm2moe (LFM2-8B-A1B) is the same graph (llama.cpp runs both through src/models/lfm2.cpp) with routed experts on the
layers from leading_dense_block_count on, conv and attention layers alike: `make` builds both Arch values (lfm2moe's
in lab.format.arches.lfm2moe).
"""

from __future__ import annotations

from lab.format.arches.base import MAX_L_CACHE, Arch, Shapes, attention_block, ffn_tensors
from lab.format.config import Config
from lab.format.rules import PER_LAYER_COUNTS, SLIDING_WINDOW, ModelError, Rule, show

NAME = "lfm2"


def _shortconv(kv: dict, n_layer: int, mtp: int, why: dict[str, str], name: str = NAME) -> dict:
    """shortconv and l_cache, as llama_model_lfm2::load_arch_hparams reads them: a layer is a short-conv block where
    attention.head_count_kv (an array, one per layer; a scalar means every layer) is 0; l_cache is shortconv.l_cache,
    the conv's taps."""
    a = name + "."
    per_layer = kv.get("attention.head_count_kv", kv["attention.head_count"])
    if not isinstance(per_layer, list):
        per_layer = [per_layer] * n_layer
    if len(per_layer) != n_layer:
        raise ModelError(f"{a}attention.head_count_kv has {len(per_layer)} items, but {a}block_count = {n_layer}: "
                         f"an lfm2 file gives one per layer (0 for a short-conv layer)")
    heads = sorted(set(per_layer) - {0})
    if not heads:
        raise ModelError(f"{a}attention.head_count_kv = {show(per_layer)}: every layer is a short-conv layer; this "
                         f"lab runs lfm2 models with at least one attention layer")
    if len(heads) > 1:
        raise ModelError(f"{a}attention.head_count_kv = {show(per_layer)}: attention layers with different KV head "
                         f"counts ({', '.join(map(str, heads))}) are not supported by this lab")
    l_cache = kv["shortconv.l_cache"]
    if not 2 <= l_cache <= MAX_L_CACHE:
        # llama.cpp: GGML_ASSERT(n_shortconv_l_cache > 1); the kernel keeps the window in registers
        raise ModelError(f"{a}shortconv.l_cache = {l_cache}: must be in 2..{MAX_L_CACHE} (the conv's taps; every "
                         f"LFM2 release has 3)")
    if kv.get("attention.sliding_window", 0):
        raise ModelError(f"{a}attention.sliding_window = {kv['attention.sliding_window']}: lfm2 with sliding-window "
                         f"attention layers (llama.cpp's iswa graph) is not supported by this lab")
    if kv.get("attention.causal", True) is not True:
        raise ModelError(f"{a}attention.causal = {show(kv['attention.causal'])}: bidirectional lfm2 (the embedding and "
                         f"ColBERT models) is not a chat model; this lab runs causal lfm2 only")
    why["l_cache"] = f"{a}shortconv.l_cache = {l_cache}"
    why["n_head_kv"] = f"{a}attention.head_count_kv = {show(per_layer)}"
    return {"shortconv": tuple(h == 0 for h in per_layer), "l_cache": l_cache}


def _check_heads(kv: dict, n_embd: int, n_head: int, head_dim: int, why: dict[str, str], name: str = NAME) -> None:
    a = name + "."
    if n_head * head_dim != n_embd:
        # llama_model_lfm2::load_arch_tensors: attn_q and attn_output are [n_embd, n_embd]
        raise ModelError(f"{a}attention.head_count = {n_head} x head size {head_dim} ({why['head_dim']}) is not "
                         f"{a}embedding_length = {n_embd}: an lfm2 attention layer projects n_embd to n_embd")


def _block(cfg: Config, b: str, il: int, stored: bool) -> Shapes:
    """A block's tensors but attn_norm: the short-conv block in place of attention (llama_model_lfm2::load_arch_tensors)
    where the layer is one, else the attention block."""
    if not cfg.is_conv(il):
        return attention_block(cfg, b, il, stored)
    e = "n_embd"
    return {b + "shortconv.conv.weight": ("l_cache", e), b + "shortconv.in_proj.weight": (e, "bcx_rows"),
            b + "shortconv.out_proj.weight": (e, e), **ffn_tensors(cfg, b, il, stored)}


def make(name: str, **extra) -> Arch:
    """The Arch of `name` (lfm2, or lfm2moe with its experts' fields in `extra`): lfm2's keys, flags, layer kinds
    and tensors, its messages under `name`."""
    def kinds(kv, n_layer, mtp, why):
        return _shortconv(kv, n_layer, mtp, why, name)

    def heads(kv, n_embd, n_head, head_dim, why):
        _check_heads(kv, n_embd, n_head, head_dim, why, name)
    keys = {**_KEYS, **extra.pop("keys", {})}
    return Arch(name, keys=keys, rope_neox=True, qk_norm=True, output_norm="token_embd_norm.weight",
                per_block=8,    # a conv block has 8: norm, conv, in, out, the FFN's norm and its three
                flat_tensors=("shortconv.conv.weight",),    # [l_cache, n_embd] f32, read whole by the conv kernel
                layer_kinds=kinds, check_heads=heads, block_tensors=_block, **extra)


_KEYS = {
    # one KV head count per layer, 0 for a short-conv layer (a scalar is read as every layer's)
    "attention.head_count_kv": PER_LAYER_COUNTS,
    "attention.sliding_window": SLIDING_WINDOW,     # refused when not 0 (_shortconv)
    # the short conv's taps (llama.cpp: n_shortconv_l_cache, asserted > 1; its range: _shortconv)
    "shortconv.l_cache": Rule("count", required=True),
    # false for LFM2's bidirectional embedding models (refused by _shortconv)
    "attention.causal": Rule("bool"),
}

ARCH = make(NAME)
