"""Every metadata value the lab reads, checked for type, range and consistency before anything is uploaded.

The rules of the config keys (read as `{arch}.<name>`) are those every architecture reads (lab.format.rules
`COMMON_KEYS`) and each architecture's own (its module in lab.format.arches: the keys it reads beyond the common ones,
or in another form, such as lfm2's per-layer attention.head_count_kv array, 0 for a short-conv layer); `check_config`
reads an architecture's through the registry, and `CONFIG_KEYS` lists every key some architecture reads. The
tokenizer's keys are here: `TOKENIZER_KEYS`, with the type, the range and the reason. The two builders read through
these: `lab.format.model.from_gguf` takes its values from `check_config` (and checks the tensor table against them),
`lab.text.tokenizer.from_metadata` runs `check_tokenizer` first; so a caller that builds only one of them gets the same
checks. `lab.engine.load.validate` runs both and adds what needs both: the vocabulary against the embedding rows. The
worker and the CLI call `validate` and nothing else before an upload.

Rules, as llama.cpp reads the same keys (llama_model::load_hparams, llama_vocab::load), or a refusal
where llama.cpp would crash, run something this engine does not, or silently substitute a default
(the config keys' own: lab.format.rules):
* token ids are in 0..n_vocab-1 (llama.cpp warns and falls back to its default: we refuse by name);
* arrays have the element type and the length the vocabulary needs.

Every message names the key and shows its value (long arrays and strings abbreviated).

What it does not know: the GPU's limits or the kernels' shape constraints (lab.engine refuses those
before an upload), tensor data (NaN weights are not looked at), or whether a Jinja chat template
renders (lab.text.chat refuses one that does not, at the first message). Standard library only.
"""

from __future__ import annotations

import math
import re

from lab.format.arches import REGISTRY
from lab.format.rules import COMMON_KEYS, ModelError, Rule, check_value, show

N_TOKEN_TYPES = 7                    # llama_token_type: UNDEFINED .. BYTE
TYPE_BYTE = 6


class TokenizerError(ModelError):
    """The file's tokenizer metadata is missing, malformed or of a kind this lab cannot run; the
    message names the key."""


class UnsupportedTokenizer(TokenizerError):
    """The GGUF's tokenizer model (or pre-tokenizer) is one lab.text.tokenizer does not implement."""


# --- the tokenizer's rules ----------------------------------------------------------------------------

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


def _every_config_key() -> dict[str, Rule]:
    """Every config key some architecture reads: the common ones, then each architecture's own (the first
    architecture's rule where several read one; check_config takes each architecture's own)."""
    out = dict(COMMON_KEYS)
    for arch in REGISTRY.values():
        for name, rule in arch.keys.items():
            out.setdefault(name, rule)
    return out


CONFIG_KEYS: dict[str, Rule] = _every_config_key()      # read as f"{general.architecture}.{name}"

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


# --- model config ----------------------------------------------------------------------------------

def check_config(md: dict, arch: str) -> dict[str, object]:
    """The config keys of `arch` present in `md`, each checked: {name: value}. Missing required keys
    raise ModelError naming the key (and the architecture, which chose the prefix)."""
    out: dict[str, object] = {}
    # an architecture this lab does not run: the common keys (from_gguf refuses it by name before it asks)
    rules = REGISTRY[arch].config_keys if arch in REGISTRY else COMMON_KEYS
    for name, rule in rules.items():
        key = f"{arch}.{name}"
        if key not in md:
            if rule.required:
                raise ModelError(f"metadata key {key} is missing (general.architecture = {show(arch)})")
            continue
        check_value(key, rule, md[key])
        out[name] = md[key]
    return out


# --- tokenizer -------------------------------------------------------------------------------------

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def check_tokenizer(md: dict, n_vocab: int | None = None) -> None:
    """Types, ranges and lengths of every tokenizer key; n_vocab: the embedding rows, when known.
    Raises TokenizerError naming the key and value."""
    for key, rule in TOKENIZER_KEYS.items():
        if key in md:
            check_value(key, rule, md[key], TokenizerError)
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
            check_value(key, Rule("uint"), v, TokenizerError)
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
