"""Fuzzing the metadata (Hypothesis): every key the lab reads set to the wrong type, an empty value, zero, a
negative value, NaN, an infinity, a huge value, or removed; array items replaced, arrays cut or grown,
tokens duplicated. The property, on the load-time path of the page and the CLI (`lab.engine.load.validate`,
then a short encode, decode and chat rendering): a ModelError whose message names one of the keys that
were changed, or a model that works; never another exception or a hang.

The mutations are made on the parsed header's metadata dict (what lab.format.gguf hands over); test_fuzz_gguf.py
damages the bytes. Seeds and settings: tests/unit/fuzzkit.py (LAB_FUZZ_EXAMPLES=N for a deep run).
"""

from __future__ import annotations

import math

from hypothesis import event, given
from hypothesis import strategies as st

from lab.engine.load import Validated, validate
from lab.format import checks
from lab.format.model import ModelError
from tests.unit.fuzzkit import (
    ARCH,
    fuzz_settings,
    load,
    seed_header,
    use,
    with_metadata,
)

SEEDS = ["smollm2", "qwen2.5", "gemma3"]
REMOVE = "<removed>"
ID_KEYS = [f"tokenizer.ggml.{n}_token_id" for n in
           ("bos", "eos", "unknown", "padding", "eot", "eom", "seperator", "cls", "mask",
            "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")]


def keys_read(name: str) -> list[str]:
    """Every key the lab reads for this seed's architecture, and every key the seed has."""
    arch = ARCH[name]
    keys = ["general.architecture", *(f"{arch}.{k}" for k in checks.CONFIG_KEYS), *checks.TOKENIZER_KEYS,
            *ID_KEYS, *seed_header(name).metadata]
    return sorted(set(keys))


# The values a hostile file can give a key: wrong types, empty, zero, negative, NaN, infinite, huge.
BAD = [REMOVE, "", "x", "linear", "none", "yarn", "gpt2", "llama", "{{ x", "\udc80", 0, 1, -1, 2, 3, 6, 7, 8,
       2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1, -2**63, 0.0, -0.0, -1.0, 1e-45, 1e-39, 1e-6, 0.5, 1.0,
       2.0, 1e30, 3.4028234663852886e38, 3.5e38, 1e300, math.nan, math.inf, -math.inf, True, False,
       [], [0], [-1], [1.5], ["a"], ["a b"], [[1]], [math.nan], [True], [""]]
SCALAR = st.one_of(st.sampled_from([v for v in BAD if not isinstance(v, list) and v is not REMOVE]),
                   st.integers(), st.floats(), st.text(max_size=12), st.booleans())
VALUE = st.one_of(st.sampled_from(BAD), SCALAR, st.lists(SCALAR, max_size=4))


def plausible(old) -> st.SearchStrategy:
    """Values of the old value's type, in or near its range: the ones that get past the type checks."""
    if isinstance(old, bool):
        return st.booleans()
    if isinstance(old, int):
        return st.integers(0, max(2 * old + 2, 8))
    if isinstance(old, float):
        top = 4 * old + 1 if math.isfinite(old) and 0 < old < 1e30 else 10.0
        return st.floats(min_value=0.0, max_value=top, allow_nan=False)
    if isinstance(old, str):
        return st.sampled_from([old, old.upper(), old[:-1], "default", "gpt-2", "llama3", "qwen2"]) | st.text(max_size=30)
    if old and isinstance(old[0], int):
        return st.lists(st.integers(0, 6), min_size=len(old), max_size=len(old)).map(lambda v: v[:1] + old[1:])
    if old and isinstance(old[0], float):
        return st.floats(allow_nan=False).map(lambda f: [f] + old[1:])
    return st.text(max_size=8).map(lambda t: [t] + old[1:])


