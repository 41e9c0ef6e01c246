"""The retrieval index on disk: what `lab index` writes and `lab ask` reads, validated on load as the GGUF reader
validates a model (every problem an `IndexFileError` naming what is wrong and what to do).

Layout, version 1, little-endian:

    offset 0   magic  b"LLMLABIX"                                      8 bytes
           8   version                                                u32 (1)
          12   header length H                                        u32
          16   header: JSON, UTF-8                                    H bytes
               zero padding to a multiple of 4 (from the file's start)
          D    window table: n_windows x (file, start, end)           u32 x 3 each: token span [start, end) of a file
               token ids of the files, concatenated in file order     u32 x sum(files[].tokens)
               embeddings [n_windows, n_embd], rows of unit length    f32
               (the file ends there: no trailing bytes)

The header:

    {"format": "llm-lab retrieval index", "version": 1,
     "model": {"architecture", "name", "n_embd", "n_vocab", "fingerprint"},
     "window": 64, "stride": 32,       # the cut of lab.instruments.retrieval.windows_of
     "first": 1,                       # 1 when windows ran behind BOS (position 0 not pooled), else 0
     "files": [{"name", "tokens", "sha256"}, ...],   # sha256 of the file's bytes as read
     "windows": n_windows}

The window table repeats what `windows_of` cuts from the files' token counts at the header's window and stride: a
reader without this code can find a window's tokens, and this one refuses a table that disagrees (a damaged file).

The model fingerprint (`fingerprint`): sha256 over the GGUF file's size (u64) and its first and last MiB. Hashing a
5 GB model whole takes tens of seconds on every `lab ask`; the first MiB holds the header (architecture, shapes,
tokenizer) and the last the bytes of the last tensors, which a fine-tune or another quantization with the same header
changes. Embeddings from one model mean nothing to another, so an index answers only to the model that made it.

What it does not know: the GPU (lab.instruments.retrieval.Index builds, restores and searches), the files' text
(only their token ids: the text is decoded from them), and the files on disk (their sha256 says which bytes were
indexed; nothing here compares it with a file now).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass

import numpy as np

from lab.instruments.retrieval import MAX_WINDOW, MIN_WINDOW, Prepared, RetrievalError, windows_of

MAGIC = b"LLMLABIX"
VERSION = 1
FORMAT = "llm-lab retrieval index"
_FIXED = struct.Struct("<8sII")     # magic, version, header length
FINGERPRINT_SPAN = 1 << 20          # bytes hashed at each end of the GGUF file
NORM_TOL = 1e-3                     # |norm - 1| allowed of a row: the GPU normalises in f32 (error ~1e-6)
_SHA256 = re.compile(r"[0-9a-f]{64}")
REBUILD = "rebuild it with `lab index MODEL FILES... --out INDEX`"


class IndexFileError(RetrievalError):
    """An index file that cannot be used; the message names the file, what is wrong and what to do."""


@dataclass(frozen=True)
class ModelInfo:
    architecture: str       # general.architecture
    name: str               # general.name ("" when the file has none)
    n_embd: int             # floats in an embedding
    n_vocab: int            # token ids are below this
    fingerprint: str        # sha256 hex of the GGUF file's size and first and last MiB (`fingerprint`)

    def describe(self) -> str:
        return f"{self.name or '(unnamed)'} ({self.architecture}, n_embd {self.n_embd}, fingerprint " \
               f"{self.fingerprint[:12]})"


def fingerprint(path: str | os.PathLike) -> str:
    """sha256 hex over the file's size (u64) and its first and last FINGERPRINT_SPAN bytes (see the module's
    docstring for why not the whole file)."""
    size = os.path.getsize(path)
    h = hashlib.sha256(struct.pack("<Q", size))
    with open(path, "rb") as f:
        h.update(f.read(FINGERPRINT_SPAN))
        f.seek(max(0, size - FINGERPRINT_SPAN))
        h.update(f.read(FINGERPRINT_SPAN))
    return h.hexdigest()


def model_info(path: str | os.PathLike, header, cfg) -> ModelInfo:
    """The model facts an index records, from a GGUF's path, its parsed header and its Config."""
    name = header.metadata.get("general.name")
    return ModelInfo(cfg.arch, name if isinstance(name, str) else "", cfg.n_embd, cfg.n_vocab, fingerprint(path))


@dataclass
class SavedFile:
    name: str
    sha256: str             # hex, of the file's bytes as read
    ids: list[int]          # its token ids (no BOS)


