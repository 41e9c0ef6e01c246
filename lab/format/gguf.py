"""GGUF header reader: metadata and tensor table from a byte prefix of the file, standard library only.

The browser hands Python only the first N bytes of a model file, never the weights, so `read`
parses from a prefix and raises `NeedMoreBytes` (with a prefix length to retry with) when the
header goes on past it. `read_file` does that loop on a local file.

What it does: GGUF versions 2 and 3, little-endian; every metadata value type, nested arrays
included; every check that can be made without the weights (counts and lengths against the file
size, tensor shapes and types against the ggml table in `lab.format.ggml`, alignment, data range,
overlaps). Every problem is a `GGUFError` whose message names the byte offset, key or tensor.

What it doesn't do: read or check tensor data, write GGUF, read big-endian files or GGUF v1, or
interpret the metadata beyond `summary`.

Metadata values: integers, floats and bools are Python scalars, strings are `str`, arrays are
lists (nested arrays nested lists). Keys and tensor names must be valid UTF-8. String *values*
are decoded with errors="surrogateescape": nothing is lost (a tokenizer token with invalid UTF-8
keeps its bytes: `s.encode("utf-8", "surrogateescape")` gives them back), and such strings hold
lone surrogates in U+DC80..U+DCFF.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from lab.format.ggml import SUPPORTED, TYPES, GgmlType, type_name

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                  # GGML_MAX_DIMS

# Sanity caps, so a corrupt count is refused before anything is allocated or looped over, even
# when the file size is unknown. Real models are far below each (vocabularies ~10^5..10^6).
MAX_TENSORS = 1_000_000
MAX_KVS = 1_000_000
MAX_ARRAY = 1 << 24           # elements in one metadata array
MAX_STRING = 1 << 28          # bytes in one string
MAX_NESTING = 8               # arrays of arrays of ...
MAX_HEADER_BYTES = 1 << 30    # a header (metadata + tensor table) longer than this is refused

FIRST_READ = 1 << 20          # read_file's first prefix length

# Metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
VALUE_TYPE_NAMES = {
    UINT8: "u8", INT8: "i8", UINT16: "u16", INT16: "i16", UINT32: "u32", INT32: "i32", FLOAT32: "f32",
    BOOL: "bool", STRING: "string", ARRAY: "array", UINT64: "u64", INT64: "i64", FLOAT64: "f64",
}
_SCALARS = {   # type -> (struct code, size)
    UINT8: ("B", 1), INT8: ("b", 1), UINT16: ("H", 2), INT16: ("h", 2), UINT32: ("I", 4),
    INT32: ("i", 4), FLOAT32: ("f", 4), BOOL: ("B", 1), UINT64: ("Q", 8), INT64: ("q", 8),
    FLOAT64: ("d", 8),
}
_INTEGERS = frozenset((UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64))
# Fewest bytes one element of each type can take: bounds an array's length by the bytes left.
_MIN_SIZE = {**{t: s for t, (_, s) in _SCALARS.items()}, STRING: 8, ARRAY: 12}
_MIN_KV = 8 + 4 + 1                      # empty key, type, one-byte value
_MIN_TENSOR_INFO = 8 + 4 + 8 + 4 + 8     # empty name, n_dims, one dim, type, offset

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class GGUFError(ValueError):
    """Anything wrong with a GGUF file; the message says what and where."""


class NeedMoreBytes(GGUFError):
    """The prefix ended before the header did. Retry with the first `needed` bytes of the file."""

    def __init__(self, message: str, needed: int):
        super().__init__(message)
        self.needed = needed


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]    # GGUF order: ne0 (the contiguous row) first
    type_id: int
    offset: int               # absolute file offset of the data
    nbytes: int

    @property
    def type(self) -> GgmlType:
        return TYPES[self.type_id]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class Header:
    version: int
    metadata: dict[str, object]
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int          # absolute offset where tensor data starts
    header_bytes: int         # bytes of the prefix parsed: end of the tensor table
    file_size: int | None
    # GGUF value type of each key; arrays are ("array", element type).
    metadata_types: dict[str, int | tuple[str, int]] = field(default_factory=dict)


class _Parser:
    def __init__(self, buf: bytes, file_size: int | None):
        self.buf = buf
        self.avail = len(buf)
        self.file_size = file_size
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        """Make sure n bytes from self.pos are in the prefix, else say why they are not."""
        pos, end = self.pos, self.pos + n
        if end <= self.avail:
            return
        if self.file_size is not None and end > self.file_size:
            raise GGUFError(f"file is truncated: {what} at offset {pos} needs {n} bytes, "
                            f"but the file ends at byte {self.file_size}")
        if end > MAX_HEADER_BYTES:
            raise GGUFError(f"{what} at offset {pos} ends at byte {end}, past the {MAX_HEADER_BYTES}-byte "
                            f"cap on a GGUF header: corrupt file")
        needed = max(end, 2 * self.avail)
        if self.file_size is not None:
            needed = min(needed, self.file_size)
        raise NeedMoreBytes(f"prefix of {self.avail} bytes ends inside {what} at offset {pos}; "
                            f"retry with {needed} bytes", needed)

    def check_count(self, count: int, cap: int, min_size: int, what: str, kind: str) -> None:
        """Refuse a count that the cap or the bytes left in the file rule out, before using it."""
        where = f"{kind} {count}{f' of {what}' if what else ''} at offset {self.pos}"
        if count > cap:
            raise GGUFError(f"{where} is absurd (the cap is {cap}): corrupt file")
        if self.file_size is not None:
            left = self.file_size - self.pos
            if count * min_size > left:
                raise GGUFError(f"{where} cannot fit in the {left} bytes left in the file: truncated or corrupt")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def name(self, what: str) -> str:
        """A key or tensor name: strict UTF-8."""
        start = self.pos
        n = self.u64(f"length of {what}")
        self.check_count(n, MAX_STRING, 1, what, "string length")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{what} at offset {start} is not valid UTF-8 ({e.reason} at byte {e.start} "
                            f"of it): {raw[:64]!r}") from None

    def value(self, vtype: int, what: str, depth: int = 0) -> object:
        scalar = _SCALARS.get(vtype)
        if scalar is not None:
            code, size = scalar
            self.need(size, what)
            v = struct.unpack_from("<" + code, self.buf, self.pos)[0]
            self.pos += size
            return bool(v) if vtype == BOOL else v
        if vtype == STRING:
            n = self.u64(f"length of {what}")
            self.check_count(n, MAX_STRING, 1, what, "string length")
            self.need(n, what)
            s = str(self.buf[self.pos:self.pos + n], "utf-8", "surrogateescape")
            self.pos += n
            return s
        if vtype == ARRAY:
            return self.array(what, depth)
        raise GGUFError(f"{what}: unknown metadata value type {vtype} at offset {self.pos - 4}")

    def array(self, what: str, depth: int) -> list:
        """An array's body: element type, count, elements (the value type ARRAY was read already)."""
        if depth >= MAX_NESTING:
            raise GGUFError(f"{what} at offset {self.pos}: arrays nested deeper than {MAX_NESTING} levels")
        etype = self.u32(f"element type of {what}")
        if etype not in _MIN_SIZE:
            raise GGUFError(f"{what}: unknown metadata value type {etype} for array elements "
                            f"at offset {self.pos - 4}")
        count = self.u64(f"length of {what}")
        self.check_count(count, MAX_ARRAY, _MIN_SIZE[etype], what, "array length")
        scalar = _SCALARS.get(etype)
        if scalar is not None:
            code, size = scalar
            self.need(count * size, what)
            vals = list(struct.unpack_from(f"<{count}{code}", self.buf, self.pos))
            self.pos += count * size
            return [bool(v) for v in vals] if etype == BOOL else vals
        if etype == STRING:
            return self.strings(count, what)
        return [self.array(f"{what}[{i}]", depth + 1) for i in range(count)]

    def strings(self, count: int, what: str) -> list[str]:
        # The hot loop (vocabularies, merges): inlined reads, bounds checked against the prefix
        # first and only on failure handed to need() for the error.
        buf, avail, unpack, pos = self.buf, self.avail, _U64.unpack_from, self.pos
        out = []
        append = out.append
        for i in range(count):
            if pos + 8 > avail:
                self.pos = pos
                self.need(8, f"length of {what}[{i}]")
            n = unpack(buf, pos)[0]
            pos += 8
            if pos + n > avail:
                self.pos = pos
                self.check_count(n, MAX_STRING, 1, f"{what}[{i}]", "string length")
                self.need(n, f"{what}[{i}]")
            append(str(buf[pos:pos + n], "utf-8", "surrogateescape"))
            pos += n
        self.pos = pos
        return out