@st.composite
def mutations(draw, name: str):
    """1 to 3 changes [(key, what was done)], applied to a copy of the seed's metadata."""
    md = dict(seed_header(name).metadata)
    keys = keys_read(name)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys))
        old = md.get(key)
        if old is not None and draw(st.integers(0, 3)) == 0:     # a plausible value: same type, near the old one
            v = draw(plausible(old))
            md[key] = v
            done.append((key, v))
        elif isinstance(old, list) and old and draw(st.booleans()):
            new = list(old)
            kind = draw(st.sampled_from(["item", "cut", "grow", "duplicate"]))
            i = draw(st.integers(0, len(new) - 1))
            if kind == "item":
                new[i] = draw(SCALAR)
            elif kind == "cut":
                del new[i:]
            elif kind == "grow":
                new.append(draw(SCALAR) if draw(st.booleans()) else new[i])
            else:
                new[i] = new[draw(st.integers(0, len(new) - 1))]
            md[key] = new
            done.append((key, f"{kind} {i}"))
        else:
            v = draw(VALUE)
            if v == REMOVE:
                md.pop(key, None)
            else:
                md[key] = v
            done.append((key, v if not isinstance(v, str) or len(v) < 20 else v[:20]))
    return md, done


def check(name: str, md: dict, changed: list[str]) -> object:
    out = load(with_metadata(seed_header(name), md))
    if isinstance(out, ModelError):
        assert any(k in str(out) for k in changed), f"{out!r} names none of {changed}"
    return out


def kind(out) -> str:
    return "a valid model" if isinstance(out, Validated) else type(out).__name__


@fuzz_settings(400)
@given(name=st.sampled_from(SEEDS), data=st.data())
def test_hostile_metadata(name, data):
    md, done = data.draw(mutations(name))
    event(kind(check(name, md, [k for k, _ in done])))


def test_every_key_with_every_kind_of_bad_value(request):
    """The sweep behind the random search: each key the lab reads x each value of BAD, one at a time. By default on
    smollm2 (BPE) and gemma3 (SentencePiece); qwen2.5's (BPE again, its 151,936 tokens the slowest to rebuild a
    value) with --slow; the random search above draws from all three."""
    outcomes: dict[str, int] = {}
    for name in SEEDS if request.config.getoption("--slow") else ["smollm2", "gemma3"]:
        base = seed_header(name).metadata
        for key in keys_read(name):
            for v in BAD:
                md = dict(base)
                if v == REMOVE:
                    md.pop(key, None)
                else:
                    md[key] = v
                out = check(name, md, [key])
                kind = "valid" if isinstance(out, Validated) else "refused"
                outcomes[kind] = outcomes.get(kind, 0) + 1
    assert outcomes["refused"] > outcomes["valid"], outcomes


def test_the_issue_examples_are_refused_by_name():
    h = seed_header("smollm2")
    cases = {"llama.rope.freq_base": math.nan, "llama.attention.layer_norm_rms_epsilon": -1e-5,
             "tokenizer.ggml.tokens": REMOVE}
    for key, v in cases.items():
        md = dict(h.metadata)
        md.pop(key) if v == REMOVE else md.__setitem__(key, v)
        out = load(with_metadata(h, md))
        assert isinstance(out, ModelError) and key in str(out), out
    md = dict(h.metadata, **{"tokenizer.ggml.tokens": list(range(len(h.metadata["tokenizer.ggml.tokens"])))})
    out = load(with_metadata(h, md))
    assert isinstance(out, checks.TokenizerError) and "tokenizer.ggml.tokens" in str(out) \
        and "must be an array of strings" in str(out), out


class Recording(dict):
    """A metadata dict that notes every key looked up by name."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read: set[str] = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        self.read.add(k)
        return super().get(k, default)

    def __contains__(self, k):
        self.read.add(k)
        return super().__contains__(k)


def test_no_key_is_read_that_the_rules_do_not_cover():
    """Every key validate, the tokenizer and the chat template read is in lab.format.checks's tables: a
    new read without a rule fails here."""
    for name in SEEDS:
        md = Recording(seed_header(name).metadata)
        checked = validate(with_metadata(seed_header(name), md))
        use(checked, md)
        arch = ARCH[name]
        covered = {"general.architecture", *(f"{arch}.{k}" for k in checks.CONFIG_KEYS), *checks.TOKENIZER_KEYS}
        stray = {k for k in md.read if k not in covered and not checks.TOKEN_ID_KEY.fullmatch(k)}
        assert not stray, stray
