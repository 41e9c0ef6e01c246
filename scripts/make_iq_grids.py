"""Write lab/format/iq_grids.py, the IQ types' lookup tables, from gguf-py's copies of ggml's. NOT part of CI.

    .venv/bin/python scripts/make_iq_grids.py

gguf-py (gguf/quants.py) keeps each grid packed as hex (2 or 3 bits a value, with a map of the levels); this expands
them back to ggml's own form (ggml-common.h: iq2xxs_grid ... iq1s_grid, one little-endian integer a grid point,
byte k = value k, iq1s's -1 as 0xFF), so the module reads like the C tables it stands for. Run once; the unit test
tests/unit/test_iq_grids.py holds the module equal to gguf-py's tables.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import quants

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "lab" / "format" / "iq_grids.py"

GRIDS = [   # (name in the module, gguf-py class, C name, bytes a point)
    ("IQ2XXS_GRID", quants.IQ2_XXS, "iq2xxs_grid", 8),
    ("IQ2XS_GRID", quants.IQ2_XS, "iq2xs_grid", 8),
    ("IQ2S_GRID", quants.IQ2_S, "iq2s_grid", 8),
    ("IQ3XXS_GRID", quants.IQ3_XXS, "iq3xxs_grid", 4),
    ("IQ3S_GRID", quants.IQ3_S, "iq3s_grid", 4),
    ("IQ1S_GRID", quants.IQ1_S, "iq1s_grid", 8),
]


def points(cls, width: int) -> list[int]:
    """The grid's points as ggml's integers: value k of a point in byte k (two's complement for iq1s's -1)."""
    cls.init_grid()
    g = np.asarray(cls.grid).reshape(-1, width).astype(np.int64) & 0xFF
    return [int(sum(int(v) << (8 * k) for k, v in enumerate(row))) for row in g]


def table(name: str, values: list[int], digits: int, per_line: int) -> str:
    lines = [f"{name}: tuple[int, ...] = ("]
    for i in range(0, len(values), per_line):
        lines.append("    " + " ".join(f"0x{v:0{digits}x}," for v in values[i:i + per_line]))
    return "\n".join(lines) + "\n)\n"


def main() -> None:
    out = ['"""The lookup tables of ggml\'s grid quant types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), as data.',
           "",
           "Facts of the format, copied from ggml-common.h through gguf-py (scripts/make_iq_grids.py wrote this file; do not",
           "edit it by hand; tests/unit/test_iq_grids.py holds it equal to gguf-py's tables). Each grid is one integer a",
           "point, as ggml writes it: value k of the point is byte k (little-endian), unsigned for the IQ2 and IQ3 grids,",
           "int8 for IQ1's (-1 is 0xFF). The kernels read them from here: lab/gpu/shaders.py packs them (codes into",
           "each grid's few levels) into wgsl/quant.wgsl's WGSL arrays (wgsl_tables). Nothing here knows the block",
           "layouts.",
           '"""',
           "",
           "from __future__ import annotations",
           "",
           "# ksigns_iq2xs: a 7-bit sign index i gives the 8 sign bits i | parity(i) << 7 (an even count of minus signs).",
           table("KSIGNS_IQ2XS", list(quants.IQ2_XXS.ksigns), 2, 16),
           "# kmask_iq2xs: bit j of a sign byte is the sign of value j.",
           "KMASK_IQ2XS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)",
           "",
           "# IQ1S_DELTA: the offset IQ1_S and IQ1_M add to each grid value (+ or - by a bit of the block).",
           f"IQ1S_DELTA = {float(quants.IQ1_S.delta)!r}",
           ""]
    for name, cls, cname, width in GRIDS:
        vals = points(cls, width)
        out.append(f"# {cname}[{len(vals)}]: {width} values a point")
        out.append(table(name, vals, 2 * width, 8 if width == 4 else 4))
    OUT.write_text("\n".join(out))
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