def read(prefix: bytes | bytearray | memoryview, file_size: int | None = None) -> Header:
    """Parse the header from the first bytes of a GGUF file.

    file_size: the whole file's size. With it, a prefix that ends inside the header raises
    NeedMoreBytes only if the file has those bytes (else GGUFError: truncated), and tensor data
    is checked to lie inside the file. Without it, running out of prefix is always NeedMoreBytes
    and the data-range checks are skipped.
    """
    buf = prefix if isinstance(prefix, bytes) else bytes(prefix)
    if file_size is not None and file_size < len(buf):
        raise GGUFError(f"prefix of {len(buf)} bytes is longer than the file size {file_size}")
    p = _Parser(buf, file_size)
    # The file in order: magic and version, the two counts, the metadata, the tensor table, then (aligned) the data.
    version = _version(p)
    tensor_count, kv_count = _counts(p)
    metadata, types = _metadata(p, kv_count)
    alignment = _alignment(metadata, types)
    table = _tensor_table(p, tensor_count)
    header_bytes = p.pos
    data_offset = -(-header_bytes // alignment) * alignment
    tensors = _place(table, data_offset, alignment, file_size)
    _check_overlaps(tensors)
    return Header(version, metadata, tensors, alignment, data_offset, header_bytes, file_size, types)


def _version(p: _Parser) -> int:
    """The magic (offset 0) and the version (offset 4), with a message for each kind of file this reader refuses."""
    buf = p.buf
    head = buf[:4]
    if head != MAGIC[:len(head)]:
        raise GGUFError(f"not a GGUF file: the first bytes are {buf[:8]!r}, expected b'GGUF'")
    p.need(4, "magic")
    p.pos = 4
    version = p.u32("version")
    if version not in VERSIONS:
        if int.from_bytes(buf[4:8], "big") in VERSIONS + (1,):
            raise GGUFError(f"big-endian GGUF file (version field {version:#010x} at offset 4): "
                            f"only little-endian files are supported")
        if version == 1:
            raise GGUFError("GGUF version 1 is not supported (only versions 2 and 3): version 1 used "
                            "32-bit counts and lengths; re-convert the model with a current llama.cpp")
        raise GGUFError(f"unsupported GGUF version {version} at offset 4 (only versions 2 and 3)")
    return version


def _counts(p: _Parser) -> tuple[int, int]:
    """The tensor count (offset 8) and the kv count (offset 16), each against its cap and both against the file."""
    tensor_count = p.u64("tensor count")
    kv_count = p.u64("kv count")
    p.pos = 8
    p.check_count(tensor_count, MAX_TENSORS, _MIN_TENSOR_INFO, "", "tensor count")
    p.pos = 16
    p.check_count(kv_count, MAX_KVS, _MIN_KV, "", "kv count")
    p.pos = 24
    if p.file_size is not None and tensor_count * _MIN_TENSOR_INFO + kv_count * _MIN_KV > p.file_size - 24:
        raise GGUFError(f"tensor count {tensor_count} and kv count {kv_count} together cannot fit in a "
                        f"file of {p.file_size} bytes: truncated or corrupt")
    return tensor_count, kv_count


def _metadata(p: _Parser, kv_count: int) -> tuple[dict[str, object], dict[str, int | tuple[str, int]]]:
    """The key-value pairs: each key's value, and its value type (Header.metadata_types)."""
    metadata: dict[str, object] = {}
    types: dict[str, int | tuple[str, int]] = {}
    for i in range(kv_count):
        start = p.pos
        key = p.name(f"key #{i}")
        if key in metadata:
            raise GGUFError(f"duplicate key {key!r} at offset {start}")
        vtype = p.u32(f"value type of key {key!r}")
        if vtype == ARRAY:
            # Peek the element type for metadata_types; array() reads and checks it again.
            p.need(4, f"element type of key {key!r}")
            types[key] = ("array", _U32.unpack_from(p.buf, p.pos)[0])
        else:
            types[key] = vtype
        metadata[key] = p.value(vtype, f"key {key!r}")
    return metadata, types


def _alignment(metadata: dict[str, object], types: dict[str, int | tuple[str, int]]) -> int:
    """general.alignment, an integer power of two, or DEFAULT_ALIGNMENT where the file has none."""
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    alignment = metadata["general.alignment"]
    if types["general.alignment"] not in _INTEGERS:
        raise GGUFError(f"general.alignment has value type "
                        f"{VALUE_TYPE_NAMES.get(types['general.alignment'], types['general.alignment'])}"
                        f", expected an unsigned integer")
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"general.alignment {alignment} is not a power of two")
    return alignment


