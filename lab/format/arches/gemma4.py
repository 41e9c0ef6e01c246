"""gemma4 (Gemma 4 E2B / E4B / 31B): gemma3's blocks with sizes per layer. The sliding layers (a per-layer bool array)
have their own head size, rotated dims and RoPE base; KV heads and FFN widths may differ per layer; the trailing
layers read an earlier layer's K/V (shared KV); each block adds a per-layer token embedding through its own gate and
projection; V is RMS-normed without a weight; q.k is unscaled; the full layers rotate by rope_freqs (proportional
RoPE). The mixture-of-experts size (26B-A4B) is refused by name.
"""

from __future__ import annotations

from dataclasses import replace

from lab.format.arches.base import Arch, Shapes
from lab.format.config import Config
from lab.format.rules import FINAL_SOFTCAP, FREQ_BASE_SWA, PER_LAYER_COUNTS, ModelError, Rule, show

NAME = "gemma4"


def _sliding(kv: dict, n_layer: int, rope_base: float) -> tuple[int, tuple[bool, ...], float]:
    """(window, sliding, rope_base_local): the pattern is a per-layer array (its length checked in _layer_sizes); the
    sliding layers' base defaults to 10000."""
    pattern = kv["attention.sliding_window_pattern"]
    return kv["attention.sliding_window"], tuple(pattern), float(kv.get("rope.freq_base_swa", 10000.0))


def _softcaps(kv: dict, window: int) -> tuple[float, float]:
    """(attention cap, final cap): the final cap only, where the key is present (the sliding graph applies it too)."""
    return 0.0, float(kv.get("final_logit_softcapping", 0.0))


def _layer_sizes(kv: dict, n_layer: int, n_head: int, tensors: dict, why: dict[str, str]) -> dict:
    """gemma4's Config fields as llama_model_gemma4::load_arch_hparams reads them, each refused by name where this
    lab (or llama.cpp) cannot run it: the per-layer sliding array, the sliding layers' head size and rotated dims,
    per-layer KV heads and FFN widths, the shared-KV tail (whose last two own layers must be a sliding then a full
    one: llama.cpp's layer_reuse_cb reads them by kind), the per-layer embedding width, out_scale, and the full
    layers' rope_freqs."""
    a = NAME + "."
    pattern = kv["attention.sliding_window_pattern"]
    if len(pattern) != n_layer:
        raise ModelError(f"{a}attention.sliding_window_pattern has {len(pattern)} items, but {why['n_layer']}")
    hd_swa = kv["attention.key_length_swa"]
    if kv["attention.value_length_swa"] != hd_swa:
        raise ModelError(f"{a}attention.value_length_swa = {kv['attention.value_length_swa']} differs from "
                         f"{a}attention.key_length_swa = {hd_swa}: Gemma 4 needs them equal (llama.cpp refuses too)")
    n_rot_swa = kv.get("rope.dimension_count_swa", hd_swa)
    if n_rot_swa % 2 or n_rot_swa > hd_swa:
        raise ModelError(f"{a}rope.dimension_count_swa = {n_rot_swa}: must be even and at most {a}"
                         f"attention.key_length_swa = {hd_swa}")
    per_layer = _per_layer(kv, n_layer, n_head, why)
    kv_from = _shared_kv_start(kv, n_layer, pattern)
    if not all(pattern) and "rope_freqs.weight" not in tensors:
        raise ModelError("tensor rope_freqs.weight is missing (a gemma4 model's full layers need it: proportional RoPE)")
    why.update(head_dim_swa=f"{a}attention.key_length_swa = {hd_swa}", n_embd_per_layer=(
        f"{a}embedding_length_per_layer_input = {kv['embedding_length_per_layer_input']}"))
    return dict(head_dim_swa=hd_swa, n_rot_swa=n_rot_swa, kv_heads=per_layer.get("attention.head_count_kv", ()),
                ff_widths=per_layer.get("feed_forward_length", ()), kv_from_start=kv_from,
                n_embd_per_layer=kv["embedding_length_per_layer_input"], v_norm=True, block_tail=True,
                out_scale="blk.0.layer_output_scale.weight" in tensors,
                v_is_k=tuple(f"blk.{il}.attn_v.weight" not in tensors and (kv_from < 0 or il < kv_from)
                             for il in range(n_layer)),
                rope_freqs_full="rope_freqs.weight" in tensors)


def _per_layer(kv: dict, n_layer: int, n_head: int, why: dict[str, str]) -> dict[str, tuple[int, ...]]:
    """The KV heads and FFN widths given per layer (an array; a scalar is every layer's and is not listed): one per
    layer, none 0, and the query heads a multiple of every KV head count."""
    a = NAME + "."
    per_layer = {}
    for key in ("attention.head_count_kv", "feed_forward_length"):
        v = kv.get(key, n_head)
        if isinstance(v, list):
            if len(v) != n_layer:
                raise ModelError(f"{a}{key} has {len(v)} items, but {why['n_layer']}")
            if 0 in v:
                raise ModelError(f"{a}{key} = {show(v)}: every gemma4 layer attends and has an FFN (no 0)")
            per_layer[key] = tuple(v)
    bad = next((n for n in per_layer.get("attention.head_count_kv", ()) if n_head % n), None)
    if bad:
        raise ModelError(f"{a}attention.head_count = {n_head} is not a multiple of {a}attention.head_count_kv item {bad}")
    return per_layer


