"""Every metadata value the lab reads, checked for type, range and consistency before anything is uploaded.

This module is the one list of what each key may hold: `CONFIG_KEYS` (read as `{arch}.<name>`) and
`TOKENIZER_KEYS`, with the type, the range and the reason. The two builders read through it:
`lab.format.model.from_gguf` takes its values from `check_config` (and checks the tensor table against them),
`lab.text.tokenizer.from_metadata` runs `check_tokenizer` first; so a caller that builds only one of them
gets the same checks. `lab.engine.load.validate` runs both and adds what needs both: the vocabulary against the
embedding rows. The worker and the CLI call `validate` and nothing else before an upload.

Rules, as llama.cpp reads the same keys (llama_model::load_hparams, llama_vocab::load), or a refusal
where llama.cpp would crash, run something this engine does not, or silently substitute a default:
* sizes are integers in 1..2^32-1 (llama.cpp reads u32), never bools or floats;
* floats are finite, and positive where the math divides by them or takes their logarithm; every
  float that reaches a shader fits an f32 (a uniform holds f32: 1e300 would become inf);
* token ids are in 0..n_vocab-1 (llama.cpp warns and falls back to its default: we refuse by name);
* arrays have the element type and the length the vocabulary needs;
* keys the engine cannot honour (YaRN/LongRoPE scaling, a RoPE attention factor, experts) are refused;
* a key an architecture reads in another form has its own rule in `ARCH_RULES` (lfm2's per-layer
  attention.head_count_kv array, 0 for a short-conv layer).

Every message names the key and shows its value (long arrays and strings abbreviated).

What it does not know: the GPU's limits or the kernels' shape constraints (lab.engine refuses those
before an upload), tensor data (NaN weights are not looked at), or whether a Jinja chat template
renders (lab.text.chat refuses one that does not, at the first message). Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

U32_MAX = (1 << 32) - 1
F32_MAX = 3.4028234663852886e38
F32_MIN_NORMAL = 1.1754943508222875e-38
N_TOKEN_TYPES = 7                    # llama_token_type: UNDEFINED .. BYTE
TYPE_BYTE = 6


class ModelError(ValueError):
    """The file is a valid GGUF but not a model this engine can run; the message names the key or tensor."""


class TokenizerError(ModelError):
    """The file's tokenizer metadata is missing, malformed or of a kind this lab cannot run; the
    message names the key."""


class UnsupportedTokenizer(TokenizerError):
    """The GGUF's tokenizer model (or pre-tokenizer) is one lab.text.tokenizer does not implement."""


def show(v: object) -> str:
    """A metadata value for a message: scalars as Python writes them, long strings and arrays cut."""
    if isinstance(v, str):
        return repr(v) if len(v) <= 60 else repr(v[:60]) + f"... ({len(v)} characters)"
    if isinstance(v, list):
        head = ", ".join(show(x) for x in v[:3])
        return f"[{head}{', ...' if len(v) > 3 else ''}] ({len(v)} items)" if len(v) > 3 else f"[{head}]"
    return repr(v)


# --- the rules --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    kind: str                     # count | uint | float | bool | str | strings | ints | numbers | bools | counts
    required: bool = False
    check: Callable[[object], str | None] | None = None   # the reason the value is refused, or None
    archs: tuple[str, ...] = ()   # config keys: the architectures that read it (empty: all)


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


def _softcap(v: float) -> str | None:
    # c * tanh(s / c): a subnormal c flushes to 0 on a GPU, and 0 / 0 is NaN.
    return None if v == 0 or F32_MIN_NORMAL <= v <= F32_MAX else \
        "must be 0 (no soft-capping) or a positive normal f32"


def _nonempty(v: list) -> str | None:
    return None if v else "must not be empty"


def _token_types(v: list[int]) -> str | None:
    if set(v) <= set(range(N_TOKEN_TYPES)):
        return None
    i = next(i for i, t in enumerate(v) if not 0 <= t < N_TOKEN_TYPES)
    return f"item {i} is {v[i]}, not a token type (0..{N_TOKEN_TYPES - 1})"


def _scores(v: list) -> str | None:
    # Scores are compared, never combined: infinities order fine, NaN does not. The sum is NaN when an
    # item is (or when +inf meets -inf): only then the items are looked at one by one.
    if not math.isnan(sum(v)) or not any(map(math.isnan, v)):
        return None
    return f"item {next(i for i, s in enumerate(v) if math.isnan(s))} is NaN"


