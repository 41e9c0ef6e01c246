"""LoRA adapters in llama.cpp's GGUF format: one read and checked against the model it is for (`read_adapter`), its
rows decoded (`decode_f32`), one written (`write_adapter`). Standard library only.

The format, as llama.cpp reads it (src/llama-adapter.cpp, llama_adapter_lora_init_impl, and src/llama-graph.cpp,
build_lora_mm, vendored in llama-cpp-python 0.3.36) and its converter writes it (convert_lora_to_gguf.py):

* keys: general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (f32), general.architecture = the base
  model's architecture (general.name is for people);
* tensors: for a base matrix W of ggml shape [n_in, n_out] (`blk.0.attn_q.weight`), `<name>.lora_a` of ggml shape
  [n_in, r] and `<name>.lora_b` of ggml shape [r, n_out]. In memory (ne0 contiguous) A is row-major [r, n_in] and B
  row-major [n_out, r]: each is an ordinary weight in the base model's own layout, A with r outputs, B with r inputs;
* the graph: y = W x + s * B (A x), s = alpha / r with r = B's ne0, per pair (a file may mix ranks), i.e.
  W' = W + s B A. llama.cpp multiplies by A and B as they are stored; it never merges them.

What llama.cpp accepts and this reader refuses (each a ModelError whose one-line message names the key or tensor and
the number): alpha absent or 0 (llama.cpp then scales by 1, not alpha / r: a file from its converter always has
alpha), negative or not finite; a rank above min(n_in, n_out); a type other than `ADAPTER_TYPES` (llama.cpp takes any
type its matmul takes); a pair on a tensor the engine does not multiply by (the token embeddings, which llama.cpp
adapts through its own flipped layout, gemma4's per-layer embeddings, the short-conv kernels, which llama.cpp would
load and never apply); an activated LoRA (adapter.alora.invocation_tokens: llama.cpp applies it only after those
tokens, which this lab does not run). Refused as llama.cpp refuses them: general.type not "adapter" (llama.cpp aborts
on a non-string), adapter.type not "lora", alpha not an f32 (llama.cpp aborts), an architecture other than the
model's, a tensor name with another suffix, a lora_a without its lora_b or the reverse, a base tensor the model does
not have, shapes that do not fit the base ([n_in, r] and [r, n_out]) or each other (A's r against B's), data outside
the file, anything lab.format.gguf refuses (duplicate names among it). Ignored as llama.cpp ignores them: tensors
whose names end in "_norm.weight" (`Adapter.ignored`). A file with no pair is refused.

What it does not know: how the engine applies a pair (it streams A and B from `LoraPair`'s offsets; they are weights
of the base model's layout) or where the bytes come from (`read_adapter` takes a prefix, like lab.format.gguf.read).
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from dataclasses import dataclass

from lab.format import gguf
from lab.format.config import Config
from lab.format.ggml import BY_NAME, TYPES, GgmlType
from lab.format.model import is_flat, stored_tensors
from lab.format.rules import ModelError, show
from lab.format.writer import write_gguf

# The tensor types an adapter's A and B may have: those convert_lora_to_gguf.py writes (--outtype f32, f16, bf16,
# q8_0); `decode_f32` reads each.
ADAPTER_TYPES = ("F32", "F16", "BF16", "Q8_0")
SUFFIX_A, SUFFIX_B = ".lora_a", ".lora_b"
IGNORED_SUFFIX = "_norm.weight"     # llama.cpp: "TODO: add support for norm vector", skipped
# Base tensors the engine reads by row (lookups), never multiplies a vector by; the conv kernels, read whole, are
# lab.format.model's is_flat.
LOOKUP_TENSORS = ("token_embd.weight", "per_layer_token_embd.weight")
ALPHA_KEY = "adapter.lora.alpha"


@dataclass(frozen=True)
class LoraPair:
    """One adapted base matrix: W [n_in, n_out] (ggml) gains scale * B A. A and B are read from the adapter file at
    their offsets: A is [n_in, rank] (ggml; rank rows of n_in values), B [rank, n_out] (n_out rows of rank values)."""
    base: str
    rank: int
    n_in: int
    n_out: int
    scale: float        # alpha / rank
    a_type: str
    a_offset: int       # absolute file offsets and byte counts
    a_nbytes: int
    b_type: str
    b_offset: int
    b_nbytes: int


@dataclass(frozen=True)
class Adapter:
    arch: str
    alpha: float
    name: str | None                    # general.name
    pairs: tuple[LoraPair, ...]         # in the file's order of their lora_a tensors
    ignored: tuple[str, ...] = ()       # the norm tensors llama.cpp skips

    def pair(self, base: str) -> LoraPair | None:
        return next((p for p in self.pairs if p.base == base), None)

    @property
    def bases(self) -> tuple[str, ...]:
        return tuple(p.base for p in self.pairs)

    @property
    def nbytes(self) -> int:
        return sum(p.a_nbytes + p.b_nbytes for p in self.pairs)


def read_adapter(prefix: bytes | bytearray | memoryview, file_size: int, cfg: Config,
                 tensors: dict[str, tuple[int, ...]] | None = None) -> Adapter:
    """The adapter in the first bytes of a GGUF file of `file_size` bytes, checked against the model of `cfg` whose
    tensor table (name -> ggml shape) is `tensors` (default: the one cfg expects, lab.format.model.stored_tensors).
    Raises lab.format.gguf.NeedMoreBytes where the header goes on past the prefix (retry with e.needed bytes), else
    ModelError for anything wrong."""
    try:
        header = gguf.read(prefix, file_size)
    except gguf.NeedMoreBytes:
        raise
    except gguf.GGUFError as e:
        raise ModelError(f"adapter file: {e}") from None
    _check_keys(header, cfg)
    alpha = float(header.metadata[ALPHA_KEY])
    table = stored_tensors(cfg) if tensors is None else tensors
    by_base, ignored = _by_base(header)
    pairs = tuple(_pair(base, a, b, table, alpha) for base, (a, b) in by_base.items())
    if not pairs:
        raise ModelError(f"adapter file holds no lora_a / lora_b pair ({len(header.tensors)} tensors"
                         f"{', all ignored norms' if ignored else ''}): nothing to apply")
    name = header.metadata.get("general.name")
    return Adapter(cfg.arch, alpha, name if isinstance(name, str) else None, pairs, tuple(ignored))


def read_adapter_file(path, cfg: Config, tensors: dict[str, tuple[int, ...]] | None = None) -> Adapter:
    """read_adapter on a local file, its prefix growing until the header fits (as lab.format.gguf.read_file)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(0)
        data = f.read(min(gguf.FIRST_READ, size))
        while True:
            try:
                return read_adapter(data, size, cfg, tensors)
            except gguf.NeedMoreBytes as e:
                more = f.read(max(e.needed, min(size, 2 * len(data))) - len(data))
                if not more:
                    raise ModelError(f"{path}: the file ended at byte {len(data)} while being read (it was "
                                     f"{size} bytes): it changed") from None
                data += more


