"""qwen35 (Qwen3.5): a hybrid of gated delta-net layers (linear attention) and gated full-attention layers, with
per-head Q/K norms, the FFN's input norm stored as post_attention_norm, and trailing multi-token-prediction blocks
that this lab skips.

A delta-net layer: a conv over its q, k, v channels, then a recurrent state of ssm_head_dim x ssm_head_dim per value
head. An attention layer: each head's Q rows are [q | gate], the attention output multiplied by sigmoid(gate). RoPE:
IMROPE, which rotates text (one position on every axis) as NEOX does, when every rotary pair falls on the t, h or w
sections (`_text_sections`).
"""

from __future__ import annotations

from lab.format.arches.base import MAX_L_CACHE, Arch, Shapes
from lab.format.config import Config
from lab.format.rules import U32_MAX, ModelError, Rule, show

NAME = "qwen35"
MAX_SSM_HEAD = 256  # the widest delta-net head the kernel holds (every release: 128)


def _delta(kv: dict, n_layer: int, mtp: int, why: dict[str, str]) -> dict:
    """delta and the delta-net sizes, as llama_model_qwen35::load_arch_hparams reads them: a layer is a gated
    delta-net layer where attention.recurrent_layers says so (one bool per block, the MTP blocks included and false),
    else where (il + 1) % full_attention_interval != 0 (default 4); the conv taps, key and value heads and head size
    from the ssm.* keys."""
    a = NAME + "."
    if "attention.recurrent_layers" in kv:
        per_layer = kv["attention.recurrent_layers"]
        if len(per_layer) != n_layer + mtp:
            raise ModelError(f"{a}attention.recurrent_layers has {len(per_layer)} items, but {a}block_count = "
                             f"{n_layer + mtp}: one per block")
        if any(per_layer[n_layer:]):
            raise ModelError(f"{a}attention.recurrent_layers = {show(per_layer)}: a multi-token-prediction block "
                             f"(after layer {n_layer - 1}) must not be recurrent")
        delta = tuple(per_layer[:n_layer])
        why["delta"] = f"{a}attention.recurrent_layers = {show(per_layer)}"
    else:
        interval = kv.get("full_attention_interval", 4)
        delta = tuple((il + 1) % interval != 0 for il in range(n_layer))
        why["delta"] = f"{a}full_attention_interval = {interval}"
    if all(delta):
        raise ModelError(f"every layer is a delta-net layer ({why['delta']}); this lab runs qwen35 models with at "
                         f"least one attention layer")
    return {"delta": delta, **_ssm_sizes(kv, why)}


