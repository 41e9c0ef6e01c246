"""Write tests/fixtures/quant_blocks.npz: blocks of every type the lab reads, as llama.cpp's own quantizer writes them,
with llama.cpp's own dequantization of them. NOT part of CI (it needs llama.cpp's shared libraries).

    LLAMA_CPP_LIB_PATH=/root/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \\
        .venv/bin/python scripts/make_quant_fixtures.py

Through ctypes into libggml-base: ggml_quantize_chunk (the quantizer llama-quantize calls, with an importance matrix
of ones where ggml_quantize_requires_imatrix says the type needs one) and the type's to_float (ggml_get_type_traits),
the C reference dequantize_row_*. For each type, ROWS rows of COLS[type] values: standard normal times a per-row
spread, with a few outliers, so the block scales differ and the quantizers reach their larger codes. The fixture keeps
TYPE/blocks (uint8, rows x row bytes) and TYPE/floats (float32, rows x cols, llama.cpp's values) and, as metadata,
the llama.cpp commit it came from. tests/unit/test_quant_blocks.py holds lab/host/reference/quant.py's oracle to
the floats.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.format.ggml import BY_NAME
from lab.host.reference.quant import TYPES

OUT = ROOT / "tests" / "fixtures" / "quant_blocks.npz"
LIB_DIR = Path(os.environ.get("LLAMA_CPP_LIB_PATH", "/root/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"))
ROWS = 2
# Two blocks a row for the 256-element types, eight of 32, four of 64, two of 128; F16 and BF16 one row of 64 (their
# conversion is a float cast: little to hold). F32 is not quantized: nothing to check.
COLS = {name: max(2 * BY_NAME[name].block, 256) for name in TYPES if BY_NAME[name].block > 1}
COLS.update(F16=64, BF16=64)
SEED = 27


class TypeTraits(ctypes.Structure):
    """ggml.h's struct ggml_type_traits."""
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool),
                ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)),
                ("from_float_ref", ctypes.c_void_p)]


def load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(LIB_DIR / "libggml-base.so"))
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    return lib


def rows_of(cols: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((ROWS, cols)) * rng.uniform(0.05, 3.0, (ROWS, 1))
    hits = rng.integers(0, cols, (ROWS, 3))
    np.put_along_axis(x, hits, 8.0 * np.take_along_axis(x, hits, 1), 1)      # outliers: large block scales
    return x.astype(np.float32)


def quantize(lib: ctypes.CDLL, name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(blocks uint8 [rows, row bytes], llama.cpp's float32 [rows, cols]) of x through the type's own code."""
    t = BY_NAME[name]
    rows, cols = x.shape
    traits = lib.ggml_get_type_traits(t.id).contents
    assert traits.type_name.decode().upper() == name and (traits.blck_size, traits.type_size) == (t.block, t.nbytes)
    x = np.ascontiguousarray(x)
    blocks = np.zeros((rows, t.row_bytes(cols)), np.uint8)
    imatrix = np.ones(cols, np.float32) if lib.ggml_quantize_requires_imatrix(t.id) else None
    n = lib.ggml_quantize_chunk(t.id, x.ctypes.data, blocks.ctypes.data, 0, rows, cols,
                                None if imatrix is None else imatrix.ctypes.data)
    assert n == blocks.nbytes, (name, n, blocks.nbytes)
    floats = np.zeros((rows, cols), np.float32)
    traits.to_float(blocks.ctypes.data, floats.ctypes.data, rows * cols)
    return blocks, floats


def main() -> None:
    lib = load()
    rng = np.random.default_rng(SEED)
    out = {}
    for name in COLS:
        blocks, floats = quantize(lib, name, rows_of(COLS[name], rng))
        out[f"{name}/blocks"], out[f"{name}/floats"] = blocks, floats
    src = LIB_DIR.parents[1]
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out["llama_cpp"] = np.array(commit or "/".join(src.parts[-3:]))       # the vendored copy has no .git
    OUT.parent.mkdir(exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"{OUT.relative_to(ROOT)}: {len(COLS)} types, {OUT.stat().st_size:,} bytes (llama.cpp {out['llama_cpp']})")


if __name__ == "__main__":
    main()