def _string_key(header: gguf.Header, key: str, want: str | None, what: str) -> str:
    """The string value of `key`, which must be `want` where given; a ModelError naming the key otherwise."""
    md = header.metadata
    if key not in md:
        raise ModelError(f"{key} is missing: {what}")
    v = md[key]
    if header.metadata_types.get(key) != gguf.STRING:
        raise ModelError(f"{key} = {show(v)}: must be a string ({what})")
    if want is not None and v != want:
        raise ModelError(f"{key} = {show(v)}: {what}")
    return v


def _check_keys(header: gguf.Header, cfg: Config) -> None:
    """general.type, adapter.type, alpha, no aLoRA, the architecture: llama.cpp's order of checks."""
    _string_key(header, "general.type", "adapter", "not a LoRA adapter (llama.cpp's adapters say general.type = "
                                                   "'adapter'; a model file says 'model' or nothing)")
    _string_key(header, "adapter.type", "lora", "this lab reads LoRA adapters only (adapter.type = 'lora')")
    md, types = header.metadata, header.metadata_types
    if ALPHA_KEY not in md:
        raise ModelError(f"{ALPHA_KEY} is missing: the scale alpha / rank needs it (llama.cpp would scale by 1; "
                         f"refused rather than guessed)")
    alpha = md[ALPHA_KEY]
    if types[ALPHA_KEY] != gguf.FLOAT32:
        raise ModelError(f"{ALPHA_KEY} = {show(alpha)}: has value type "
                         f"{gguf.VALUE_TYPE_NAMES.get(types[ALPHA_KEY], types[ALPHA_KEY])}, must be f32 "
                         f"(llama.cpp aborts on any other)")
    if not math.isfinite(alpha) or alpha <= 0:
        raise ModelError(f"{ALPHA_KEY} = {show(alpha)}: must be a finite number > 0")
    if "adapter.alora.invocation_tokens" in md:
        raise ModelError(f"adapter.alora.invocation_tokens = {show(md['adapter.alora.invocation_tokens'])}: an "
                         f"activated LoRA (applied only after those tokens) is not supported by this lab")
    arch = _string_key(header, "general.architecture", None, f"the adapter must name its base architecture "
                                                             f"({cfg.arch!r})")
    if arch != cfg.arch:
        raise ModelError(f"general.architecture = {show(arch)}: the adapter is for another architecture than the "
                         f"model's {cfg.arch!r}")


