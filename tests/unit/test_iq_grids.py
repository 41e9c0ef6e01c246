"""lab/format/iq_grids.py (the grid types' tables, written by scripts/make_iq_grids.py) equals gguf-py's copy of
ggml's tables, the kernels' packed form of them (lab/gpu/shaders.py) decodes back to them, and the kernels' sign
formula equals ksigns_iq2xs."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants

from lab.format import iq_grids
from lab.gpu.shaders import GRID_PART, wgsl_tables

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


def _words(text: str) -> list[int]:
    return [int(w.rstrip("u"), 16) for w in text[text.index("(") + 1:-1].split(", ")]


@pytest.mark.parametrize("name,cls,width,n", GRIDS, ids=[g[0] for g in GRIDS])
def test_wgsl_packed_grid_decodes_to_the_points(name, cls, width, n):
    """quant.wgsl's reading of the packed grid (point p: half p % 2 of word p / 2 of the parts in order, value k the
    b-bit code at bit b*k, level c byte c of the two level words) gives back every point of the table."""
    tables = wgsl_tables()
    key = name.removesuffix("_GRID")
    parts = [tables[f"{key}_GRID"]] if f"{key}_GRID" in tables else \
        [tables[f"{key}_GRID{k}"] for k in range(n // 2 // GRID_PART)]
    assert all(p.startswith(f"array<u32, {min(n // 2, GRID_PART)}>(") for p in parts)
    words = [w for p in parts for w in _words(p)]
    level_bytes = np.array(_words(tables[f"{key}_LEVELS"].replace("vec2<u32>", "")), np.uint32).view(np.uint8)
    b = 2 if width == 8 else 3
    codes = [(words[p // 2] >> (16 * (p % 2) + b * k)) & ((1 << b) - 1) for p in range(n) for k in range(width)]
    got = level_bytes[codes].reshape(n, width)
    points = np.array(getattr(iq_grids, name), dtype=np.uint64).view(np.uint8).reshape(n, 8)[:, :width]
    np.testing.assert_array_equal(got, points)


def test_ksigns_and_kmask():
    """ksigns_iq2xs[i] = i | parity(i) << 7 (quant.wgsl's ksigns computes it so), and equals gguf's; kmask bit j."""
    assert iq_grids.KSIGNS_IQ2XS == tuple(quants.IQ2_XXS.ksigns)
    assert iq_grids.KSIGNS_IQ2XS == tuple(i | (bin(i).count("1") & 1) << 7 for i in range(128))
    assert iq_grids.KMASK_IQ2XS == tuple(1 << j for j in range(8))
    assert iq_grids.IQ1S_DELTA == float(quants.IQ1_S.delta) == 0.125
