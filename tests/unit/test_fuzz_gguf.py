"""Fuzzing the GGUF reader and what follows it (Hypothesis): random byte damage, truncation, extreme integers
in every header field. The property: `gguf.read` then `lab.engine.load.validate` (then a short encode and
chat rendering) ends in a GGUFError or a ModelError with a message, or a model that works; never another
exception, a hang or a crash. And reading through growing prefixes (as the page and `read_file` do)
gives the same answer as reading the whole file.

Seeds and settings: tests/unit/fuzzkit.py (LAB_FUZZ_EXAMPLES=N for a deep run).
"""

from __future__ import annotations

import functools
import struct

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from lab.engine.load import Validated
from lab.format import gguf
from lab.format.gguf import GGUFError, NeedMoreBytes
from tests.unit.fuzzkit import (
    Hang,
    fuzz_settings,
    load,
    load_bytes,
    no_hang,
    seed,
    seed_header,
)

SEEDS = ["smollm2", "qwen2.5", "gemma3"]
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def header_fields(data: bytes) -> list[tuple[int, int, str]]:
    """(offset, width in bytes, what) of every number in the header: counts, lengths, value types,
    scalar values and array items, tensor dims, types and offsets. Walked here, not by lab.format.gguf."""
    out: list[tuple[int, int, str]] = []
    pos = 4
    assert len(data) < 1 << 24

    def num(width: int, what: str) -> int:
        nonlocal pos
        out.append((pos, width, what))
        v = int.from_bytes(data[pos:pos + width], "little")
        pos += width
        return v

    def string(what: str) -> None:
        nonlocal pos
        n = num(8, f"length of {what}")      # not `pos += num(...)`: that reads pos before num moves it
        pos += n

    def value(vtype: int, what: str) -> None:
        if vtype in _SCALAR_SIZES:
            num(_SCALAR_SIZES[vtype], what)
        elif vtype == 8:
            string(what)
        else:
            etype = num(4, f"element type of {what}")
            for i in range(num(8, f"length of {what}")):
                value(etype, f"{what}[{i}]")

    num(4, "version")
    n_tensors, n_kv = num(8, "tensor count"), num(8, "kv count")
    for i in range(n_kv):
        string(f"key #{i}")
        value(num(4, f"value type #{i}"), f"value #{i}")
    for i in range(n_tensors):
        string(f"tensor name #{i}")
        for j in range(num(4, f"n_dims #{i}")):
            num(8, f"dim {j} of tensor #{i}")
        num(4, f"type of tensor #{i}")
        num(8, f"offset of tensor #{i}")
    assert pos == seed_header_bytes(data)
    return out


def seed_header_bytes(data: bytes) -> int:
    return gguf.read(data, len(data)).header_bytes


@functools.cache
def fields_of(name: str) -> list[tuple[int, int, str]]:
    return header_fields(seed(name))


def extremes(width: int) -> st.SearchStrategy[int]:
    top = (1 << 8 * width) - 1
    special = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 31, 32, 33, 255, 256, top, top - 1, top >> 1, (top >> 1) + 1,
               1 << 24, (1 << 24) + 1, 1 << 28, 1 << 30, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 63, (1 << 64) - 1]
    if width == 4:   # where the field is an f32: NaN, infinities, -0, the largest and the smallest
        special += [0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x7F7FFFFF, 0x00000001, 0xBF800000]
    return st.one_of(st.sampled_from([v for v in special if v <= top]), st.integers(0, top))


@st.composite
def field_edits(draw):
    name = draw(st.sampled_from(SEEDS))
    fields = fields_of(name)
    edits = draw(st.lists(st.sampled_from(range(len(fields))).flatmap(
        lambda i: st.tuples(st.just(fields[i]), extremes(fields[i][1]))), min_size=1, max_size=3))
    return name, edits


def outcome(out) -> str:
    """The kind of answer, for Hypothesis' statistics (--hypothesis-show-statistics)."""
    return "a valid model" if isinstance(out, Validated) else type(out).__name__


