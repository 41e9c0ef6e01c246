"""LoRA adapter files (lab/format/adapter.py): what write_adapter writes, read_adapter and gguf-py read back; every
file read_adapter must refuse, each built by the tests' own GGUF writer (adapterkit, not the module's), refused with a
one-line ModelError naming the key or tensor and the number (tests/unit/test_lora_reference.py runs such files
through llama.cpp's loader too); the decoders against gguf-py's; and damaged files (every header byte changed, then
Hypothesis's random damage) ending in an Adapter or a ModelError, never another exception or a hang."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize
from hypothesis import given
from hypothesis import strategies as st

from lab.format import gguf
from lab.format import model
from lab.format.adapter import (
    ADAPTER_TYPES,
    Adapter,
    decode_f32,
    read_adapter,
    read_adapter_file,
    write_adapter,
)
from lab.format.rules import ModelError
from tests.unit.adapterkit import BF16, F16, F64, F32, Q4_0, Q8_0, gguf_bytes, good_kvs, pair, rng_f32, tensor
from tests.unit.fuzzkit import fuzz_settings, no_hang

KEYS = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
        "llama.feed_forward_length": 96, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
        "llama.context_length": 256, "llama.attention.layer_norm_rms_epsilon": 1e-5}
CFG = model.config_of_keys(KEYS, 100)       # llama, 2 blocks of 64, n_ff 96, KV width 32, an untied head
TABLE = model.stored_tensors(CFG)
PAIRS = (("blk.0.attn_q.weight", 64, 64, 4), ("blk.1.ffn_down.weight", 96, 64, 2))   # (base, n_in, n_out, rank)


def pair_arrays(i: int, n_in: int, n_out: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """A (rank, n_in) and B (n_out, rank), row-major as the file holds them."""
    return rng_f32(2 * i, rank, n_in), rng_f32(2 * i + 1, n_out, rank)


def written(alpha: float = 8.0, pairs=PAIRS) -> bytes:
    return write_adapter("llama", alpha, [(b, n_in, n_out, r, *(x.tobytes() for x in pair_arrays(i, n_in, n_out, r)))
                                          for i, (b, n_in, n_out, r) in enumerate(pairs)], name="test adapter")


def good_tensors() -> list:
    return [t for i, (b, n_in, n_out, r) in enumerate(PAIRS) for t in pair(b, n_in, n_out, r, 2 * i)]


def refused(data: bytes, match: str, file_size: int | None = None, tensors=None) -> str:
    with pytest.raises(ModelError, match=match) as e:
        read_adapter(data, len(data) if file_size is None else file_size, CFG, tensors)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# -- the writer and the reader ----------------------------------------------------------------------------------

def test_written_adapter_reads_back():
    data = written()
    ad = read_adapter(data, len(data), CFG)
    assert isinstance(ad, Adapter)
    assert (ad.arch, ad.alpha, ad.name, ad.ignored) == ("llama", 8.0, "test adapter", ())
    assert ad.bases == tuple(p[0] for p in PAIRS)
    for i, (base, n_in, n_out, rank) in enumerate(PAIRS):
        p = ad.pair(base)
        assert (p.rank, p.n_in, p.n_out, p.scale, p.a_type, p.b_type) == (rank, n_in, n_out, 8.0 / rank, "F32", "F32")
        assert p.a_offset % 32 == 0 and p.b_offset % 32 == 0
        a, b = pair_arrays(i, n_in, n_out, rank)
        got_a = np.array(decode_f32(data[p.a_offset:p.a_offset + p.a_nbytes], p.a_type)).reshape(rank, n_in)
        got_b = np.array(decode_f32(data[p.b_offset:p.b_offset + p.b_nbytes], p.b_type)).reshape(n_out, rank)
        assert np.array_equal(got_a, a) and np.array_equal(got_b, b)
    assert ad.nbytes == sum(4 * r * (n_in + n_out) for _, n_in, n_out, r in PAIRS)
    assert ad.pair("blk.0.attn_k.weight") is None


def test_gguf_py_reads_what_we_write(tmp_path):
    path = tmp_path / "a.gguf"
    path.write_bytes(written(alpha=16.0))
    r = GGUFReader(str(path))
    got = {k: r.fields[k].contents() for k in ("general.architecture", "general.type", "general.name",
                                               "adapter.type", "adapter.lora.alpha")}
    assert got == {"general.architecture": "llama", "general.type": "adapter", "general.name": "test adapter",
                   "adapter.type": "lora", "adapter.lora.alpha": 16.0}
    tensors = {t.name: t for t in r.tensors}
    assert len(tensors) == 2 * len(PAIRS)
    for i, (base, n_in, n_out, rank) in enumerate(PAIRS):
        a, b = pair_arrays(i, n_in, n_out, rank)
        ta, tb = tensors[base + ".lora_a"], tensors[base + ".lora_b"]
        assert ta.shape.tolist() == [n_in, rank] and tb.shape.tolist() == [rank, n_out]     # ggml order, ne0 first
        assert ta.tensor_type == tb.tensor_type == GGMLQuantizationType.F32
        assert np.array_equal(np.asarray(ta.data).reshape(rank, n_in), a)
        assert np.array_equal(np.asarray(tb.data).reshape(n_out, rank), b)
    assert read_adapter_file(path, CFG).alpha == 16.0


def test_the_test_writer_agrees_with_the_module_writer():
    """The hostile files below come from the test's own writer: its valid file reads as write_adapter's does."""
    mine, theirs = gguf_bytes(good_kvs(), good_tensors()), written()
    a, b = read_adapter(mine, len(mine), CFG), read_adapter(theirs, len(theirs), CFG)
    assert [(p.base, p.rank, p.n_in, p.n_out) for p in a.pairs] == [(p.base, p.rank, p.n_in, p.n_out) for p in b.pairs]


def test_a_short_prefix_asks_for_more_and_a_table_may_be_given():
    data = written()
    with pytest.raises(gguf.NeedMoreBytes) as e:
        read_adapter(data[:40], len(data), CFG)
    assert read_adapter(data[:e.value.needed * 8], len(data), CFG).bases     # the data need not be in the prefix
    header = gguf.read(data, len(data))
    assert read_adapter(data[:header.header_bytes], len(data), CFG).alpha == 8.0
    table = {"blk.0.attn_q.weight": (64, 64), "blk.1.ffn_down.weight": (96, 64)}
    assert read_adapter(data, len(data), CFG, table).bases == ("blk.0.attn_q.weight", "blk.1.ffn_down.weight")


def test_norm_tensors_are_ignored_as_llama_cpp_ignores_them():
    data = gguf_bytes(good_kvs(), good_tensors() + [tensor("blk.0.attn_norm.weight", (64,))])
    assert read_adapter(data, len(data), CFG).ignored == ("blk.0.attn_norm.weight",)


@pytest.mark.parametrize("type_id", [F16, BF16, Q8_0])
def test_other_types_read_and_decode_as_gguf_py_decodes_them(type_id):
    qt = GGMLQuantizationType(type_id)
    rank = 32 if type_id == Q8_0 else 4         # a Q8_0 row is whole 32-blocks: B's rows are rank long
    values = rng_f32(5, 64 * rank).reshape(rank, 64)
    raw_a = quantize(values, qt).tobytes()
    raw_b = quantize(rng_f32(6, 64, rank), qt).tobytes()
    data = gguf_bytes(good_kvs(), [("blk.0.attn_q.weight.lora_a", (64, rank), type_id, raw_a),
                                   ("blk.0.attn_q.weight.lora_b", (rank, 64), type_id, raw_b)])
    p = read_adapter(data, len(data), CFG).pairs[0]
    assert (p.a_type, p.rank, p.a_nbytes) == (qt.name, rank, len(raw_a))
    got = np.array(decode_f32(data[p.a_offset:p.a_offset + p.a_nbytes], p.a_type), dtype=np.float32)
    want = dequantize(np.frombuffer(raw_a, np.uint8), qt).astype(np.float32).ravel()
    assert np.array_equal(got, want)
    assert np.abs(got - values.ravel()).max() < 0.05


def test_decode_f32_refuses_what_it_cannot_decode():
    with pytest.raises(ModelError, match="Q4_0"):
        decode_f32(bytes(18), "Q4_0")
    with pytest.raises(ModelError, match="7 bytes"):
        decode_f32(bytes(7), "F32")
    assert list(decode_f32(struct.pack("<2f", 1.5, -2.0), gguf.TYPES[F32])) == [1.5, -2.0]
    assert set(ADAPTER_TYPES) >= {"F32", "F16"}


def test_write_adapter_checks_its_arguments():
    with pytest.raises(ValueError, match="lora_b"):
        write_adapter("llama", 8.0, [("blk.0.attn_q.weight", 64, 64, 4, bytes(4 * 4 * 64), bytes(12))])


# -- the refusals -----------------------------------------------------------------------------------------------

def test_refuses_what_is_not_a_gguf_file():
    refused(b"GGML" + bytes(60), r"adapter file: not a GGUF file")
    refused(b"\x89PNG\r\n\x1a\n" + bytes(64), r"not a GGUF file")
    data = written()
    refused(data[:30], r"truncated", file_size=30)


@pytest.mark.parametrize("change, match", [
    (dict(general__type=None), r"general\.type is missing: not a LoRA adapter"),
    (dict(general__type=(gguf.STRING, "model")), r"general\.type = 'model': not a LoRA adapter"),
    (dict(general__type=(gguf.UINT32, 7)), r"general\.type = 7: must be a string"),
    (dict(adapter__type=None), r"adapter\.type is missing"),
    (dict(adapter__type=(gguf.STRING, "control_vector")), r"adapter\.type = 'control_vector': this lab reads LoRA"),
    (dict(adapter__lora__alpha=None), r"adapter\.lora\.alpha is missing"),
    (dict(adapter__lora__alpha=(gguf.FLOAT32, float("nan"))), r"adapter\.lora\.alpha = nan: must be a finite"),
    (dict(adapter__lora__alpha=(gguf.FLOAT32, float("inf"))), r"adapter\.lora\.alpha = inf: must be a finite"),
    (dict(adapter__lora__alpha=(gguf.FLOAT32, 0.0)), r"adapter\.lora\.alpha = 0\.0: must be a finite number > 0"),
    (dict(adapter__lora__alpha=(gguf.FLOAT32, -8.0)), r"adapter\.lora\.alpha = -8\.0: must be a finite number > 0"),
    (dict(adapter__lora__alpha=(gguf.FLOAT64, 8.0)), r"adapter\.lora\.alpha = 8\.0: has value type f64, must be f32"),
    (dict(adapter__lora__alpha=(gguf.UINT32, 8)), r"adapter\.lora\.alpha = 8: has value type u32"),
    (dict(adapter__alora__invocation_tokens=(gguf.ARRAY, [1, 2])),
     r"adapter\.alora\.invocation_tokens = \[1, 2\]: an activated LoRA"),
    (dict(general__architecture=(gguf.STRING, "qwen2")),
     r"general\.architecture = 'qwen2': the adapter is for another architecture than the model's 'llama'"),
    (dict(general__architecture=None), r"general\.architecture is missing"),
])
def test_refuses_keys(change, match):
    refused(gguf_bytes(good_kvs(**change), good_tensors()), match)


def with_pair(*tensors) -> bytes:
    return gguf_bytes(good_kvs(), good_tensors() + list(tensors))


@pytest.mark.parametrize("tensors, match", [
    # a base the model does not have, or one it does not multiply by
    (pair("blk.7.attn_q.weight", 64, 64, 4), r"blk\.7\.attn_q\.weight\.lora_a: the model has no tensor blk\.7"),
    (pair("rope_freqs.weight", 8, 1, 1, a_shape=(8, 1), b_shape=(1, 1)),
     r"rope_freqs\.weight \[8\] is not a matrix the model multiplies by"),
    (pair("token_embd.weight", 64, 100, 4), r"token_embd\.weight \[64, 100\] is not a matrix the model multiplies"),
    # one half of a pair
    (pair("blk.0.attn_k.weight", 64, 32, 4)[:1],
     r"blk\.0\.attn_k\.weight\.lora_a has no blk\.0\.attn_k\.weight\.lora_b"),
    (pair("blk.0.attn_k.weight", 64, 32, 4)[1:],
     r"blk\.0\.attn_k\.weight\.lora_b has no blk\.0\.attn_k\.weight\.lora_a"),
    # shapes against the base [64, 32] and each other
    (pair("blk.0.attn_k.weight", 64, 32, 4, a_shape=(48, 4)),
     r"blk\.0\.attn_k\.weight\.lora_a has shape \[48, 4\], expected \[64, rank\]"),
    (pair("blk.0.attn_k.weight", 64, 32, 4, b_shape=(4, 64)),
     r"blk\.0\.attn_k\.weight\.lora_b has shape \[4, 64\], expected \[rank, 32\]"),
    (pair("blk.0.attn_k.weight", 64, 32, 4, a_shape=(64, 8)), r"differ in rank: 8 against 4"),
    (pair("blk.0.attn_k.weight", 64, 32, 4, a_shape=(4, 64)),          # A written [r, n_in]: llama.cpp's "transposed"
     r"lora_a has shape \[4, 64\], expected \[64, rank\]"),
    (pair("blk.0.attn_k.weight", 64, 32, 33), r"rank 33 is not in 1\.\.32 = min\(n_in, n_out\)"),
    (pair("blk.0.attn_k.weight", 64, 32, 4, a_shape=(64, 4, 1)), r"lora_a has 3 dimensions \[64, 4, 1\], expected 2"),
    # types
    (pair("blk.0.attn_k.weight", 64, 32, 4, type_id=F64),
     r"blk\.0\.attn_k\.weight\.lora_a has type F64; this lab reads adapters in F32, F16, BF16, Q8_0"),
    (pair("blk.0.attn_k.weight", 64, 32, 32, type_id=Q4_0), r"lora_a has type Q4_0"),
    # names
    ([tensor("blk.0.attn_k.weight.lora_c", (64, 4))], r"blk\.0\.attn_k\.weight\.lora_c is neither a \.lora_a"),
    ([tensor("blk.0.attn_k.weight\n.lora_c", (64, 4))], r"tensor 'blk\.0\.attn_k\.weight\\n\.lora_c' is neither"),
    ([tensor("blk.0.attn_q.weight.lora_a", (64, 4))],
     r"duplicate tensor name 'blk\.0\.attn_q\.weight\.lora_a' at offset \d+"),
])
def test_refuses_tensors(tensors, match):
    refused(with_pair(*tensors), match)


def test_refuses_a_conv_kernel_even_where_the_table_has_it():
    table = {**TABLE, "blk.0.shortconv.conv.weight": (3, 64)}
    refused(with_pair(*pair("blk.0.shortconv.conv.weight", 3, 64, 2)), r"shortconv\.conv\.weight \[3, 64\] is not a "
            r"matrix", tensors=table)


def test_refuses_data_past_the_end_of_the_file():
    data = written()
    msg = refused(data[:-4], r"tensor 'blk\.1\.ffn_down\.weight\.lora_b': data \[\d+, \d+\) lies outside the file "
                             rf"of {len(data) - 4} bytes")
    assert str(len(data)) in msg            # the end of the data, the number a reader looks for
    with pytest.raises(ModelError, match=r"prefix of \d+ bytes is longer than the file size"):
        read_adapter(data, len(data) - 1, CFG)


def test_refuses_a_file_without_pairs():
    refused(gguf_bytes(good_kvs(), []), r"adapter file holds no lora_a / lora_b pair \(0 tensors\)")
    refused(gguf_bytes(good_kvs(), [tensor("blk.0.attn_norm.weight", (64,))]),
            r"holds no lora_a / lora_b pair \(1 tensors, all ignored norms\)")


# -- damage -----------------------------------------------------------------------------------------------------

def read_damaged(data: bytes, file_size: int | None = None) -> None:
    """The property: an Adapter whose every pair lies in the file and decodes, or a ModelError; nothing else."""
    size = len(data) if file_size is None else file_size
    try:
        with no_hang():
            ad = read_adapter(data, size, CFG)
    except ModelError as e:
        assert str(e) and "\n" not in str(e)
        return
    for p in ad.pairs:
        assert p.b_offset + p.b_nbytes <= size and p.a_offset + p.a_nbytes <= size
        assert 1 <= p.rank <= min(p.n_in, p.n_out) and TABLE[p.base] == (p.n_in, p.n_out)
        assert len(decode_f32(data[p.a_offset:p.a_offset + p.a_nbytes], p.a_type)) == p.rank * p.n_in
        assert math.isfinite(ad.alpha) and ad.alpha > 0


def test_every_header_byte_changed():
    data = written()
    end = gguf.read(data, len(data)).header_bytes
    for pos in range(end):
        for new in {0, 0xFF, data[pos] ^ 0x80, data[pos] ^ 1}:
            read_damaged(data[:pos] + bytes([new]) + data[pos + 1:])


@fuzz_settings(300)
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.sampled_from(["byte", "u32", "u64"]),
                                st.sampled_from([0, 1, 2, 31, 32, 255, 1 << 31, (1 << 32) - 1, 1 << 63,
                                                 (1 << 64) - 1])), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 1 << 20)))
def test_random_damage(edits, cut):
    data = bytearray(written())
    end = gguf.read(bytes(data), len(data)).header_bytes
    for where, kind, value in edits:
        pos = where % len(data) if where & 1 else where % end        # half the edits inside the header
        if kind == "byte":
            data[pos] = value & 0xFF
        else:
            width = 4 if kind == "u32" else 8
            data[pos:pos + width] = (value % (1 << 8 * width)).to_bytes(width, "little")
    if cut is not None:
        data = data[:cut % (len(data) + 1)]
    read_damaged(bytes(data))
