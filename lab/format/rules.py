"""What one metadata key may hold: the `Rule` type, the checks of a value, and the config keys every architecture reads.

The keys an architecture reads beyond `COMMON_KEYS`, or in another form, are in its own module (lab.format.arches);
the tokenizer's keys and the two entry points, `check_config` and `check_tokenizer`, in lab.format.checks. The rules
of keys that several architectures read the same way (`SLIDING_WINDOW`, the soft-caps, ...) are here, once.

Rules, as llama.cpp reads the same keys (llama_model::load_hparams), or a refusal where llama.cpp would crash, run
something this engine does not, or silently substitute a default:
* sizes are integers in 1..2^32-1 (llama.cpp reads u32), never bools or floats;
* floats are finite, and positive where the math divides by them or takes their logarithm; every
  float that reaches a shader fits an f32 (a uniform holds f32: 1e300 would become inf);
* keys the engine cannot honour (YaRN/LongRoPE scaling, a RoPE attention factor, experts where the architecture has
  none, shared experts, a scale of the expert weights) are refused.

Every message names the key and shows its value (`show`: long arrays and strings abbreviated). `ModelError` is the
error of every check of lab.format.

What it does not know: which architecture reads which key (lab.format.arches), the tokenizer's keys
(lab.format.checks). Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

U32_MAX = (1 << 32) - 1
F32_MAX = 3.4028234663852886e38
F32_MIN_NORMAL = 1.1754943508222875e-38


class ModelError(ValueError):
    """The file is a valid GGUF but not a model this engine can run; the message names the key or tensor."""


def show(v: object) -> str:
    """A metadata value for a message: scalars as Python writes them, long strings and arrays cut."""
    if isinstance(v, str):
        return repr(v) if len(v) <= 60 else repr(v[:60]) + f"... ({len(v)} characters)"
    if isinstance(v, list):
        head = ", ".join(show(x) for x in v[:3])
        return f"[{head}{', ...' if len(v) > 3 else ''}] ({len(v)} items)" if len(v) > 3 else f"[{head}]"
    return repr(v)


@dataclass(frozen=True)
class Rule:
    kind: str                     # count | uint | float | bool | str | strings | ints | numbers | bools | counts
    required: bool = False
    check: Callable[[object], str | None] | None = None   # the reason the value is refused, or None


def _scalar_type(kind: str, v: object) -> str | None:
    """Why `v` is not of `kind`, or None."""
    if kind in ("count", "uint"):
        if isinstance(v, bool) or not isinstance(v, int):
            return "must be an integer"
        lo = 1 if kind == "count" else 0
        if not lo <= v <= U32_MAX:
            return f"must be in {lo}..{U32_MAX}"
        return None
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return "must be a number"
        if not math.isfinite(v):
            return "must be finite"
        return None
    if kind == "bool":
        return None if isinstance(v, bool) else "must be a bool"
    if kind == "str":
        return None if isinstance(v, str) else "must be a string"
    raise AssertionError(kind)


_ARRAY_TYPES = {"strings": ({str}, "strings"), "ints": ({int}, "integers"), "numbers": ({int, float}, "numbers"),
                "bools": ({bool}, "bools")}


def _type_error(kind: str, v: object) -> str | None:
    if kind == "counts":        # an integer count, or an array of integers (one per layer)
        return _type_error("ints", v) if isinstance(v, list) else _scalar_type("count", v)
    if kind not in _ARRAY_TYPES:
        return _scalar_type(kind, v)
    allowed, what = _ARRAY_TYPES[kind]
    if not isinstance(v, list):
        return f"must be an array of {what}"
    types = set(map(type, v))            # one C-level pass: vocabularies are 10^5 entries
    if not types <= allowed:
        i = next(i for i, x in enumerate(v) if type(x) not in allowed)
        return f"must be an array of {what}; item {i} is {show(v[i])}"
    return None


def check_value(key: str, rule: Rule, v: object, error: type[ModelError] = ModelError) -> None:
    """Raise `error` naming `key` and its value where `v` breaks `rule` (its type, then its own check)."""
    why = _type_error(rule.kind, v)
    if why is None and rule.check is not None:
        why = rule.check(v)
    if why is not None:
        raise error(f"{key} = {show(v)}: {why}")


# --- the checks of a value: the reason it is refused, or None -------------------------------------------------------

def _eps(v: float) -> str | None:
    # RMSNorm divides by sqrt(mean(x^2) + eps): eps must stay a positive normal f32 in the shader.
    return None if F32_MIN_NORMAL <= v <= 1.0 else "must be in [1.2e-38, 1] (RMSNorm's epsilon, an f32)"


def _freq_base(v: float) -> str | None:
    # theta_i = pos * base^(-2i/n_rot): base <= 1 makes frequencies grow with i (and 0 divides by zero).
    return None if 1.0 < v <= F32_MAX else "must be > 1 and fit an f32 (RoPE frequency base)"


def _scale_factor(v: float) -> str | None:
    # llama.cpp: freq_scale = factor == 0 ? 1 : 1 / factor.
    if v == 0:
        return None
    return None if v > 0 and F32_MIN_NORMAL <= 1.0 / v <= F32_MAX else \
        "must be 0 (no scaling) or a positive factor whose inverse fits an f32"


def _scaling_type(v: str) -> str | None:
    # Llama 3's scaling is no type here: its files carry rope_freqs.weight, which lab.format.model applies.
    if v in ("none", "linear"):
        return None
    return (f"RoPE scaling type {v!r} is not supported by this lab (it runs none, linear, and llama 3's "
            f"rope_freqs factors)"
            if v in ("yarn", "longrope") else "is not a RoPE scaling type llama.cpp knows (none, linear, yarn, longrope)")


def _attn_factor(v: float) -> str | None:
    return None if v == 1.0 else "a RoPE attention factor other than 1 is not supported by this lab"


def _no_experts(v: int) -> str | None:
    return None if v == 0 else "mixture-of-experts models are not supported by this lab"


# The router kernel (wgsl/moe.wgsl) walks a token's experts in one invocation: bounds that keep that walk short. The
# releases routed here have 8 (Mixtral), 32 (LFM2-8B-A1B) and 128 (Qwen3-30B-A3B) experts, 2 to 8 a token.
MAX_EXPERTS = 1024
MAX_EXPERTS_USED = 64


def _expert_count(v: int) -> str | None:
    return None if v <= MAX_EXPERTS else f"must be at most {MAX_EXPERTS} (the experts the router kernel walks)"


def _experts_used(v: int) -> str | None:
    return None if 1 <= v <= MAX_EXPERTS_USED else f"must be in 1..{MAX_EXPERTS_USED}"


def _gating(v: int) -> str | None:
    # llama_expert_gating_func_type (src/llama-hparams.h): 1 softmax, 2 sigmoid; 0 (none) makes build_moe_ffn abort
    return None if v in (GATING_SOFTMAX, GATING_SIGMOID) else \
        f"must be {GATING_SOFTMAX} (softmax) or {GATING_SIGMOID} (sigmoid): the gating functions llama.cpp runs"


def _weights_scale(v: float) -> str | None:
    # llama.cpp scales the chosen weights by it where a graph asks (not qwen3moe's, llama's or lfm2's): 1 is no scale
    return None if v in (0.0, 1.0) else "a scale of the expert weights other than 1 is not run by this lab"


def _no_shared_experts(v: int) -> str | None:
    return None if v == 0 else "shared experts (run beside the routed ones) are not run by this lab"


def _softcap(v: float) -> str | None:
    # c * tanh(s / c): a subnormal c flushes to 0 on a GPU, and 0 / 0 is NaN.
    return None if v == 0 or F32_MIN_NORMAL <= v <= F32_MAX else \
        "must be 0 (no soft-capping) or a positive normal f32"


def _per_layer_counts(v: int | list[int]) -> str | None:
    # llama.cpp reads such a key with get_key_or_arr: one count per layer, 0 where the layer has no attention
    if not isinstance(v, list):
        return None
    bad = next((i for i, n in enumerate(v) if not 0 <= n <= U32_MAX), None)
    return None if bad is None else f"item {bad} is {v[bad]}, not a head count (0..{U32_MAX})"


# --- the keys ------------------------------------------------------------------------------------------------------

COMMON_KEYS: dict[str, Rule] = {        # read as f"{general.architecture}.{name}" by every architecture
    "block_count": Rule("count", required=True),
    "embedding_length": Rule("count", required=True),
    "feed_forward_length": Rule("count", required=True),
    "context_length": Rule("count", required=True),
    "attention.head_count": Rule("count", required=True),
    "attention.head_count_kv": Rule("count"),          # default: head_count
    "attention.key_length": Rule("count"),             # default: embedding_length / head_count
    "attention.value_length": Rule("count"),           # must equal the key length
    "attention.layer_norm_rms_epsilon": Rule("float", required=True, check=_eps),
    "rope.freq_base": Rule("float", check=_freq_base),            # default 10000
    "rope.dimension_count": Rule("count"),             # default: the key length
    "rope.scaling.type": Rule("str", check=_scaling_type),        # default "linear", as llama.cpp
    "rope.scaling.factor": Rule("float", check=_scale_factor),
    "rope.scale_linear": Rule("float", check=_scale_factor),      # the older name of the factor
    "rope.scaling.attn_factor": Rule("float", check=_attn_factor),
    "expert_count": Rule("uint", check=_no_experts),   # an architecture with experts reads EXPERT_COUNT instead
    "vocab_size": Rule("count"),                       # when present: the embedding rows
}

# Keys several architectures read alike (each architecture's module says which it reads):
# 0: none. Read where llama.cpp's loader reads it (llama never does: Mistral-style files run with full causal
# attention there, and here); what each architecture does with it: its module's sliding step.
SLIDING_WINDOW = Rule("uint")
# the period of the sliding layers; llama.cpp also takes a per-layer bool array here, this lab only the period (an
# array is refused by type)
SLIDING_PATTERN = Rule("uint")
FREQ_BASE_SWA = Rule("float", check=_freq_base)         # the sliding layers' RoPE base
ATTN_SOFTCAP = Rule("float", check=_softcap)
FINAL_SOFTCAP = Rule("float", check=_softcap)
# one count per layer (0 where the layer has no attention), or a scalar: every layer's (get_key_or_arr)
PER_LAYER_COUNTS = Rule("counts", check=_per_layer_counts)

# The routed experts (llama.cpp's keys, LLM_KV_NAMES; what they mean: lab.format.arches.base.read_experts). An
# architecture with experts reads these in place of the common expert_count.
GATING_SOFTMAX, GATING_SIGMOID = 1, 2     # "{arch}.expert_gating_func" values (llama_expert_gating_func_type)
EXPERT_KEYS: dict[str, Rule] = {
    "expert_count": Rule("uint", check=_expert_count),             # experts of a routed layer (0: none)
    "expert_used_count": Rule("uint", check=_experts_used),        # experts each token is routed to
    "expert_feed_forward_length": Rule("count"),                   # an expert's hidden width
    "leading_dense_block_count": Rule("uint"),                     # the first layers keep a dense FFN
    "expert_gating_func": Rule("uint", check=_gating),             # softmax or sigmoid of the router's logits
    "expert_weights_scale": Rule("float", check=_weights_scale),
    "expert_shared_count": Rule("uint", check=_no_shared_experts),
}
