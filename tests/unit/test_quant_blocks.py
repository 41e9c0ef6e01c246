"""lab/host/reference/quant.py's dequantization (gguf.quants; ours for Q1_0 and Q2_0) against llama.cpp's own, on
blocks llama.cpp's quantizer wrote: tests/fixtures/quant_blocks.npz (scripts/make_quant_fixtures.py, from llama.cpp's
ggml_quantize_chunk and the type's to_float). The kernels are held to this oracle by tests/kernels, so through it to
llama.cpp's floats.

Bit for bit: every value is the same few float32 operations in C and in numpy, most of them exact products (an f16
scale times small integers and grid values; reference/quant.py, DEQUANT_TOL's note). The types with a minimum (Q4_1,
Q5_1, Q2_K, Q4_K, Q5_K: d * q + m) round once more, where a C compiler may contract into an fma; the fixture's build
did not move a bit there either, so they are held bit for bit too, and a rebuild that contracts would show here first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lab.format.ggml import BY_NAME, KERNEL_TYPES
from lab.host.reference import quant as qo

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "quant_blocks.npz"
_z = np.load(FIXTURE)
NAMES = sorted({k.split("/")[0] for k in _z.files if "/" in k})


def test_every_type_the_lab_reads_is_in_the_fixture():
    """Every type of the kernel table but F32 (llama.cpp does not quantize to it: nothing to dequantize)."""
    assert set(NAMES) == set(KERNEL_TYPES) - {"F32"}
    assert str(_z["llama_cpp"])                 # the llama.cpp it came from


@pytest.mark.parametrize("name", NAMES)
def test_oracle_equals_llama_cpp(name):
    blocks, floats = _z[f"{name}/blocks"], _z[f"{name}/floats"]
    t = BY_NAME[name]
    assert blocks.shape[1] == t.row_bytes(floats.shape[1])
    ours = qo.dequant(blocks, name)
    assert ours.dtype == np.float32 and ours.shape == floats.shape
    np.testing.assert_array_equal(ours, floats)
    assert len(np.unique(floats)) > 4 and np.any(floats < 0)     # real data: several levels, both signs
