"""lab/format/iq_grids.py (the grid types' tables, written by scripts/make_iq_grids.py) equals gguf-py's copy of
ggml's tables, and the kernels' sign formula equals ksigns_iq2xs."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants

from lab.format import iq_grids
from lab.gpu.shaders import wgsl_tables

GRIDS = [("IQ2XXS_GRID", quants.IQ2_XXS, 8, 256), ("IQ2XS_GRID", quants.IQ2_XS, 8, 512),
         ("IQ2S_GRID", quants.IQ2_S, 8, 1024), ("IQ3XXS_GRID", quants.IQ3_XXS, 4, 256),
         ("IQ3S_GRID", quants.IQ3_S, 4, 512), ("IQ1S_GRID", quants.IQ1_S, 8, 2048)]


@pytest.mark.parametrize("name,cls,width,n", GRIDS, ids=[g[0] for g in GRIDS])
def test_grid_equals_gguf(name, cls, width, n):
    """Byte k of point i is gguf's grid[i][k] (IQ1's -1 as the int8 0xFF)."""
    cls.init_grid()
    points = getattr(iq_grids, name)
    assert len(points) == n
    ours = np.array(points, dtype=np.uint64).view(np.uint8).reshape(n, 8)[:, :width]
    theirs = np.asarray(cls.grid).reshape(n, width)
    np.testing.assert_array_equal(ours.view(np.int8) if name == "IQ1S_GRID" else ours, theirs)


def test_wgsl_words_are_the_points_little_endian():
    """The WGSL array holds each point's words low first: the bytes of the array are the bytes of the table."""
    for name, _, width, n in GRIDS:
        text = wgsl_tables()[name]
        assert text.startswith(f"array<u32, {n * width // 4}>(")
        words = [int(w.rstrip("u"), 16) for w in text[text.index("(") + 1:-1].split(", ")]
        as_bytes = np.array(words, dtype=np.uint32).view(np.uint8).reshape(n, width)
        points = np.array(getattr(iq_grids, name), dtype=np.uint64).view(np.uint8).reshape(n, 8)[:, :width]
        np.testing.assert_array_equal(as_bytes, points)


def test_ksigns_and_kmask():
    """ksigns_iq2xs[i] = i | parity(i) << 7 (quant.wgsl's ksigns computes it so), and equals gguf's; kmask bit j."""
    assert iq_grids.KSIGNS_IQ2XS == tuple(quants.IQ2_XXS.ksigns)
    assert iq_grids.KSIGNS_IQ2XS == tuple(i | (bin(i).count("1") & 1) << 7 for i in range(128))
    assert iq_grids.KMASK_IQ2XS == tuple(1 << j for j in range(8))
    assert iq_grids.IQ1S_DELTA == float(quants.IQ1_S.delta) == 0.125
