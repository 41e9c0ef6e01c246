"""Same-shape GGUFs that keep a real model's header: all its metadata (the tokenizer and chat template too)
and its tensor table, byte for byte, with random but valid blocks of the same types and shapes after it
(CPython only: numpy).

lab/host/synthetic/releases.py builds a file from a spec and has no tokenizer, so only the native benchmark can run
it; the page chats, so the browser benchmark needs a tokenizer. The header prefix is small (1.8 MB for
SmolLM2, 5.9 MB for Qwen2.5, 6.5 MB for Gemma 3) against the file (98 / 491 / 253 MB), so the prefix is
what travels to a GPU machine and the file is rebuilt there:

    python -m lab.host.synthetic.sameshape prefix REAL.gguf PREFIX      # the header bytes only
    python -m lab.host.synthetic.sameshape build PREFIX|REAL.gguf OUT   # header + random blocks, the real file's size

The weights are noise: replies are gibberish, the timing is the real model's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from lab.format import gguf
from lab.host.synthetic.releases import random_blocks


def header_prefix(path) -> bytes:
    """The first bytes of a GGUF file up to where its tensor data starts."""
    header = gguf.read_file(path)
    with open(path, "rb") as f:
        return f.read(header.data_offset)


def _read_prefix(src) -> bytes:
    """A header prefix file's bytes, or a whole GGUF's header prefix (read without loading the file)."""
    src = Path(src)
    with open(src, "rb") as f:
        head = f.read(64 << 20)
    try:
        h = gguf.read(head)
    except gguf.NeedMoreBytes:
        raise gguf.GGUFError(f"{src} ends inside its header: not a header prefix of a GGUF file") from None
    return head[:h.data_offset]


def _tensor_bytes(t: gguf.TensorInfo, rng: np.random.Generator) -> bytes:
    cols = t.shape[0]
    rows = t.n_elements // cols
    if t.type.name == "F32":
        # Norm weights (1-D, named *norm*) as ones, like a fresh model's; anything else small noise.
        if len(t.shape) == 1 and "norm" in t.name:
            return np.ones(cols, np.float32).tobytes()
        return (rng.standard_normal(t.n_elements, dtype=np.float32) * 0.02).tobytes()
    if t.type.name in ("F16", "BF16"):
        v = rng.standard_normal(t.n_elements, dtype=np.float32) * 0.02
        return (v.astype(np.float16) if t.type.name == "F16"
                else (v.view(np.uint32) >> 16).astype(np.uint16)).tobytes()
    return random_blocks(t.type.name, rows, cols, rng).tobytes()


def build(src, out, seed: int = 0) -> Path:
    """Write `out`: the header of `src` (a real GGUF or its header prefix) and random valid blocks for every
    tensor at its recorded offset, zero padding between them, so the file has the real one's exact size."""
    prefix = _read_prefix(src)
    header = gguf.read(prefix)
    rng = np.random.default_rng(seed)
    out = Path(out)
    with open(out, "wb") as f:
        f.write(prefix)
        for t in sorted(header.tensors, key=lambda t: t.offset):
            if f.tell() > t.offset:
                raise gguf.GGUFError(f"tensor {t.name} at {t.offset} overlaps the one before it")
            f.write(b"\0" * (t.offset - f.tell()))
            data = _tensor_bytes(t, rng)
            if len(data) != t.nbytes:
                raise gguf.GGUFError(f"tensor {t.name}: made {len(data)} bytes, the table says {t.nbytes}")
            f.write(data)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("prefix", "build"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "prefix":
        Path(argv[2]).write_bytes(header_prefix(argv[1]))
    else:
        path = build(argv[1], argv[2])
        print(f"{path}: {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
