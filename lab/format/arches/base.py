"""`Arch`: what one architecture is to this lab, as data and a few steps of its own; and the steps several share.

An architecture's module (lab.format.arches.<name>) makes one `Arch`: the metadata keys it reads beyond the common
ones (`keys`), the Config flags it fixes (NeoX RoPE, Q/K norms, fused tensors, the final norm's name, ...), the
tensors of its blocks (`block_tensors`, and `per_block`, the fewest a block holds), and the steps of its own that
lab.format.model.from_gguf runs at their place in the read: its layer kinds (lfm2's short-conv blocks, qwen35's
delta-net layers), its per-layer sizes (gemma4), its sliding windows and soft-caps. A step that is None is one the
architecture does not have; `sliding`, `softcaps` and `block_tensors` default to the plain decoder's.

Shared here, parametrised by the Config or the caller rather than by a name: the attention block's tensors
(`attention_block`), a block's FFN tensors, dense or routed (`ffn_tensors`), the reading of the routed experts' keys
(`read_experts`, by the Arch's `experts` fields), the periodic sliding pattern (`swa_pattern`), and MAX_L_CACHE.

What it does not know: the order of the architectures or which exist (lab.format.arches), the generic reading steps
(lab.format.model), GGUF.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lab.format.config import Config
from lab.format.rules import COMMON_KEYS, GATING_SIGMOID, GATING_SOFTMAX, ModelError, Rule, show

MAX_L_CACHE = 8     # the longest conv a shortconv kernel holds in registers (LFM2 releases: 3; Qwen3.5: 4)

Shapes = dict[str, tuple[str, ...]]     # tensor name -> GGUF shape (ne0 first) in Config field names


def no_sliding(kv: dict, n_layer: int, rope_base: float) -> tuple[int, tuple[bool, ...], float]:
    """(window, sliding, rope_base_local) of an architecture without sliding windows: none, every layer full."""
    return 0, (False,) * n_layer, rope_base


def no_softcaps(kv: dict, window: int) -> tuple[float, float]:
    """(attention cap, final cap) of an architecture without soft-caps: 0, none."""
    return 0.0, 0.0


def swa_pattern(window: int, period: int, n_layer: int) -> tuple[bool, ...]:
    """Which layers slide with a period of `period` layers (none where window is 0), as
    llama_hparams::set_swa_pattern(n, dense_first=false) sets them: layer il slides iff n == 0 or il % n < n - 1."""
    return tuple(window > 0 and (period == 0 or il % period < period - 1) for il in range(n_layer))


def attention_block(cfg: Config, b: str, il: int, stored: bool) -> Shapes:
    """A decoder block's tensors but attn_norm: Q, K, V (phi3's fused attn_qkv where stored), the output, the FFN's
    norm and SwiGLU / GeGLU (phi3's fused [gate | up] where stored), and the Config's extras: Q/K/V biases, per-head
    Q/K norms, the post-norms."""
    e, q, kv, ff = "n_embd", "n_head * head_dim", "n_head_kv * head_dim", "n_ff"
    shapes: Shapes = {}
    if stored and cfg.fused_qkv:
        shapes[b + "attn_qkv.weight"] = (e, "qkv_rows")
    else:
        shapes.update({b + "attn_q.weight": (e, q), b + "attn_k.weight": (e, kv), b + "attn_v.weight": (e, kv)})
    shapes[b + "attn_output.weight"] = (q, e)
    shapes.update(ffn_tensors(cfg, b, il, stored, ff))
    if cfg.qkv_bias:
        shapes.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
    if cfg.qk_norm:
        shapes.update({b + "attn_q_norm.weight": ("head_dim",), b + "attn_k_norm.weight": ("head_dim",)})
    if cfg.post_norms:
        shapes.update({b + "post_attention_norm.weight": (e,), b + "post_ffw_norm.weight": (e,)})
    return shapes


def ffn_tensors(cfg: Config, b: str, il: int, stored: bool, ff: str = "n_ff") -> Shapes:
    """A block's FFN: its norm, then SwiGLU / GeGLU of width `ff` (phi3's fused [gate | up] where stored), or on a
    routed layer (Config.routed) the router and the stacked experts in ggml order, as llama.cpp's loaders create them
    (src/models/qwen3moe.cpp, llama.cpp, lfm2.cpp: router {n_embd, n_expert}; gate and up {n_embd, n_ff_exp,
    n_expert}; down {n_ff_exp, n_embd, n_expert}; exp_probs_b.bias {n_expert} where the architecture has it)."""
    e = "n_embd"
    shapes: Shapes = {b + "ffn_norm.weight": (e,)}
    if cfg.routed(il):
        shapes.update({b + "ffn_gate_inp.weight": (e, "n_expert"),
                       b + "ffn_gate_exps.weight": (e, "n_ff_exp", "n_expert"),
                       b + "ffn_down_exps.weight": ("n_ff_exp", e, "n_expert"),
                       b + "ffn_up_exps.weight": (e, "n_ff_exp", "n_expert")})
        if cfg.probs_bias:
            shapes[b + "exp_probs_b.bias"] = ("n_expert",)
        return shapes
    if stored and cfg.fused_gate_up:
        shapes[b + "ffn_up.weight"] = (e, "gate_up_rows")
    else:
        shapes.update({b + "ffn_gate.weight": (e, ff), b + "ffn_up.weight": (e, ff)})
    shapes[b + "ffn_down.weight"] = (ff, e)
    return shapes


def read_experts(arch: Arch, kv: dict, n_layer: int, n_ff: int, why: dict[str, str]) -> dict:
    """The Config fields of the routed experts, as llama.cpp's loader and graph read them for `arch` (its `experts`
    fields): expert_count (none or 0: every FFN dense, where experts are optional), expert_used_count (1..count), an
    expert's width (its key, or llama's n_ff, or qwen3moe's n_ff / n_used where the key is absent), the leading dense
    blocks, the gating function (the key's, or the graph's fixed softmax: a key saying otherwise is refused), and the
    selection bias. Keys llama.cpp does not read for this architecture are refused where they would change the
    result."""
    a = arch.name + "."
    n_expert = kv.get("expert_count", 0)
    if not n_expert:
        if arch.experts == "required":
            raise ModelError(f"{a}expert_count is {'missing' if 'expert_count' not in kv else 0}: a {arch.name} model "
                             f"routes its FFNs over experts")
        for key in ("expert_used_count", "expert_feed_forward_length", "leading_dense_block_count"):
            if kv.get(key, 0):
                raise ModelError(f"{a}{key} = {show(kv[key])}, but {a}expert_count is absent or 0: no experts")
        return {}
    n_used = kv.get("expert_used_count")
    if n_used is None:
        raise ModelError(f"{a}expert_used_count is missing: {a}expert_count = {n_expert} needs it")
    if n_used > n_expert:
        raise ModelError(f"{a}expert_used_count = {n_used} is more than {a}expert_count = {n_expert}")
    if arch.expert_width == "key":
        if "expert_feed_forward_length" not in kv:
            raise ModelError(f"{a}expert_feed_forward_length is missing: a {arch.name} model's experts are that wide")
        n_ff_exp = kv["expert_feed_forward_length"]
        why["n_ff_exp"] = f"{a}expert_feed_forward_length = {n_ff_exp}"
    elif arch.expert_width == "key_or_split" and "expert_feed_forward_length" not in kv:
        # llama_model_qwen3moe::load_arch_tensors: n_ff_exp = n_ff / n_expert_used where the key is absent
        n_ff_exp = n_ff // n_used
        why["n_ff_exp"] = (f"{a}expert_feed_forward_length absent, so {a}feed_forward_length {n_ff} / "
                           f"{a}expert_used_count {n_used}")
    elif arch.expert_width == "key_or_split":
        n_ff_exp = kv["expert_feed_forward_length"]
        why["n_ff_exp"] = f"{a}expert_feed_forward_length = {n_ff_exp}"
    else:       # "n_ff": llama's experts are feed_forward_length wide; it reads no width of its own
        n_ff_exp = n_ff
        why["n_ff_exp"] = f"{a}feed_forward_length = {n_ff} (a {arch.name} model's experts are that wide)"
        if kv.get("expert_feed_forward_length", n_ff) != n_ff:
            raise ModelError(f"{a}expert_feed_forward_length = {kv['expert_feed_forward_length']}: a {arch.name} "
                             f"model's experts are {a}feed_forward_length = {n_ff} wide (llama.cpp reads no other)")
    lead = kv.get("leading_dense_block_count", 0)
    if lead and not arch.dense_lead:
        raise ModelError(f"{a}leading_dense_block_count = {lead}: llama.cpp routes every layer of a {arch.name} "
                         f"model (it does not read this key)")
    if lead > n_layer:
        raise ModelError(f"{a}leading_dense_block_count = {lead} is more than {why['n_layer']}")
    gating = kv.get("expert_gating_func")
    if arch.gating_key and gating is None:
        raise ModelError(f"{a}expert_gating_func is missing: a {arch.name} model's router takes its gating function "
                         f"from it (llama.cpp aborts without one)")
    if not arch.gating_key and gating not in (None, GATING_SOFTMAX):
        raise ModelError(f"{a}expert_gating_func = {gating}: llama.cpp's {arch.name} graph routes by softmax "
                         f"({GATING_SOFTMAX}) whatever the key says; this lab refuses the disagreement")
    why.update(n_expert=f"{a}expert_count = {n_expert}", n_expert_used=f"{a}expert_used_count = {n_used}")
    return {"n_expert": n_expert, "n_expert_used": n_used, "n_ff_exp": n_ff_exp, "n_dense_lead": lead,
            "gating": "sigmoid" if gating == GATING_SIGMOID else "softmax", "probs_bias": arch.expert_bias}


@dataclass(frozen=True)
class Arch:
    """One architecture: its keys, its Config flags, its tensors, what of it is refused, its own reading steps."""
    name: str                       # general.architecture, and the prefix of its config keys
    # the keys read beyond lab.format.rules.COMMON_KEYS (checked after them, in this order), or in another form than
    # the common rule says (that rule replaced, in its place)
    keys: dict[str, Rule] = field(default_factory=dict)
    # -- the Config flags it fixes
    rope_neox: bool = False         # llama_model_rope_type: LLAMA_ROPE_TYPE_NEOX (pairs i, i + n_rot/2), else NORM
    qkv_bias: bool = False          # biases on Q, K, V
    qk_norm: bool = False           # per-head RMSNorm on Q and K
    post_norms: bool = False        # RMSNorm after attention and after the feed-forward as well
    gelu: bool = False              # GeGLU with tanh GELU instead of SwiGLU
    embd_scale: bool = False        # inp_embd multiplied by sqrt(n_embd)
    fused: bool = False             # attn_qkv instead of attn_q/k/v and ffn_up [gate | up] without ffn_gate
    tied_always: bool = False       # the head is token_embd even where the file holds an output.weight
    rope_freqs: bool = False        # reads rope_freqs.weight where the file has one (on every layer)
    whole_head_rope: bool = False   # rope.dimension_count must be the head size
    no_rope_step: int = 0           # layers il with (il + 1) % step == 0 are not rotated; 0: every layer is
    output_norm: str = "output_norm.weight"     # the final norm's tensor
    ffn_norm: str = "ffn_norm.weight"           # the feed-forward's input norm, within a block
    attn_gate: bool = False         # each head's Q rows are [q | gate]
    unit_attn_scale: bool = False   # q.k unscaled (the Q/K norms hold the scale)
    big_attn_scale_layers: int = 0  # at this layer count, q.k is scaled by 1/sqrt(n_embd / n_head); 0: never
    rope_scaling_refused: str = ""  # why linear RoPE scaling is refused, where it is
    # -- its tensors
    per_block: int = 9              # the fewest tensors a block holds (block_count is checked against it first)
    flat_tensors: tuple[str, ...] = ()      # block tensors uploaded as one flat f32 buffer their kernel reads whole
    shared_kv_unread: tuple[str, ...] = ()  # tensors a shared-KV layer may hold that are never read (skipped)
    optional_tensors: tuple[str, ...] = ()  # block tensors a file may leave out, each read as a Config flag
    # -- what is refused by name
    refused_variants: dict[str, str] = field(default_factory=dict)  # general.architecture -> why (its MoE sizes)
    moe_refusal: str = ""           # its own reason for a router tensor or expert_count; "": the generic one
    # -- its routed experts (read_experts; their keys: lab.format.rules.EXPERT_KEYS in `keys`)
    experts: str = ""               # "": none (a router or expert_count is refused); "optional" (llama: Mixtral-style
                                    # files); "required"
    expert_width: str = "key"       # an expert's width: "key" (expert_feed_forward_length), "key_or_split" (else
                                    # n_ff / expert_used_count: qwen3moe), "n_ff" (llama)
    dense_lead: bool = False        # reads leading_dense_block_count (lfm2moe)
    gating_key: bool = False        # the gating function from expert_gating_func (lfm2moe); else softmax, fixed
    expert_bias: bool = False       # each routed layer holds exp_probs_b.bias, added for the choice only (lfm2moe)
    # -- its own reading steps, run by from_gguf at their place (None: it has no such step)
    # (kv, n_layer, mtp, why) -> Config fields of the layer kinds (shortconv / delta, l_cache, ...)
    layer_kinds: Callable[[dict, int, int, dict], dict] | None = None
    # (kv, n_embd, n_head, head_dim, why) -> None, after the generic head checks
    check_heads: Callable[[dict, int, int, int, dict], None] | None = None
    # (kv, n_layer, n_head, tensors, why) -> Config fields of per-layer sizes
    layer_sizes: Callable[[dict, int, int, dict, dict], dict] | None = None
    # (kv, n_rot) -> None, after the generic RoPE checks
    check_rope: Callable[[dict, int], None] | None = None
    sliding: Callable[[dict, int, float], tuple[int, tuple[bool, ...], float]] = no_sliding
    softcaps: Callable[[dict, int], tuple[float, float]] = no_softcaps
    block_tensors: Callable[[Config, str, int, bool], Shapes] = attention_block

    @property
    def config_keys(self) -> dict[str, Rule]:
        """Every config key this architecture reads, in the order they are checked: the common ones (its own rule
        where it reads one in another form), then its own."""
        return {name: self.keys.get(name, rule) for name, rule in COMMON_KEYS.items()} | \
            {name: rule for name, rule in self.keys.items() if name not in COMMON_KEYS}