def _by_base(header: gguf.Header) -> tuple[dict[str, list], list[str]]:
    """{base name: [A, B]} in the order each base first appears (either may be None), and the ignored tensors."""
    by_base: dict[str, list] = {}
    ignored = []
    for t in header.tensors:
        if t.name.endswith(SUFFIX_A):
            by_base.setdefault(t.name[:-len(SUFFIX_A)], [None, None])[0] = t
        elif t.name.endswith(SUFFIX_B):
            by_base.setdefault(t.name[:-len(SUFFIX_B)], [None, None])[1] = t
        elif t.name.endswith(IGNORED_SUFFIX):
            ignored.append(t.name)
        else:
            raise ModelError(f"adapter tensor {_shown(t.name)} is neither a {SUFFIX_A} nor a {SUFFIX_B} tensor "
                             f"(nor a norm, which llama.cpp skips)")
    return by_base, ignored


def _shown(name: str) -> str:
    """A tensor name for a message: as it is, or quoted with escapes where it holds a character that is not printable
    (a damaged file's newline would break the message's one line)."""
    return name if name.isprintable() else repr(name)


def _pair(base: str, a: gguf.TensorInfo | None, b: gguf.TensorInfo | None, table: dict[str, tuple[int, ...]],
          alpha: float) -> LoraPair:
    """One pair checked against its base tensor: both halves present, 2-D, of a type read here, shaped [n_in, r] and
    [r, n_out] with 1 <= r <= min(n_in, n_out)."""
    if a is None or b is None:
        have, lacks = (b, SUFFIX_A) if a is None else (a, SUFFIX_B)
        raise ModelError(f"adapter tensor {_shown(have.name)} has no {_shown(base + lacks)}: a LoRA pair needs both "
                         f"halves")
    shape = table.get(base)
    if shape is None:
        raise ModelError(f"adapter tensor {_shown(a.name)}: the model has no tensor {_shown(base)} (an adapter for "
                         f"another model?)")
    if len(shape) != 2 or base in LOOKUP_TENSORS or is_flat(base):
        raise ModelError(f"adapter tensor {a.name}: {base} {list(shape)} is not a matrix the model multiplies by "
                         f"(a 2-D weight of a linear layer), so this lab does not adapt it")
    n_in, n_out = shape
    for t in (a, b):
        if len(t.shape) != 2:
            raise ModelError(f"adapter tensor {t.name} has {len(t.shape)} dimensions {list(t.shape)}, expected 2")
        if t.type.name not in ADAPTER_TYPES:
            raise ModelError(f"adapter tensor {t.name} has type {t.type.name}; this lab reads adapters in "
                             f"{', '.join(ADAPTER_TYPES)}")
    rank = b.shape[0]
    if a.shape[0] != n_in:
        raise ModelError(f"adapter tensor {a.name} has shape {list(a.shape)}, expected [{n_in}, rank]: its rows "
                         f"must be {n_in} long, the input width of {base} {list(shape)}")
    if b.shape[1] != n_out:
        raise ModelError(f"adapter tensor {b.name} has shape {list(b.shape)}, expected [rank, {n_out}]: "
                         f"{n_out} rows, the output width of {base} {list(shape)}")
    if a.shape[1] != rank:
        raise ModelError(f"adapter tensors {a.name} {list(a.shape)} and {b.name} {list(b.shape)} differ in rank: "
                         f"{a.shape[1]} against {rank}")
    if not 1 <= rank <= min(n_in, n_out):
        raise ModelError(f"adapter tensor {b.name}: rank {rank} is not in 1..{min(n_in, n_out)} = min(n_in, n_out) "
                         f"of {base} {list(shape)}")
    return LoraPair(base, rank, n_in, n_out, alpha / rank, a.type.name, a.offset, a.nbytes, b.type.name,
                    b.offset, b.nbytes)