def _tensor_table(p: _Parser, count: int) -> list[tuple[str, tuple[int, ...], GgmlType, int, int]]:
    """The tensor infos in file order, as (name, shape, type, data offset relative to the data section, bytes)."""
    first_at: dict[str, int] = {}   # name -> offset of its info, for a duplicate's message
    return [_tensor_info(p, i, first_at) for i in range(count)]


def _tensor_info(p: _Parser, i: int, first_at: dict[str, int]) -> tuple[str, tuple[int, ...], GgmlType, int, int]:
    """Tensor info #i: name, n_dims, the dimensions, the ggml type and the data offset; shape checked against the
    type's block and the bytes it makes against 64-bit offsets."""
    start = p.pos
    name = p.name(f"name of tensor #{i}")
    if name in first_at:
        raise GGUFError(f"duplicate tensor name {name!r} at offset {start} (first at offset {first_at[name]})")
    first_at[name] = start
    n_dims = p.u32(f"n_dims of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFError(f"tensor {name!r} at offset {start}: n_dims {n_dims} is not in 1..{MAX_DIMS}")
    shape = tuple(p.u64(f"dimension {j} of tensor {name!r}") for j in range(n_dims))
    for j, d in enumerate(shape):
        if d == 0 or d >= 1 << 63:
            shown = d if d < 1 << 63 else d - (1 << 64)
            raise GGUFError(f"tensor {name!r} at offset {start}: dimension {j} is {shown}, "
                            f"not a positive size")
    type_id = p.u32(f"ggml type of tensor {name!r}")
    t = TYPES.get(type_id)
    if t is None:
        raise GGUFError(f"tensor {name!r} at offset {start}: unknown ggml type id {type_id}")
    rel = p.u64(f"data offset of tensor {name!r}")
    if shape[0] % t.block:
        raise GGUFError(f"tensor {name!r}: a row of {shape[0]} elements is not a whole number of "
                        f"{t.block}-element {t.name} blocks")
    nbytes = t.row_bytes(shape[0])
    for d in shape[1:]:
        nbytes *= d
    if nbytes >= 1 << 63:
        raise GGUFError(f"tensor {name!r} at offset {start}: shape {shape} makes {nbytes} bytes, "
                        f"more than 64-bit offsets can address")
    return name, shape, t, rel, nbytes


def _place(table: list[tuple[str, tuple[int, ...], GgmlType, int, int]], data_offset: int, alignment: int,
           file_size: int | None) -> list[TensorInfo]:
    """The tensors at their absolute offsets, each aligned and (with file_size) inside the file."""
    tensors = []
    for name, shape, t, rel, nbytes in table:
        if rel % alignment:
            raise GGUFError(f"tensor {name!r}: data offset {rel} is not aligned to {alignment} bytes "
                            f"(general.alignment)")
        offset = data_offset + rel
        if file_size is not None and offset + nbytes > file_size:
            raise GGUFError(f"tensor {name!r}: data [{offset}, {offset + nbytes}) lies outside the file "
                            f"of {file_size} bytes: truncated or corrupt")
        tensors.append(TensorInfo(name, shape, t.id, offset, nbytes))
    return tensors


def _check_overlaps(tensors: list[TensorInfo]) -> None:
    """No two tensors' data share a byte."""
    by_offset = sorted(tensors, key=lambda x: x.offset)
    for a, b in zip(by_offset, by_offset[1:]):
        if b.offset < a.offset + a.nbytes:
            raise GGUFError(f"tensors {a.name!r} [{a.offset}, {a.offset + a.nbytes}) and {b.name!r} "
                            f"[{b.offset}, {b.offset + b.nbytes}) overlap")


def read_file(path: str | os.PathLike) -> Header:
    """Read a local file's header, reading a prefix that grows until the header fits."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = min(FIRST_READ, size)
        data = f.read(n)
        while True:
            if len(data) != n:
                raise GGUFError(f"{path}: read {len(data)} bytes of {n}: the file changed while being read")
            try:
                return read(data, size)
            except NeedMoreBytes as e:
                # At least double, whatever the estimate: the number of tries stays logarithmic.
                # read() raises this only while the prefix is shorter than the file, so n grows.
                n = max(e.needed, min(size, 2 * len(data)))
                data += f.read(n - len(data))


def summary(h: Header) -> dict:
    """The model at a glance, for the page. A key the file lacks, or holds with an unexpected type,
    gives None (strings are cut to 200 characters): the page shows this before lab.format.checks runs."""
    md = h.metadata

    def text(key: str) -> str | None:
        v = md.get(key)
        return v[:200] if isinstance(v, str) else None

    arch = text("general.architecture")

    def arch_key(k: str) -> int | None:
        v = md.get(f"{arch}.{k}") if arch is not None else None
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    tokens = md.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else arch_key("vocab_size")

    type_bytes: dict[str, int] = {}
    type_counts: dict[str, int] = {}
    for t in h.tensors:
        n = type_name(t.type_id)
        type_bytes[n] = type_bytes.get(n, 0) + t.nbytes
        type_counts[n] = type_counts.get(n, 0) + 1

    return {
        "architecture": arch,
        "name": text("general.name"),
        "layers": arch_key("block_count"),
        "embedding_size": arch_key("embedding_length"),
        "heads": arch_key("attention.head_count"),
        "kv_heads": arch_key("attention.head_count_kv"),
        "vocab_size": vocab,
        "tokenizer_model": text("tokenizer.ggml.model"),
        "tokenizer_pre": text("tokenizer.ggml.pre"),
        "context_length": arch_key("context_length"),
        "tensor_count": len(h.tensors),
        "params": sum(t.n_elements for t in h.tensors),
        "type_bytes": type_bytes,
        "type_counts": type_counts,
        "unsupported_types": sorted(n for n, t in
                                    {type_name(t.type_id): t.type_id for t in h.tensors}.items()
                                    if t not in SUPPORTED),
        "tensor_bytes": sum(type_bytes.values()),
        "version": h.version,
        "file_size": h.file_size,
        "header_bytes": h.header_bytes,
        "data_offset": h.data_offset,
    }