@dataclass
class Saved:
    """An index as the file holds it."""
    model: ModelInfo
    window: int
    stride: int
    first: int              # 1 when windows ran behind BOS
    files: list[SavedFile]
    embeddings: np.ndarray  # f32 [n_windows, n_embd], rows of unit length

    @classmethod
    def of_index(cls, index, model: ModelInfo, digests: list[str], embeddings: bytes) -> Saved:
        """A built Index (every window embedded) with its model, its files' sha256 (in the order of
        index.prepared.names) and its embeddings as `await index.embeddings()` reads them."""
        p = index.prepared
        if index.ready != len(p.spans):
            raise IndexFileError(f"the index holds {index.ready} of its {len(p.spans)} windows: a stopped build is "
                                 f"not saved, index the files again")
        emb = np.frombuffer(embeddings, "<f4").reshape(len(p.spans), model.n_embd)
        files = [SavedFile(n, d, list(i)) for n, d, i in zip(p.names, digests, p.ids, strict=True)]
        return cls(model, index.window, index.stride, index.first, files, emb)

    @property
    def spans(self) -> list[tuple[int, int, int]]:
        """(file, start, end) of every window: what windows_of cuts at this window and stride."""
        return [(f, a, b) for f, sf in enumerate(self.files) for a, b in windows_of(len(sf.ids), self.window,
                                                                                    self.stride)]

    @property
    def n_tokens(self) -> int:
        return sum(len(f.ids) for f in self.files)

    def prepared(self) -> Prepared:
        """What `Index.restore` takes with the embeddings."""
        return Prepared(names=[f.name for f in self.files], ids=[list(f.ids) for f in self.files], spans=self.spans)

    def header(self) -> dict:
        m = self.model
        return {"format": FORMAT, "version": VERSION,
                "model": {"architecture": m.architecture, "name": m.name, "n_embd": m.n_embd, "n_vocab": m.n_vocab,
                          "fingerprint": m.fingerprint},
                "window": self.window, "stride": self.stride, "first": self.first,
                "files": [{"name": f.name, "tokens": len(f.ids), "sha256": f.sha256} for f in self.files],
                "windows": len(self.embeddings)}


# -- writing ---------------------------------------------------------------------------------------------------
def save(path: str | os.PathLike, saved: Saved) -> int:
    """Write `saved` (the layout above) and return its size in bytes. Written beside `path` and renamed over it, so an
    interrupted save never leaves a half index under the name. The values are written as they are: `load` is
    where they are checked."""
    spans = saved.spans
    emb = np.ascontiguousarray(saved.embeddings, dtype="<f4")
    if emb.shape != (len(spans), saved.model.n_embd):
        raise IndexFileError(f"embeddings of shape {emb.shape} for {len(spans)} windows of n_embd "
                             f"{saved.model.n_embd}")
    head = json.dumps(saved.header()).encode("utf-8")     # ASCII: names' odd characters are \u escapes
    pad = -(_FIXED.size + len(head)) % 4
    ids = [np.asarray(f.ids, dtype="<u4") for f in saved.files]
    tmp = f"{os.fspath(path)}.part"
    with open(tmp, "wb") as f:
        f.write(_FIXED.pack(MAGIC, VERSION, len(head)) + head + bytes(pad))
        f.write(np.asarray(spans, dtype="<u4").reshape(-1, 3).tobytes())
        for a in ids:
            f.write(a.tobytes())
        f.write(emb.tobytes())
        size = f.tell()
    os.replace(tmp, path)
    return size


