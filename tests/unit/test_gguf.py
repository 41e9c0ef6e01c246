"""lab.format.gguf against the gguf package (reader and writer), on the real models and on files built here.

Corrupt files are built byte by byte with the small builder below (independent of lab.format.gguf), so each
check is hit on purpose and its message asserted.
"""

from __future__ import annotations

import functools
import random
import struct
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf import GGUFValueType as V

from lab.format import gguf
from lab.format.gguf import GGUFError, NeedMoreBytes

# ---------------------------------------------------------------- helpers

def u32(x: int) -> bytes:
    return struct.pack("<I", x)


def u64(x: int) -> bytes:
    return struct.pack("<Q", x)


def s(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return u64(len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + u32(vtype) + payload


def ti(name: str | bytes, dims, type_id: int, offset: int) -> bytes:
    return s(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(type_id) + u64(offset)


def build(kvs=(), tis=(), data=b"", version=3, n_tensors=None, n_kv=None, align=32) -> bytes:
    head = (b"GGUF" + u32(version) + u64(len(tis) if n_tensors is None else n_tensors)
            + u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(tis))
    return head + bytes(-len(head) % align) + data


def f32_tensor(name="w", ne0=8, offset=0):
    return ti(name, [ne0], 0, offset)


def error(data: bytes, file_size: int | None = -1) -> str:
    """The message of the (plain) GGUFError that reading `data` raises."""
    with pytest.raises(GGUFError) as e:
        gguf.read(data, len(data) if file_size == -1 else file_size)
    assert type(e.value) is GGUFError, e.value
    return str(e.value)


def reader_value(field):
    if field.types[0] == V.ARRAY and len(field.types) == 1:   # empty array: no element type recorded
        return []
    return field.contents()


def reader_type(field):
    if field.types[0] == V.ARRAY:
        return ("array", int(field.types[1]))
    return int(field.types[0])


def same_types(a, b) -> bool:
    """Equal values of different types (True == 1 == 1.0) are told apart, in lists too."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_types(x, y) for x, y in zip(a, b))
    return type(a) is type(b)


def compare_with_reader(h: gguf.Header, r: GGUFReader) -> None:
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(h.metadata) == list(fields)
    for k, f in fields.items():
        assert h.metadata_types[k] == reader_type(f), k
        assert h.metadata[k] == reader_value(f), k
        assert same_types(h.metadata[k], reader_value(f)), k
    assert h.data_offset == r.data_offset
    assert len(h.tensors) == len(r.tensors)
    for t, rt in zip(h.tensors, r.tensors):
        assert t.name == rt.name
        assert t.shape == tuple(int(d) for d in rt.shape)
        assert t.type_id == int(rt.tensor_type)
        assert t.type.name == rt.tensor_type.name
        assert t.offset == rt.data_offset
        assert t.nbytes == rt.n_bytes
        assert t.n_elements == rt.n_elements


# ---------------------------------------------------------------- real models

@functools.cache
def gguf_reader(path) -> GGUFReader:
    return GGUFReader(path)


# gguf-py's reader takes 9-13 s over Qwen2.5's and Gemma 3's 150-260k-token vocabularies: those two with --slow; SmolLM2
# (the same reader paths: every field kind, arrays of strings, floats and ints) by default
@pytest.fixture(params=["smollm2_path", pytest.param("qwen_path", marks=pytest.mark.slow),
                        pytest.param("gemma_path", marks=pytest.mark.slow)])
def real(request):
    path = request.getfixturevalue(request.param)
    return path, gguf_reader(path)


def test_real_models_match_gguf_reader(real):
    path, r = real
    h = gguf.read_file(path)
    compare_with_reader(h, r)
    assert h.version == 3
    assert h.file_size == path.stat().st_size
    assert h.header_bytes <= h.data_offset < h.header_bytes + h.alignment
    assert h.metadata["tokenizer.ggml.tokens"] == r.fields["tokenizer.ggml.tokens"].contents()
    assert len(h.metadata["tokenizer.ggml.token_type"]) == len(h.metadata["tokenizer.ggml.tokens"])


def test_read_file_reads_only_a_prefix(real, monkeypatch):
    path, _ = real
    lengths = []
    original = gguf.read

    def counting(prefix, file_size=None):
        lengths.append(len(prefix))
        return original(prefix, file_size)

    monkeypatch.setattr(gguf, "read", counting)
    h = gguf.read_file(path)
    size = path.stat().st_size
    print(f"{path.name}: header {h.header_bytes} bytes, read_file read {lengths[-1]} bytes "
          f"in {len(lengths)} tries, file {size} bytes")
    assert lengths[0] == gguf.FIRST_READ
    assert lengths == sorted(lengths) and len(lengths) <= 5
    assert h.header_bytes <= lengths[-1] <= 2 * h.header_bytes + gguf.FIRST_READ
    assert lengths[-1] < size / 10


def test_smollm2_summary(smollm2_path):
    h = gguf.read_file(smollm2_path)
    r = gguf_reader(smollm2_path)
    field = lambda k: r.fields[k].contents()
    sm = gguf.summary(h)
    arch = field("general.architecture")
    expected = {
        "architecture": arch,
        "name": field("general.name"),
        "layers": field(f"{arch}.block_count"),
        "embedding_size": field(f"{arch}.embedding_length"),
        "heads": field(f"{arch}.attention.head_count"),
        "kv_heads": field(f"{arch}.attention.head_count_kv"),
        "vocab_size": len(field("tokenizer.ggml.tokens")),
        "tokenizer_model": field("tokenizer.ggml.model"),
        "tokenizer_pre": field("tokenizer.ggml.pre"),
        "context_length": field(f"{arch}.context_length"),
        "tensor_count": len(r.tensors),
    }
    assert {k: sm[k] for k in expected} == expected
    # The numbers the page shows for this model, as GGUFReader reads them.
    assert (sm["architecture"], sm["layers"], sm["embedding_size"], sm["heads"], sm["kv_heads"],
            sm["vocab_size"], sm["tokenizer_model"], sm["tokenizer_pre"], sm["context_length"],
            sm["tensor_count"]) == ("llama", 30, 576, 9, 3, 49152, "gpt2", "smollm", 8192, 272)
    assert sum(sm["type_bytes"].values()) == sm["tensor_bytes"] == sum(int(t.n_bytes) for t in r.tensors)
    assert sum(sm["type_counts"].values()) == 272
    by_type: dict[str, int] = {}
    for t in r.tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    assert sm["type_bytes"] == by_type
    assert sm["params"] == sum(int(t.n_elements) for t in r.tensors)
    assert sm["unsupported_types"] == []
    assert sm["file_size"] == smollm2_path.stat().st_size
    assert sm["header_bytes"] == h.header_bytes


def test_real_prefix_truncation_sample(smollm2_path):
    full_size = smollm2_path.stat().st_size
    h = gguf.read_file(smollm2_path)
    with open(smollm2_path, "rb") as f:
        head = f.read(h.data_offset)
    rng = random.Random(7)
    cuts = sorted({0, 3, 4, 23, 24, h.header_bytes - 1} | {rng.randrange(h.header_bytes) for _ in range(30)})
    for cut in cuts:
        prefix = head[:cut]
        t0 = time.perf_counter()
        with pytest.raises(NeedMoreBytes) as e:
            gguf.read(prefix, full_size)
        assert cut < e.value.needed <= full_size
        assert "truncated" in error(prefix)
        with pytest.raises(NeedMoreBytes):
            gguf.read(memoryview(prefix))
        assert time.perf_counter() - t0 < 5, cut
    assert gguf.read(memoryview(head), full_size).tensors == h.tensors


# ---------------------------------------------------------------- written with GGUFWriter

SCALARS = [
    ("t.u8", V.UINT8, 255), ("t.i8", V.INT8, -128), ("t.u16", V.UINT16, 65535), ("t.i16", V.INT16, -32768),
    ("t.u32", V.UINT32, 2**32 - 1), ("t.i32", V.INT32, -2**31), ("t.f32", V.FLOAT32, -1.25),
    ("t.u64", V.UINT64, 2**64 - 1), ("t.i64", V.INT64, -2**63), ("t.f64", V.FLOAT64, 0.1),
    ("t.bool_t", V.BOOL, True), ("t.bool_f", V.BOOL, False),
    ("t.str", V.STRING, "héllo ✓ 日本語 🦙"), ("t.ascii", V.STRING, "plain"),
]
ARRAYS = [
    ("a.u8", V.UINT8, [0, 1, 255]), ("a.i8", V.INT8, [-128, 0, 127]), ("a.u16", V.UINT16, [65535, 7]),
    ("a.i16", V.INT16, [-32768, 32767]), ("a.u32", V.UINT32, [2**32 - 1, 0]), ("a.i32", V.INT32, [-2**31, 5]),
    ("a.f32", V.FLOAT32, [0.5, -2.0, 3.75]), ("a.u64", V.UINT64, [2**64 - 1]), ("a.i64", V.INT64, [-2**63, 1]),
    ("a.f64", V.FLOAT64, [0.1, 1e300]), ("a.bool", V.BOOL, [True, False, True]),
    ("a.str", V.STRING, ["a", "", "ü", "🦙 llama", "Ġthe"]),
    ("a.nested", V.ARRAY, [[1, 2, 3], [4], [5, 6]]),
    ("a.nested_str", V.ARRAY, [["x", "y"], ["ç"]]),
]
TENSORS = [   # name, GGUF type, numpy array written, GGUF shape (ne0 first)
    ("f32", Q.F32, np.arange(64, dtype=np.float32).reshape(2, 32), (32, 2)),
    ("f16", Q.F16, np.arange(48, dtype=np.float16).reshape(3, 16), (16, 3)),
    ("q8_0", Q.Q8_0, np.arange(4 * 68, dtype=np.uint8).reshape(4, 68), (64, 4)),
    ("q4_k", Q.Q4_K, (np.arange(2 * 144) % 251).astype(np.uint8).reshape(2, 144), (256, 2)),
]


def write_test_file(path) -> bytes:
    w = GGUFWriter(path, "testarch")
    for key, vtype, val in SCALARS:
        w.add_key_value(key, val, vtype)
    for key, etype, val in ARRAYS:
        w.add_key_value(key, val, V.ARRAY, sub_type=etype)
    for name, qtype, arr, _ in TENSORS:
        w.add_tensor(name, arr, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "all_types.gguf"
    return path, write_test_file(path)


def check_written(h: gguf.Header, data: bytes) -> None:
    assert h.metadata["general.architecture"] == "testarch"
    for key, vtype, val in SCALARS:
        assert h.metadata[key] == val and type(h.metadata[key]) is type(val), key
        assert h.metadata_types[key] == vtype
    for key, etype, val in ARRAYS:
        assert h.metadata[key] == val and same_types(h.metadata[key], val), key
        assert h.metadata_types[key] == ("array", etype)
    assert [t.name for t in h.tensors] == [n for n, *_ in TENSORS]
    for t, (name, qtype, arr, shape) in zip(h.tensors, TENSORS):
        assert t.shape == shape and t.type_id == qtype and t.nbytes == arr.nbytes, name
        assert t.offset % h.alignment == 0
        assert data[t.offset:t.offset + t.nbytes] == arr.tobytes(), name


def test_writer_roundtrip_v3(written):
    path, data = written
    h = gguf.read(data, len(data))
    assert h.version == 3 and h.alignment == 32 and h.file_size == len(data)
    check_written(h, data)
    assert gguf.read_file(path) == h
    # GGUFReader agrees too (it flattens nested arrays, so those are compared above only).
    r = GGUFReader(path)
    assert h.data_offset == r.data_offset
    for t, rt in zip(h.tensors, r.tensors):
        assert (t.offset, t.nbytes) == (rt.data_offset, rt.n_bytes)


def test_writer_roundtrip_v2(written):
    _, data = written
    v2 = data[:4] + u32(2) + data[8:]     # v2 and v3 share the little-endian layout
    h = gguf.read(v2, len(v2))
    assert h.version == 2
    check_written(h, v2)


def test_empty_arrays_and_values():
    data = build(kvs=[
        kv("e.u8", 9, u32(0) + u64(0)),
        kv("e.str", 9, u32(8) + u64(0)),
        kv("e.nested", 9, u32(9) + u64(2) + u32(5) + u64(0) + u32(8) + u64(1) + s("z")),
        kv("e.empty_str", 8, s("")),
        kv("e.bad_utf8", 8, s(b"\xff\xfeok")),
    ])
    h = gguf.read(data, len(data))
    assert h.metadata == {"e.u8": [], "e.str": [], "e.nested": [[], ["z"]], "e.empty_str": "",
                          "e.bad_utf8": h.metadata["e.bad_utf8"]}
    assert h.metadata_types["e.nested"] == ("array", 9)
    # Values keep invalid UTF-8 losslessly.
    assert h.metadata["e.bad_utf8"].encode("utf-8", "surrogateescape") == b"\xff\xfeok"
    assert h.tensors == [] and h.header_bytes <= h.data_offset == len(data)


def test_alignment_key():
    data = build(kvs=[kv("general.alignment", 4, u32(64))], tis=[f32_tensor("a"), f32_tensor("b", offset=64)],
                 align=64, data=bytes(128))
    h = gguf.read(data, len(data))
    assert h.alignment == 64 and h.data_offset % 64 == 0
    assert [t.offset - h.data_offset for t in h.tensors] == [0, 64]


# ---------------------------------------------------------------- truncation

def test_truncation_at_every_header_offset(written):
    _, full = written
    h = gguf.read(full, len(full))
    t0 = time.perf_counter()
    for cut in range(h.header_bytes):
        prefix = full[:cut]
        with pytest.raises(NeedMoreBytes) as e:
            gguf.read(prefix, len(full))
        assert cut < e.value.needed <= len(full), cut
        with pytest.raises(NeedMoreBytes):
            gguf.read(prefix)
        msg = error(prefix)   # the file itself ends here
        assert "truncated" in msg, (cut, msg)
    # Past the header the metadata is complete; only the tensor data is missing.
    for cut in range(h.header_bytes, len(full)):
        assert gguf.read(full[:cut], len(full)).tensors == h.tensors
        assert "outside the file" in error(full[:cut])
    assert time.perf_counter() - t0 < 60


def test_need_more_bytes_converges(written):
    _, full = written
    prefix_len, tries = 1, 0
    while True:
        tries += 1
        try:
            h = gguf.read(full[:prefix_len], len(full))
            break
        except NeedMoreBytes as e:
            assert e.needed > prefix_len
            prefix_len = e.needed
    assert h == gguf.read(full, len(full)) and tries < 16


def test_read_file_truncated(written, tmp_path):
    _, full = written
    h = gguf.read(full, len(full))
    for cut in (0, 2, 10, 30, h.header_bytes // 2, h.header_bytes, len(full) - 1):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(full[:cut])
        with pytest.raises(GGUFError) as e:
            gguf.read_file(p)
        assert type(e.value) is GGUFError and "truncated" in str(e.value), cut


def test_prefix_longer_than_file():
    data = build()
    assert "longer than the file size" in error(data, len(data) - 1)


def test_random_corruption_raises_only_gguf_error(written):
    _, full = written
    h = gguf.read(full, len(full))
    rng = random.Random(1234)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(1500):
        data = bytearray(full)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(h.header_bytes)
            kind = rng.random()
            if kind < 0.5:
                data[pos] = rng.randrange(256)
            else:   # an absurd or plausible 64-bit value where a length or count may sit
                val = rng.choice([2**64 - 1, 2**63, 2**32, rng.randrange(1 << 20), 0])
                data[pos:pos + 8] = u64(val)[:len(data) - pos]
        for size in (len(data), None):
            try:
                gguf.read(bytes(data), size)
                outcomes["ok"] += 1
            except GGUFError:
                outcomes["error"] += 1
    assert outcomes["error"] > 100


# ---------------------------------------------------------------- corrupt files, one fault each

def test_valid_baseline_parses():
    data = build(kvs=[kv("k", 4, u32(1))], tis=[f32_tensor("a"), f32_tensor("b", offset=32)], data=bytes(64))
    h = gguf.read(data, len(data))
    assert [t.name for t in h.tensors] == ["a", "b"] and h.metadata == {"k": 1}


def test_bad_magic():
    msg = error(b"PK\x03\x04" + bytes(100))
    assert "not a GGUF file" in msg and "PK" in msg
    assert "not a GGUF file" in error(b"GGUX", file_size=1000)
    # Two bytes are enough to know.
    assert "not a GGUF file" in error(b"\x7fE", file_size=None)


@pytest.mark.parametrize("version,word", [(1, "version 1"), (99, "version 99"), (0, "version 0")])
def test_bad_version(version, word):
    msg = error(build(version=version))
    assert word in msg and "2 and 3" in msg


def test_big_endian_refused():
    data = b"GGUF" + struct.pack(">I", 3) + bytes(16)
    assert "big-endian" in error(data)


@pytest.mark.parametrize("count", [2**63, 2**64 - 1, 10**7])
def test_absurd_tensor_count(count):
    assert "tensor count" in error(build(n_tensors=count))
    assert "tensor count" in error(build(n_tensors=count), file_size=None)


def test_tensor_count_beyond_file():
    assert "tensor count 1000" in error(build(n_tensors=1000))


@pytest.mark.parametrize("count", [2**63, 10**7])
def test_absurd_kv_count(count):
    assert "kv count" in error(build(n_kv=count))
    assert "kv count" in error(build(n_kv=count), file_size=None)


@pytest.mark.parametrize("etype", [0, 8, 9, 12])
def test_absurd_array_length(etype):
    data = build(kvs=[kv("arr", 9, u32(etype) + u64(2**62))])
    msg = error(data)
    assert "array length" in msg and "'arr'" in msg
    assert "array length" in error(data, file_size=None)
    # Fits the cap but not the file.
    assert "array length" in error(build(kvs=[kv("arr", 9, u32(etype) + u64(10_000))]))


def test_absurd_string_length():
    msg = error(build(kvs=[kv("name", 8, u64(2**60))]))
    assert "string length" in msg and "'name'" in msg
    assert "string length" in error(build(kvs=[kv("name", 8, u64(2**60))]), file_size=None)
    assert "string length" in error(build(kvs=[kv("name", 9, u32(8) + u64(1) + u64(2**40))]))
    key_msg = error(b"GGUF" + u32(3) + u64(0) + u64(1) + u64(2**50) + bytes(16))
    assert "string length" in key_msg and "key #0" in key_msg
    name_msg = error(build(tis=[u64(2**50)], data=bytes(64)))
    assert "string length" in name_msg and "tensor #0" in name_msg


def test_unknown_value_type():
    msg = error(build(kvs=[kv("weird", 13, u32(0))]))
    assert "value type 13" in msg and "'weird'" in msg
    assert "value type 77" in error(build(kvs=[kv("weird", 9, u32(77) + u64(1))]))


def test_nested_too_deep():
    payload = (u32(9) + u64(1)) * 20 + u32(4) + u64(0)
    assert "nested deeper" in error(build(kvs=[kv("deep", 9, payload)]))


def test_duplicate_key():
    assert "duplicate key 'k'" in error(build(kvs=[kv("k", 4, u32(1)), kv("k", 4, u32(2))]))


def test_invalid_utf8_key_and_tensor_name():
    assert "UTF-8" in error(build(kvs=[kv(b"k\xff", 4, u32(1))]))
    msg = error(build(tis=[ti(b"w\xc3", [8], 0, 0)], data=bytes(32)))
    assert "UTF-8" in msg and "tensor #0" in msg


def test_out_of_range_tensor_offset():
    data = build(tis=[f32_tensor("far", offset=1 << 20)], data=bytes(32))
    msg = error(data)
    assert "outside the file" in msg and "'far'" in msg
    # Without the file size the offset cannot be checked; the header itself is fine.
    assert gguf.read(data).tensors[0].offset == len(data) - 32 + (1 << 20)


def test_tensor_size_past_end():
    data = build(tis=[f32_tensor("big", ne0=1000)], data=bytes(32))
    assert "outside the file" in error(data)


def test_overlapping_tensors():
    data = build(tis=[ti("first", [16], 0, 0), ti("second", [8], 0, 32)], data=bytes(96))
    msg = error(data)
    assert "overlap" in msg and "'first'" in msg and "'second'" in msg


def test_unknown_ggml_type():
    msg = error(build(tis=[ti("odd", [32], 99, 0)], data=bytes(128)))
    assert "ggml type id 99" in msg and "'odd'" in msg


def test_row_not_whole_blocks():
    msg = error(build(tis=[ti("q", [33, 2], 8, 0)], data=bytes(256)))
    assert "block" in msg and "'q'" in msg and "Q8_0" in msg


@pytest.mark.parametrize("dims,word", [([8] * 5, "n_dims 5"), ([], "n_dims 0"), ([8, 0], "dimension 1 is 0"),
                                       ([2**64 - 1], "dimension 0 is -1")])
def test_bad_dims(dims, word):
    assert word in error(build(tis=[ti("t", dims, 0, 0)], data=bytes(64)))


def test_misaligned_tensor_offset():
    msg = error(build(tis=[f32_tensor("a"), f32_tensor("b", offset=40)], data=bytes(128)))
    assert "not aligned" in msg and "'b'" in msg


@pytest.mark.parametrize("align", [0, 3, 48])
def test_alignment_not_power_of_two(align):
    assert "power of two" in error(build(kvs=[kv("general.alignment", 4, u32(align))]))


def test_alignment_wrong_type():
    assert "general.alignment" in error(build(kvs=[kv("general.alignment", 8, s("32"))]))


def test_duplicate_tensor_name():
    data = build(tis=[f32_tensor("a"), f32_tensor("a", offset=32)], data=bytes(64))
    assert "duplicate tensor name 'a'" in error(data)


def test_summary_never_crashes_on_missing_or_odd_keys():
    sm = gguf.summary(gguf.read(build()))
    assert sm["architecture"] is None and sm["layers"] is None and sm["vocab_size"] is None
    assert sm["tensor_count"] == 0 and sm["type_bytes"] == {} and sm["tensor_bytes"] == 0
    odd = build(kvs=[kv("general.architecture", 4, u32(5)), kv("tokenizer.ggml.tokens", 8, s("x"))])
    sm = gguf.summary(gguf.read(odd))
    assert sm["architecture"] is None and sm["layers"] is None and sm["vocab_size"] is None   # 5: not a string
    arch = build(kvs=[kv("general.architecture", 8, s("foo")), kv("foo.vocab_size", 4, u32(77))])
    assert gguf.summary(gguf.read(arch))["vocab_size"] == 77
    # The tokenizer's own list wins over the declared size.
    both = build(kvs=[kv("general.architecture", 8, s("foo")), kv("foo.vocab_size", 4, u32(77)),
                      kv("tokenizer.ggml.tokens", 9, u32(8) + u64(3) + s("a") + s("b") + s("c"))])
    assert gguf.summary(gguf.read(both))["vocab_size"] == 3
