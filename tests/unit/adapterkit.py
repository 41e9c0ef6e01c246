"""What the adapter tests (test_adapter_file.py, test_lora_reference.py) and scripts/make_lora_fixtures.py share: a GGUF
writer of their own (not lab.format.adapter's: any keys, any tensors, any damage), and the hostile adapters that
llama.cpp's loader is run on (`loader_cases`, for the synthetic Llama 3 file's shapes). numpy and lab.format only: the
fixture script imports it from the llama-cpp-python venv."""

from __future__ import annotations

import math
import struct

import numpy as np

from lab.format import gguf

F32, F16, BF16, Q8_0, Q4_0, F64 = 0, 1, 30, 8, 2, 28


def rng_f32(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype("<f4")


def _str(s: str) -> bytes:
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, v) -> bytes:
    if vtype == gguf.STRING:
        return _str(v)
    if vtype == gguf.ARRAY:         # arrays of u32 only
        return struct.pack("<IQ", gguf.UINT32, len(v)) + struct.pack(f"<{len(v)}I", *v)
    return struct.pack("<" + {gguf.FLOAT32: "f", gguf.FLOAT64: "d", gguf.UINT32: "I"}[vtype], v)


def gguf_bytes(kvs: list[tuple[str, int, object]], tensors: list[tuple[str, tuple[int, ...], int, bytes]]) -> bytes:
    """GGUF v3: kvs (key, value type, value), tensors (name, ggml shape, type id, data), data aligned to 32."""
    head = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kvs))]
    head += [_str(k) + struct.pack("<I", t) + _value(t, v) for k, t, v in kvs]
    blobs, offset = [], 0
    for name, shape, type_id, data in tensors:
        head.append(_str(name) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, type_id, offset))
        blobs.append(data + b"\0" * (-len(data) % 32))
        offset += len(blobs[-1])
    out = b"".join(head)
    return out + b"\0" * (-len(out) % 32) + b"".join(blobs)


def good_kvs(**change) -> list[tuple[str, int, object]]:
    """The keys of a valid llama adapter; change: key (dots as __) -> (type, value), or None to leave the key out."""
    kvs = {"general.architecture": (gguf.STRING, "llama"), "general.type": (gguf.STRING, "adapter"),
           "adapter.type": (gguf.STRING, "lora"), "adapter.lora.alpha": (gguf.FLOAT32, 8.0)}
    for k, v in change.items():
        kvs[k.replace("__", ".")] = v
    return [(k, *v) for k, v in kvs.items() if v is not None]


def tensor(name: str, shape: tuple[int, ...], seed: int = 0, type_id: int = F32):
    """(name, shape, type, data): random values in F32, F16 or F64, zero bytes of the right length in another type."""
    values = rng_f32(seed, math.prod(shape)) * 0.05
    raw = {F32: values, F16: values.astype("<f2"), F64: values.astype("<f8")}.get(type_id)
    if raw is None:
        t = gguf.TYPES[type_id]
        return (name, shape, type_id, bytes(t.row_bytes(shape[0]) * math.prod(shape[1:])))
    return (name, shape, type_id, raw.tobytes())


def pair(base: str, n_in: int, n_out: int, rank: int, seed: int = 0, a_shape=None, b_shape=None, type_id=F32):
    """<base>.lora_a [n_in, rank] and <base>.lora_b [rank, n_out] (or the shapes given)."""
    return [tensor(base + ".lora_a", a_shape or (n_in, rank), seed, type_id),
            tensor(base + ".lora_b", b_shape or (rank, n_out), seed + 1, type_id)]


# The hostile adapters llama.cpp's loader (llama_adapter_lora_init) is run on, for the synthetic "llama3" file (attn_k
# [256, 128]), and where this lab's reader stands: "refused" as llama.cpp refuses, "stricter" where llama.cpp loads
# what the lab refuses (lab/format/adapter.py's docstring says why), "loaded" by both.
def loader_cases() -> dict[str, tuple[str, bytes]]:
    k = "blk.0.attn_k.weight"
    base = pair(k, 256, 128, 4)
    cases = {
        "valid": ("loaded", good_kvs(), base),
        "norm tensor": ("loaded", good_kvs(), base + [tensor("blk.0.attn_norm.weight", (256,))]),
        "F16 pair": ("loaded", good_kvs(), pair(k, 256, 128, 4, type_id=F16)),
        "other architecture": ("refused", good_kvs(general__architecture=(gguf.STRING, "qwen2")), base),
        "general.type model": ("refused", good_kvs(general__type=(gguf.STRING, "model")), base),
        "adapter.type other": ("refused", good_kvs(adapter__type=(gguf.STRING, "control_vector")), base),
        "lora_a alone": ("refused", good_kvs(), base[:1]),
        "lora_b alone": ("refused", good_kvs(), base[1:]),
        "A's n_in wrong": ("refused", good_kvs(), pair(k, 256, 128, 4, a_shape=(128, 4))),
        "B's n_out wrong": ("refused", good_kvs(), pair(k, 256, 128, 4, b_shape=(4, 256))),
        "A stored [r, n_in]": ("refused", good_kvs(), pair(k, 256, 128, 4, a_shape=(4, 256))),
        "ranks differ": ("refused", good_kvs(), pair(k, 256, 128, 4, a_shape=(256, 8))),
        "base not in model": ("refused", good_kvs(), pair("blk.9.attn_k.weight", 256, 128, 4)),
        "other suffix": ("refused", good_kvs(), base + [tensor(k + ".lora_c", (256, 4))]),
        "alpha missing": ("stricter", good_kvs(adapter__lora__alpha=None), base),
        "alpha negative": ("stricter", good_kvs(adapter__lora__alpha=(gguf.FLOAT32, -8.0)), base),
        "rank above min(n_in, n_out)": ("stricter", good_kvs(), pair(k, 256, 128, 200)),
        "no tensor": ("stricter", good_kvs(), []),
        "F64 pair": ("stricter", good_kvs(), pair(k, 256, 128, 4, type_id=F64)),
    }
    return {name: (verdict, gguf_bytes(kvs, tensors)) for name, (verdict, kvs, tensors) in cases.items()}