def _merges(v: list[str]) -> str | None:
    # llama.cpp splits a merge at its first space after the first character: there must be one,
    # with something after it (" " in m[1:-1] says exactly that).
    if all([" " in m[1:-1] for m in v]):
        return None
    i = next(i for i, m in enumerate(v) if " " not in m[1:-1])
    return f"item {i} is {show(v[i])}, not of the form 'left right'"


CONFIG_KEYS: dict[str, Rule] = {        # read as f"{general.architecture}.{name}"
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
    "expert_count": Rule("uint", check=_no_experts),
    "vocab_size": Rule("count"),                       # when present: the embedding rows
    # 0: none. Read where llama.cpp's loader reads it: llama never does (Mistral-style files run with full causal
    # attention there, and here); phi3 reads it and switches SWA off; gemma2 / gemma3 slide (lab.format.model).
    "attention.sliding_window": Rule("uint", archs=("phi3", "gemma2", "gemma3", "lfm2", "gemma4")),
    # llama.cpp also takes a per-layer bool array here; this lab only the period (an array is refused by type)
    "attention.sliding_window_pattern": Rule("uint", archs=("gemma2", "gemma3")),
    "rope.freq_base_swa": Rule("float", check=_freq_base, archs=("gemma2", "gemma3", "gemma4")),
    "attn_logit_softcapping": Rule("float", check=_softcap, archs=("gemma2", "gemma3")),
    "final_logit_softcapping": Rule("float", check=_softcap, archs=("gemma2", "gemma3", "gemma4")),
    # lfm2: the short conv's taps (llama.cpp: n_shortconv_l_cache, asserted > 1; its range: lab.format.model)
    "shortconv.l_cache": Rule("count", required=True, archs=("lfm2",)),
    # false for LFM2's bidirectional embedding models (refused by lab.format.model)
    "attention.causal": Rule("bool", archs=("lfm2",)),
    # qwen35's gated delta-net layers (llama_model_qwen35::load_arch_hparams; their agreement: lab.format.model)
    "ssm.conv_kernel": Rule("count", required=True, archs=("qwen35",)),     # taps of the conv over q, k, v
    "ssm.inner_size": Rule("count", required=True, archs=("qwen35",)),      # value heads x head size
    "ssm.state_size": Rule("count", required=True, archs=("qwen35",)),      # the head size d_k = d_v
    "ssm.time_step_rank": Rule("count", required=True, archs=("qwen35",)),  # value heads
    "ssm.group_count": Rule("count", required=True, archs=("qwen35",)),     # key heads
    "full_attention_interval": Rule("count", archs=("qwen35",)),            # default 4: every 4th layer attends
    "attention.recurrent_layers": Rule("bools", archs=("qwen35",)),         # per layer, instead of the interval
    "rope.dimension_sections": Rule("ints", required=True, archs=("qwen35",)),  # the multi-axis RoPE's 4 sections
    "nextn_predict_layers": Rule("uint", archs=("qwen35",)),     # trailing multi-token-prediction blocks (skipped)
    # gemma4 (llama_model_gemma4::load_arch_hparams; their agreement: lab.format.model): sliding layers' own head size
    # and rotated dims, the trailing layers that read an earlier layer's K/V, the per-layer embedding width
    "attention.key_length_swa": Rule("count", required=True, archs=("gemma4",)),
    "attention.value_length_swa": Rule("count", required=True, archs=("gemma4",)),
    "rope.dimension_count_swa": Rule("count", archs=("gemma4",)),
    "attention.shared_kv_layers": Rule("uint", archs=("gemma4",)),
    "embedding_length_per_layer_input": Rule("uint", required=True, archs=("gemma4",)),
    "expert_feed_forward_length": Rule("uint", archs=("gemma4",)),   # MoE sizes only: refused (lab.format.model)
}


def _kv_heads_per_layer(v: int | list[int]) -> str | None:
    # llama.cpp reads the key with get_key_or_arr: one count per layer, 0 where the layer has no attention
    if not isinstance(v, list):
        return None
    bad = next((i for i, n in enumerate(v) if not 0 <= n <= U32_MAX), None)
    return None if bad is None else f"item {bad} is {v[bad]}, not a head count (0..{U32_MAX})"


# Keys an architecture reads in another form than CONFIG_KEYS says (replacing that rule for it).
ARCH_RULES: dict[str, dict[str, Rule]] = {
    # lfm2: one KV head count per layer, 0 for a short-conv layer (a scalar is read as every layer's)
    "lfm2": {"attention.head_count_kv": Rule("counts", check=_kv_heads_per_layer)},
    # gemma4: the sliding layers as a per-layer bool array (no period); KV heads and FFN widths per layer (the
    # shared-KV layers' FFN may be double-wide); a scalar is every layer's (get_key_or_arr)
    "gemma4": {"attention.sliding_window_pattern": Rule("bools", required=True),
               "attention.sliding_window": Rule("count", required=True),
               "attention.head_count_kv": Rule("counts", check=_kv_heads_per_layer),
               "feed_forward_length": Rule("counts", required=True, check=_kv_heads_per_layer)},
}