# -- reading and validating --------------------------------------------------------------------------------------
def load(path: str | os.PathLike, model: ModelInfo | None = None) -> Saved:
    """Read and validate an index file; with `model`, also that the index was made by that model. Checked in the
    order a reader meets them: the fixed part, the header (JSON, every field's presence and type), the sizes the
    header implies against the file's length, the window table against windows_of, the token ids against the
    vocabulary, the embeddings (finite, unit rows), the model."""
    with open(path, "rb") as f:
        data = f.read()
    where = os.fspath(path)

    def fail(msg: str) -> IndexFileError:
        return IndexFileError(f"{where}: {msg}")

    # 1. the fixed part: magic, version, header length
    size = len(data)
    if size < _FIXED.size:
        raise fail(f"truncated: {size} bytes, fewer than the {_FIXED.size} of the magic, version and header length; "
                   f"{REBUILD}")
    magic, version, hlen = _FIXED.unpack_from(data)
    if magic != MAGIC:
        hint = " (a GGUF model: pass it as MODEL, and the index after --index)" if magic[:4] == b"GGUF" else ""
        raise fail(f"not an llm-lab index: the first bytes are {magic!r}, expected {MAGIC!r}{hint}")
    if version != VERSION:
        raise fail(f"index format version {version} (at offset 8); this lab reads version {VERSION}: {REBUILD} "
                   f"with this lab")
    if _FIXED.size + hlen > size:
        raise fail(f"the header length {hlen:,} (at offset 12) runs past the end of the file ({size:,} bytes): "
                   f"truncated or damaged; {REBUILD}")

    # 2. the header: JSON, then each field
    try:
        head = json.loads(data[_FIXED.size:_FIXED.size + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise fail(f"the header is not valid JSON ({exc}): the index is damaged; {REBUILD}") from None
    saved_model, window, stride, first, names, counts, digests, n = _header(head, fail)

    # 3. the sizes the header implies, against the file's length (token counts first: they bound windows_of's work)
    at = _FIXED.size + hlen
    at += -at % 4
    n_tokens = sum(counts)
    E = saved_model.n_embd
    if at + 4 * n_tokens > size:
        raise fail(f"the header counts {n_tokens:,} tokens ({4 * n_tokens:,} bytes) but only {size - at:,} bytes "
                   f"follow it: truncated; {REBUILD}")
    want = [(f, a, b) for f, c in enumerate(counts) for a, b in windows_of(c, window, stride)]
    if n != len(want):
        raise fail(f"the header says {n:,} windows but its files' {n_tokens:,} tokens cut at window {window} and "
                   f"stride {stride} make {len(want):,}: the index is damaged; {REBUILD}")
    expect = at + 12 * n + 4 * n_tokens + 4 * n * E
    if size < expect:
        raise fail(f"truncated: {size:,} bytes, but its header describes {expect:,} ({n:,} windows of {E} floats, "
                   f"{n_tokens:,} tokens); {REBUILD}")
    if size > expect:
        raise fail(f"{size - expect:,} bytes past the end of the embeddings (the header describes {expect:,}): "
                   f"damaged, or not written by `lab index`; {REBUILD}")

    # 4. the window table: spans inside their files, and exactly windows_of's cuts
    table = np.frombuffer(data, "<u4", 3 * n, at).reshape(n, 3).astype(np.int64)
    counts_np = np.asarray(counts, dtype=np.int64)
    f_ok = table[:, 0] < len(counts)
    end_max = np.where(f_ok, counts_np[np.minimum(table[:, 0], len(counts) - 1)], 0)
    bad = np.flatnonzero(~f_ok | (table[:, 1] >= table[:, 2]) | (table[:, 2] > end_max))
    if bad.size:
        w = int(bad[0])
        f, a, b = (int(v) for v in table[w])
        of = (f"the index holds {len(counts)} files" if f >= len(counts)
              else f"file {f} ({names[f]!r}) holds {counts[f]:,} tokens")
        raise fail(f"window {w} spans tokens {a}-{b} of file {f}, outside its range: {of}; the index is damaged; "
                   f"{REBUILD}")
    differ = np.flatnonzero((table != np.asarray(want, dtype=np.int64).reshape(n, 3)).any(axis=1))
    if differ.size:
        w = int(differ[0])
        f, a, b = (int(v) for v in table[w])
        raise fail(f"window {w} is tokens {a}-{b} of file {f}, but window {window} and stride {stride} cut tokens "
                   f"{want[w][1]}-{want[w][2]} of file {want[w][0]} there: the index is damaged; {REBUILD}")
    at += 12 * n

    # 5. token ids inside the vocabulary the header names (the model's, when `model` matches below)
    ids = np.frombuffer(data, "<u4", n_tokens, at)
    bad = np.flatnonzero(ids >= saved_model.n_vocab)
    if bad.size:
        i = int(bad[0])
        ends = np.cumsum(counts_np)
        f = int(np.searchsorted(ends, i, side="right"))
        raise fail(f"token id {int(ids[i])} (file {names[f]!r}, token {i - int(ends[f] - counts[f])}) is outside the "
                   f"vocabulary of {saved_model.n_vocab:,}: the index is damaged; {REBUILD}")
    at += 4 * n_tokens

    # 6. the embeddings: finite, and each row of unit length (the pool normalises every window)
    emb = np.frombuffer(data, "<f4", n * E, at).reshape(n, E)
    finite = np.isfinite(emb).all(axis=1)
    if not finite.all():
        w = int(np.flatnonzero(~finite)[0])
        raise fail(f"window {w}'s embedding holds a non-finite value ({emb[w][~np.isfinite(emb[w])][0]}): the index "
                   f"is damaged; {REBUILD}")
    norms = np.sqrt(np.einsum("ij,ij->i", emb, emb, dtype=np.float64))
    off = np.flatnonzero(np.abs(norms - 1) > NORM_TOL)
    if off.size:
        w = int(off[0])
        raise fail(f"window {w}'s embedding has length {norms[w]:.6g}, not 1 (within {NORM_TOL:g}): the index is "
                   f"damaged; {REBUILD}")

    # 7. the model
    if model is not None:
        check_model(saved_model, model, where)

    files, pos = [], 0
    all_ids = ids.tolist()
    for name, c, d in zip(names, counts, digests):
        files.append(SavedFile(name, d, all_ids[pos:pos + c]))
        pos += c
    return Saved(saved_model, window, stride, first, files, emb)


def check_model(saved: ModelInfo, model: ModelInfo, where: str) -> None:
    """IndexFileError unless the index's model is `model`: another shape first (the clearer message), then other
    weights under the same shape."""
    todo = f"ask with the model that made it, or {REBUILD} with this model"
    if (saved.architecture, saved.n_embd, saved.n_vocab) != (model.architecture, model.n_embd, model.n_vocab):
        raise IndexFileError(f"{where}: made with another model: {saved.describe()}, vocabulary {saved.n_vocab:,}; "
                             f"this is {model.describe()}, vocabulary {model.n_vocab:,}; {todo}")
    if saved.fingerprint != model.fingerprint:
        raise IndexFileError(f"{where}: made with another model of the same shape (another fine-tune or "
                             f"quantization): fingerprint {saved.fingerprint[:12]} ({saved.name or 'unnamed'}), this "
                             f"model's is {model.fingerprint[:12]} ({model.name or 'unnamed'}); {todo}")


def _header(head, fail):
    """The header's fields, each checked for presence, type and range (IndexFileError naming the field)."""
    def get(obj: dict, key: str, kind: type, where: str = ""):
        if key not in obj:
            raise fail(f"the header lacks {where}{key!r}: the index is damaged or not written by `lab index`; "
                       f"{REBUILD}")
        v = obj[key]
        if type(v) is not kind:    # `is`: a bool is not an int here, nor 64.0 an int
            raise fail(f"the header's {where}{key!r} is {type(v).__name__} {_show(v)}, not {kind.__name__}: the "
                       f"index is damaged; {REBUILD}")
        return v

    def count(obj: dict, key: str, lo: int, hi: int | None = None, where: str = "") -> int:
        v = get(obj, key, int, where)
        if v < lo or (hi is not None and v > hi):
            bound = f"{lo} .. {hi}" if hi is not None else f"at least {lo}"
            raise fail(f"the header's {where}{key!r} is {v}, not {bound}: the index is damaged; {REBUILD}")
        return v

    def sha(obj: dict, key: str, where: str) -> str:
        v = get(obj, key, str, where)
        if not _SHA256.fullmatch(v):
            raise fail(f"the header's {where}{key!r} is {_show(v)}, not 64 lowercase hex digits: the index is "
                       f"damaged; {REBUILD}")
        return v

    if type(head) is not dict:
        raise fail(f"the header is a JSON {type(head).__name__}, not an object: the index is damaged; {REBUILD}")
    if (fmt := get(head, "format", str)) != FORMAT:
        raise fail(f"the header's format is {_show(fmt)}, not {FORMAT!r}: not an llm-lab index")
    if (v := get(head, "version", int)) != VERSION:
        raise fail(f"the header says version {v}, the file's fixed part says {VERSION}: the index is damaged; "
                   f"{REBUILD}")
    m = get(head, "model", dict)
    model = ModelInfo(get(m, "architecture", str, "model."), get(m, "name", str, "model."),
                      count(m, "n_embd", 1, None, "model."), count(m, "n_vocab", 1, None, "model."),
                      sha(m, "fingerprint", "model."))
    window = count(head, "window", MIN_WINDOW, MAX_WINDOW)
    stride = count(head, "stride", 1, window)
    first = count(head, "first", 0, 1)
    files = get(head, "files", list)
    if not files:
        raise fail(f"the header lists no files: an index holds at least one; {REBUILD}")
    names, counts, digests = [], [], []
    for i, e in enumerate(files):
        where = f"files[{i}]."
        if type(e) is not dict:
            raise fail(f"the header's files[{i}] is {type(e).__name__} {_show(e)}, not an object: the index is "
                       f"damaged; {REBUILD}")
        name = get(e, "name", str, where)
        if not name:
            raise fail(f"the header's {where}'name' is empty: the index is damaged; {REBUILD}")
        names.append(name)
        counts.append(count(e, "tokens", 1, None, where))
        digests.append(sha(e, "sha256", where))
    n = count(head, "windows", 1)
    return model, window, stride, first, names, counts, digests, n


def _show(v) -> str:
    s = json.dumps(v)
    return s if len(s) <= 60 else s[:57] + "..."