def read_by_prefixes(data: bytes, first: int = 256):
    """What the worker's read_header and gguf.read_file do: a prefix that grows on NeedMoreBytes."""
    size, n, tries = len(data), min(first, len(data)), 0
    while True:
        tries += 1
        assert tries < 64, "the prefix protocol does not converge"
        try:
            return gguf.read(data[:n], size)
        except NeedMoreBytes as e:
            assert n < e.needed <= size, (n, e.needed, size)
            n = max(e.needed, min(size, 2 * n))


def same_outcome(data: bytes) -> None:
    """The whole file at once and growing prefixes agree: the same header, or both a GGUFError."""
    with no_hang():
        try:
            whole = gguf.read(data, len(data))
        except GGUFError as e:
            assert type(e) is GGUFError and str(e)
            whole = None
        try:
            grown = read_by_prefixes(data)
        except GGUFError as e:
            assert type(e) is GGUFError and str(e)
            grown = None
    assert (whole is None) == (grown is None)
    if whole is not None:
        assert repr(whole.metadata) == repr(grown.metadata)     # repr: NaN != NaN
        assert whole.tensors == grown.tensors


@fuzz_settings(300)
@given(name=st.sampled_from(SEEDS), data=st.data())
def test_byte_damage(name, data):
    raw = bytearray(seed(name))
    n_header = seed_header(name).header_bytes
    damage = data.draw(st.lists(st.tuples(st.integers(0, n_header + 63), st.integers(0, 255)), min_size=1, max_size=8))
    for pos, byte in damage:
        raw[pos] = byte
    cut = len(raw) if data.draw(st.integers(0, 9)) else data.draw(st.integers(0, len(raw)))   # 1 in 10 cut short
    blob = bytes(raw[:cut])
    event(outcome(load_bytes(blob)))
    same_outcome(blob)


@fuzz_settings(300)
@given(edit=field_edits())
def test_extreme_header_fields(edit):
    name, edits = edit
    raw = bytearray(seed(name))
    for (pos, width, _what), v in edits:
        raw[pos:pos + width] = v.to_bytes(width, "little")
    event(outcome(load_bytes(bytes(raw))))
    same_outcome(bytes(raw))


@fuzz_settings(200)
@given(name=st.sampled_from(SEEDS), data=st.data())
def test_truncation_and_prefixes(name, data):
    full = seed(name)
    cut = data.draw(st.integers(0, len(full) - 1))
    # A file cut short: GGUFError (truncated), never NeedMoreBytes, since there is nothing more to read.
    out = load_bytes(full[:cut])
    assert type(out) is GGUFError, out
    # A prefix of an intact file: the header, or NeedMoreBytes asking for more bytes than it had.
    try:
        h = gguf.read(full[:cut], len(full))
        assert h.header_bytes <= cut
    except NeedMoreBytes as e:
        assert cut < e.needed <= len(full)


def test_the_field_walker_sees_every_field():
    """The fields that test_extreme_header_fields edits include each kind of header number."""
    for name in SEEDS:
        whats = {w.split(" #")[0].split(" of ")[0] for _, _, w in fields_of(name)}
        assert {"version", "tensor count", "kv count", "length", "value type", "element type", "n_dims",
                "dim 0", "dim 1", "type", "offset"} <= whats, whats


def test_seeds_are_valid_models():
    for name in SEEDS:
        assert isinstance(load(seed_header(name)), Validated)


@pytest.mark.parametrize("value, word", [(struct.pack("<f", float("nan")), "finite"),
                                         (struct.pack("<f", -1e-5), "epsilon")])
def test_a_damaged_float_is_named(value, word):
    """An f32 edited in the file (not in memory) reaches validate and is refused by key."""
    raw = bytearray(seed("smollm2"))
    key = b"llama.attention.layer_norm_rms_epsilon"
    at = raw.index(key) + len(key) + 4          # after the key and its value type
    raw[at:at + 4] = value
    err = load_bytes(bytes(raw))
    assert "llama.attention.layer_norm_rms_epsilon" in str(err) and word in str(err), err


def test_the_watchdog_counts_cpu_time_not_wall_time():
    """no_hang stops a spin (a hang burns CPU) and lets a starved or sleeping block finish (the machine's load is not
    a hang): the fuzz sweeps' watchdog holds on a busy machine."""
    import time

    with pytest.raises(Hang):
        with no_hang(0.3):
            while True:
                pass
    with no_hang(0.3):
        time.sleep(0.6)