TOKENIZER_KEYS: dict[str, Rule] = {
    "tokenizer.ggml.model": Rule("str", required=True),
    "tokenizer.ggml.pre": Rule("str"),
    "tokenizer.ggml.tokens": Rule("strings", required=True, check=_nonempty),
    "tokenizer.ggml.token_type": Rule("ints", check=_token_types),
    "tokenizer.ggml.scores": Rule("numbers", check=_scores),
    "tokenizer.ggml.merges": Rule("strings", check=_merges),
    "tokenizer.ggml.add_bos_token": Rule("bool"),
    "tokenizer.ggml.add_eos_token": Rule("bool"),
    "tokenizer.ggml.add_sep_token": Rule("bool"),
    "tokenizer.ggml.add_space_prefix": Rule("bool"),
    "tokenizer.chat_template": Rule("str"),
}
# Every special-token id key (bos, eos, unknown, eot, eom, padding, seperator, cls, mask, fim_*):
# an integer in 0..n_vocab-1.
TOKEN_ID_KEY = re.compile(r"tokenizer\.ggml\.\w+_token_id")


def _check(key: str, rule: Rule, v: object, error=ModelError) -> None:
    why = _type_error(rule.kind, v)
    if why is None and rule.check is not None:
        why = rule.check(v)
    if why is not None:
        raise error(f"{key} = {show(v)}: {why}")


# --- model config ----------------------------------------------------------------------------------

def check_config(md: dict, arch: str) -> dict[str, object]:
    """The config keys of `arch` present in `md`, each checked: {name: value}. Missing required keys
    raise ModelError naming the key (and the architecture, which chose the prefix)."""
    out: dict[str, object] = {}
    for name, rule in CONFIG_KEYS.items():
        rule = ARCH_RULES.get(arch, {}).get(name, rule)
        if rule.archs and arch not in rule.archs:
            continue
        key = f"{arch}.{name}"
        if key not in md:
            if rule.required:
                raise ModelError(f"metadata key {key} is missing (general.architecture = {show(arch)})")
            continue
        _check(key, rule, md[key])
        out[name] = md[key]
    return out


# --- tokenizer -------------------------------------------------------------------------------------

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def check_tokenizer(md: dict, n_vocab: int | None = None) -> None:
    """Types, ranges and lengths of every tokenizer key; n_vocab: the embedding rows, when known.
    Raises TokenizerError naming the key and value."""
    for key, rule in TOKENIZER_KEYS.items():
        if key in md:
            _check(key, rule, md[key], TokenizerError)
        elif rule.required:
            raise TokenizerError(f"metadata key {key} is missing: the file has no tokenizer this lab can run")
    tokens = md["tokenizer.ggml.tokens"]
    n = len(tokens)
    if n_vocab is not None and n != n_vocab:
        raise TokenizerError(f"tokenizer.ggml.tokens has {n} tokens, but token_embd.weight has {n_vocab} rows")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in md and len(md[key]) != n:
            raise TokenizerError(f"{key} has {len(md[key])} items, tokenizer.ggml.tokens {n}")
    for key, v in md.items():
        if TOKEN_ID_KEY.fullmatch(key):
            _check(key, Rule("uint"), v, TokenizerError)
            if v >= n:
                raise TokenizerError(f"{key} = {v}: not a token id (the vocabulary has {n} tokens)")
    types = md.get("tokenizer.ggml.token_type")
    i = -1
    for _ in range(types.count(TYPE_BYTE) if types is not None else 0):   # list.index: the scan runs in C
        i = types.index(TYPE_BYTE, i + 1)
        if not _BYTE_TOKEN.fullmatch(tokens[i]):
            raise TokenizerError(f"tokenizer.ggml.token_type[{i}] = {TYPE_BYTE} (byte), but tokenizer.ggml.tokens[{i}] "
                                 f"= {show(tokens[i])} is not spelled <0xNN>")
    if md["tokenizer.ggml.model"] == "gpt2" and "tokenizer.ggml.merges" not in md:
        raise TokenizerError("metadata key tokenizer.ggml.merges is missing: tokenizer.ggml.model = 'gpt2' "
                             "(byte-level BPE) needs it")
