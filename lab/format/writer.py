"""GGUF files written, standard library only: metadata (every value type lab.format.gguf reads but nested arrays) and
tensors whose bytes the caller has laid out. Version 3, little-endian, the default alignment of 32; the bytes are
gguf-py's GGUFWriter's for the same keys in the same order (tests/unit/test_trained_tokenizer_gguf.py compares a
vocabulary's file with GGUFWriter's byte for byte).

    write_gguf([("general.architecture", STRING, "llama"), ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))])

Its users: a LoRA adapter (lab/format/adapter.py `write_adapter`), a trained tokenizer's vocabulary
(lab/text/tokenizer/train.py `TrainedBPE.gguf`), an untrained model's header (lab/format/untrained.py) and a trained
model (lab/instruments/training.py `model_bytes`), all written in the page's worker too, which cannot import gguf-py.

What it does not know: what the keys mean or whether a reader will accept them (its callers say which keys and types).
"""

from __future__ import annotations

import struct

from lab.format.gguf import (
    _SCALARS,
    ARRAY,
    DEFAULT_ALIGNMENT,
    MAGIC,
    STRING,
)

VERSION = 3


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value) -> bytes:
    """One value of `vtype`; an ARRAY's value is (element type, elements), its elements scalars or strings."""
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY:
        etype, items = value
        if etype == ARRAY:
            raise ValueError("nested arrays are not written")
        head = struct.pack("<IQ", etype, len(items))
        if etype == STRING:
            return head + b"".join(_string(x) for x in items)
        code = _SCALARS[etype][0]
        return head + struct.pack(f"<{len(items)}{code}", *items)
    return struct.pack("<" + _SCALARS[vtype][0], value)


def gguf_header(kvs: list[tuple[str, int, object]], tensors: list[tuple[str, tuple[int, ...], int, int]] = (),
                alignment: int = DEFAULT_ALIGNMENT) -> bytes:
    """A GGUF file's header, padded to where its data starts: kvs (key, value type, value) in order, then the tensor
    table of tensors (name, ggml shape ne0 first, ggml type id, data bytes), each tensor's data placed at a multiple of
    `alignment` after the one before."""
    head = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(kvs))]
    head += [_string(key) + struct.pack("<I", vtype) + _value(vtype, value) for key, vtype, value in kvs]
    offset = 0
    for name, shape, type_id, nbytes in tensors:
        head.append(_string(name) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, type_id, offset))
        offset += nbytes + (-nbytes % alignment)
    out = b"".join(head)
    return out + b"\0" * (-len(out) % alignment)


def write_gguf(kvs: list[tuple[str, int, object]], tensors: list[tuple[str, tuple[int, ...], int, bytes]] = (),
               alignment: int = DEFAULT_ALIGNMENT) -> bytes:
    """A GGUF file: `gguf_header`'s header, then each tensor's data (name, ggml shape, type id, data) padded to
    `alignment`."""
    head = gguf_header(kvs, [(name, shape, type_id, len(raw)) for name, shape, type_id, raw in tensors], alignment)
    return head + b"".join(bytes(raw) + b"\0" * (-len(raw) % alignment) for _, _, _, raw in tensors)