def _ssm_sizes(kv: dict, why: dict[str, str]) -> dict:
    """The delta-net's conv taps, key and value heads and head size, and their agreement."""
    a = NAME + "."
    taps, inner, d, v_heads, k_heads = (kv[f"ssm.{k}"] for k in
                                        ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count"))
    if not 2 <= taps <= MAX_L_CACHE:
        raise ModelError(f"{a}ssm.conv_kernel = {taps}: must be in 2..{MAX_L_CACHE} (the conv's taps; every Qwen3.5 "
                         f"release has 4)")
    if v_heads % k_heads:
        raise ModelError(f"{a}ssm.time_step_rank = {v_heads} (value heads) is not a multiple of {a}ssm.group_count = "
                         f"{k_heads} (key heads)")
    if inner != v_heads * d:
        raise ModelError(f"{a}ssm.inner_size = {inner} is not {a}ssm.time_step_rank = {v_heads} x {a}ssm.state_size "
                         f"= {d}: the value width must be the value heads times the head size")
    if d % 16 or d > MAX_SSM_HEAD:
        raise ModelError(f"{a}ssm.state_size = {d}: the delta-net kernel takes head sizes that are multiples of 16 up "
                         f"to {MAX_SSM_HEAD} (every release: 128)")
    why.update(l_cache=f"{a}ssm.conv_kernel = {taps}", ssm_inner=f"{a}ssm.inner_size = {inner}",
               ssm_head_dim=f"{a}ssm.state_size = {d}", ssm_v_heads=f"{a}ssm.time_step_rank = {v_heads}",
               ssm_k_heads=f"{a}ssm.group_count = {k_heads}")
    return {"l_cache": taps, "ssm_k_heads": k_heads, "ssm_v_heads": v_heads, "ssm_head_dim": d}


def _text_sections(kv: dict, n_rot: int) -> None:
    """qwen35 rotates with IMROPE (ggml_rope_multi): rotary pair i takes the position of the axis its sector says
    (sector = i % sum(sections): t where sector % 3 == 0 and sector < 3 s_t, h where % 3 == 1 and < 3 s_h, w where
    % 3 == 2 and < 3 s_w, else the 4th axis, 0 for text). For text, t = h = w = the token's position, so the
    rotation is NEOX's exactly when every pair falls on t, h or w; a pair on the 4th axis would not rotate at all,
    which this lab refuses rather than mimics."""
    key = NAME + ".rope.dimension_sections"
    sections = kv["rope.dimension_sections"]
    if len(sections) < 4 or any(not 0 <= s <= U32_MAX for s in sections) or sum(sections[:4]) == 0:
        raise ModelError(f"{key} = {show(sections)}: four section sizes expected (llama.cpp reads 4)")
    t, h, w, _e = sections[:4]
    total = sum(sections[:4])
    for i in range(n_rot // 2):
        sector = i % total
        axis = sector % 3
        if not ((axis == 0 and sector < 3 * t) or (axis == 1 and sector < 3 * h) or (axis == 2 and sector < 3 * w)):
            raise ModelError(f"{key} = {show(sections)}: rotary pair {i} of {n_rot // 2} falls on the fourth axis, "
                             f"which text leaves at position 0; this lab rotates text when every pair takes the "
                             f"token's position (Qwen3.5 releases: [11, 11, 10, 0] over 64 rotated dims)")


def _block(cfg: Config, b: str, il: int, stored: bool) -> Shapes:
    """A block's tensors but attn_norm (llama_model_qwen35::load_block_trunk): a gated delta-net layer (the fused
    in-projection of q, k, v, the output gate z, beta and alpha, the conv kernel, dt's bias, A (stored as -exp(A_log)),
    the gated norm and the out-projection) or a gated attention layer (Q rows [q | gate] per head, stored as one
    tensor; the engine reads each head's two halves as views: lab.format.model.tensor_views); post_attention_norm (the
    FFN's input norm) and the FFN in both."""
    e, kv, ff = "n_embd", "n_head_kv * head_dim", "n_ff"
    out: Shapes = {}
    if cfg.is_delta(il):
        out.update({b + "attn_qkv.weight": (e, "conv_channels"), b + "attn_gate.weight": (e, "ssm_inner"),
                    b + "ssm_conv1d.weight": ("l_cache", "conv_channels"), b + "ssm_dt.bias": ("ssm_v_heads",),
                    b + "ssm_a": ("ssm_v_heads",), b + "ssm_beta.weight": (e, "ssm_v_heads"),
                    b + "ssm_alpha.weight": (e, "ssm_v_heads"), b + "ssm_norm.weight": ("ssm_head_dim",),
                    b + "ssm_out.weight": ("ssm_inner", e)})
    else:
        if stored:
            out[b + "attn_q.weight"] = (e, "q_gate_rows")
        else:
            for h in range(cfg.n_head):
                out.update({f"{b}attn_q.weight#q{h}": (e, "head_dim"), f"{b}attn_q.weight#g{h}": (e, "head_dim")})
        out.update({b + "attn_k.weight": (e, kv), b + "attn_v.weight": (e, kv),
                    b + "attn_output.weight": ("n_head * head_dim", e),
                    b + "attn_q_norm.weight": ("head_dim",), b + "attn_k_norm.weight": ("head_dim",)})
    out.update({b + "post_attention_norm.weight": (e,), b + "ffn_gate.weight": (e, ff), b + "ffn_up.weight": (e, ff),
                b + "ffn_down.weight": (ff, e)})
    return out


ARCH = Arch(
    NAME,
    # the gated delta-net layers (llama_model_qwen35::load_arch_hparams; their agreement: _delta)
    keys={
        "ssm.conv_kernel": Rule("count", required=True),     # taps of the conv over q, k, v
        "ssm.inner_size": Rule("count", required=True),      # value heads x head size
        "ssm.state_size": Rule("count", required=True),      # the head size d_k = d_v
        "ssm.time_step_rank": Rule("count", required=True),  # value heads
        "ssm.group_count": Rule("count", required=True),     # key heads
        "full_attention_interval": Rule("count"),            # default 4: every 4th layer attends
        "attention.recurrent_layers": Rule("bools"),         # per layer, instead of the interval
        "rope.dimension_sections": Rule("ints", required=True),  # the multi-axis RoPE's 4 sections
        "nextn_predict_layers": Rule("uint"),     # trailing multi-token-prediction blocks (skipped)
    },
    rope_neox=True,     # IMROPE rotates text as NEOX does (_text_sections)
    qk_norm=True,
    ffn_norm="post_attention_norm.weight",
    attn_gate=True,
    per_block=11,       # an attention layer's, attn_norm included (a delta-net layer holds 14)
    flat_tensors=("ssm_conv1d.weight",),    # [l_cache, conv_channels] f32, read whole by the conv kernel
    refused_variants={
        "qwen35moe": "Qwen3.5's mixture-of-experts sizes (35B-A3B and up): their routed expert FFNs are not run by "
                     "this lab; the dense qwen35 models (0.8B to 27B) are",
    },
    layer_kinds=_delta, check_rope=_text_sections, block_tensors=_block,
)