def _shared_kv_start(kv: dict, n_layer: int, pattern: list[bool]) -> int:
    """The first layer that reads an earlier layer's K/V (attention.shared_kv_layers from the end), -1 for none."""
    a = NAME + "."
    shared = kv.get("attention.shared_kv_layers", 0)
    kv_from = n_layer - shared if shared else -1
    if shared:
        # llama.cpp asserts n_layer_kv_from_start >= 2 and reads kv_from - 2 for a sliding layer, kv_from - 1 for a full
        # one; a file where those are not of that kind would attend a cache of another head size
        if kv_from < 2 or not pattern[kv_from - 2] or pattern[kv_from - 1]:
            raise ModelError(f"{a}attention.shared_kv_layers = {shared}: layers {kv_from}.. would read the K/V of "
                             f"layers {kv_from - 2} (must slide) and {kv_from - 1} (must be full), which "
                             f"{a}attention.sliding_window_pattern does not give")
    return kv_from


def _block(cfg: Config, b: str, il: int, stored: bool) -> Shapes:
    """A block's tensors but attn_norm (llama_model_gemma4::load_arch_tensors), each size the layer's own
    ("head_dim@3": head_dim_of(3)): Q with its norm; K, V and K's norm on layers with their own K/V; the output, the
    post-attention norm, the GeGLU FFN and its norms; the per-layer embedding's gate, projection and norm; out_scale."""
    e, hd, q = "n_embd", f"head_dim@{il}", f"n_head * head_dim@{il}"
    kv, ff = f"n_head_kv@{il} * head_dim@{il}", f"n_ff@{il}"
    out = {b + "attn_q.weight": (e, q), b + "attn_q_norm.weight": (hd,)}
    if cfg.has_kv(il):
        out.update({b + "attn_k.weight": (e, kv), b + "attn_k_norm.weight": (hd,)})
        if not (stored and cfg.v_is_k[il]):     # V = K: the engine reads attn_k's rows again as attn_v (tensor_views)
            out[b + "attn_v.weight"] = (e, kv)
    out.update({b + "attn_output.weight": (q, e), b + "post_attention_norm.weight": (e,), b + "ffn_norm.weight": (e,),
                b + "ffn_gate.weight": (e, ff), b + "ffn_up.weight": (e, ff), b + "ffn_down.weight": (ff, e),
                b + "post_ffw_norm.weight": (e,)})
    if cfg.n_embd_per_layer:
        out.update({b + "inp_gate.weight": (e, "n_embd_per_layer"), b + "proj.weight": ("n_embd_per_layer", e),
                    b + "post_norm.weight": (e,)})
    if cfg.out_scale and stored:    # read by the host (lab.format.model.HOST_TENSORS), not uploaded
        out[b + "layer_output_scale.weight"] = ("one",)
    return out


ARCH = Arch(
    NAME,
    # llama_model_gemma4::load_arch_hparams (their agreement: _layer_sizes): the sliding layers as a per-layer bool
    # array (no period); KV heads and FFN widths per layer (the shared-KV layers' FFN may be double-wide; a scalar is
    # every layer's, get_key_or_arr); the sliding layers' own head size and rotated dims, the trailing layers that read
    # an earlier layer's K/V, the per-layer embedding width
    keys={
        "attention.head_count_kv": PER_LAYER_COUNTS,
        "feed_forward_length": replace(PER_LAYER_COUNTS, required=True),
        "attention.sliding_window": Rule("count", required=True),
        "attention.sliding_window_pattern": Rule("bools", required=True),
        "rope.freq_base_swa": FREQ_BASE_SWA,
        "final_logit_softcapping": FINAL_SOFTCAP,
        "attention.key_length_swa": Rule("count", required=True),
        "attention.value_length_swa": Rule("count", required=True),
        "rope.dimension_count_swa": Rule("count"),
        "attention.shared_kv_layers": Rule("uint"),
        "embedding_length_per_layer_input": Rule("uint", required=True),
        "expert_feed_forward_length": Rule("uint"),   # MoE sizes only (refused by their router or expert_count)
    },
    rope_neox=True, qk_norm=True, post_norms=True, gelu=True, embd_scale=True,
    unit_attn_scale=True,   # q.k unscaled: Gemma 4's attention scale is 1
    # tensors a shared-KV layer may hold that llama.cpp loads (TENSOR_NOT_REQUIRED) and never reads
    shared_kv_unread=("attn_k.weight", "attn_v.weight", "attn_k_norm.weight"),
    # read by _layer_sizes: without attn_v a layer's V is K's projection (v_is_k); without the scales, no out_scale
    optional_tensors=("attn_v.weight", "layer_output_scale.weight"),
    # the mixture-of-experts size (26B-A4B): a router (ffn_gate_inp) and stacked experts beside the dense FFN
    moe_refusal="gemma4's mixture-of-experts size (26B-A4B): its routed expert FFNs (ffn_gate_inp, ffn_gate_up_exps, "
                "ffn_down_exps beside the dense FFN) are not run by this lab; the dense gemma4 models (E2B, E4B, 31B) "
                "are",
    layer_sizes=_layer_sizes, sliding=_sliding, softcaps=_softcaps, block_tensors=_block,
)