# -- the values -------------------------------------------------------------------------------------------------

def _ggml_type(type_: GgmlType | int | str) -> GgmlType:
    if isinstance(type_, GgmlType):
        return type_
    t = TYPES.get(type_) if isinstance(type_, int) else BY_NAME.get(type_)
    if t is None:
        raise ModelError(f"unknown ggml type {type_!r}")
    return t


def decode_f32(raw: bytes | bytearray | memoryview, type_: GgmlType | int | str) -> array:
    """The values of `raw` (whole rows of an adapter tensor of that type: one of ADAPTER_TYPES) as array('f')."""
    t = _ggml_type(type_)
    raw = bytes(raw)
    if t.name not in ADAPTER_TYPES:
        raise ModelError(f"decode_f32: type {t.name} is not one an adapter may have ({', '.join(ADAPTER_TYPES)})")
    if len(raw) % t.nbytes:
        raise ModelError(f"decode_f32: {len(raw)} bytes are not a whole number of {t.nbytes}-byte {t.name} blocks")
    n = len(raw) // t.nbytes * t.block
    if t.name == "F32":
        return _little(array("f", raw))
    if t.name == "F16":
        return array("f", struct.unpack(f"<{n}e", raw))
    if t.name == "BF16":      # the high half of an f32's bits
        return array("f", array("I", (h << 16 for h in _little(array("H", raw)))).tobytes())
    out = array("f")          # Q8_0: blocks of an f16 scale d and 32 int8 q, value d * q
    for i in range(0, len(raw), t.nbytes):
        d = struct.unpack_from("<e", raw, i)[0]
        out.extend(d * q for q in struct.unpack_from("<32b", raw, i + 2))
    return out


def _little(a: array) -> array:
    """`a` read from little-endian bytes, on any host."""
    if sys.byteorder != "little":
        a.byteswap()
    return a


# -- the writer -------------------------------------------------------------------------------------------------

def write_adapter(arch: str, alpha: float, pairs: list[tuple[str, int, int, int, bytes, bytes]],
                  name: str = "LoRA adapter") -> bytes:
    """A LoRA adapter GGUF (v3, F32 tensors, the default alignment of 32) for a model of architecture `arch`.
    pairs: (base tensor name, n_in, n_out, rank, A as f32 bytes row-major [rank, n_in], B as f32 bytes row-major
    [n_out, rank]), written as <base>.lora_a [n_in, rank] and <base>.lora_b [rank, n_out]."""
    kvs = [("general.architecture", gguf.STRING, arch), ("general.type", gguf.STRING, "adapter"),
           ("general.name", gguf.STRING, name), ("adapter.type", gguf.STRING, "lora"),
           (ALPHA_KEY, gguf.FLOAT32, float(alpha))]
    tensors = []
    for base, n_in, n_out, rank, a, b in pairs:
        for suffix, shape, data in ((SUFFIX_A, (n_in, rank), a), (SUFFIX_B, (rank, n_out), b)):
            if len(data) != 4 * shape[0] * shape[1]:
                raise ValueError(f"{base}{suffix}: {len(data)} bytes, expected {4 * shape[0] * shape[1]} "
                                 f"(f32 {shape[1]} x {shape[0]})")
            tensors.append((base + suffix, shape, BY_NAME["F32"].id, bytes(data)))
    return write_gguf(kvs, tensors)
