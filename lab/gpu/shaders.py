"""WGSL sources: one file per kernel family in wgsl/, filled with constants Python owns.

Two directives, nothing more:
  `//!include NAME.wgsl`  pastes a shared file (byte loaders, f16 unpacking) once, where it stands; NAME may be
                          a `{{KEY}}` (matvec.wgsl's loop: one file per loop, with the bindings only it uses);
  `{{KEY}}`               is replaced by the value given for KEY; a key left unfilled is an error,
                          so the dispatch grid and the kernel can never disagree silently. The IQ types' lookup
                          tables (`wgsl_tables`: IQ2XXS_GRID ...) are filled into every file without being given,
                          and stay out of the pipeline's key and label (they are facts of the format, not variants).

Shared includes: common.wgsl (the Step uniform every per-step kernel reads), matmul_io.wgsl (the prefill
projections' bindings), reduce.wgsl (workgroup sum / max), rows.wgsl (row selection of softmax and sampling),
quant.wgsl (GGUF dequantization), act.wgsl, rotary.wgsl (RoPE's cos and sin: rope.wgsl and matvec.wgsl's epilogue).

Natively the files are read from the repository's wgsl/ folder; in the browser the worker copies
the served /wgsl/ files into Pyodide's file system and calls `set_dir`.
"""

from __future__ import annotations

import os
import re
import struct
from functools import cache
from pathlib import Path

from lab.format import iq_grids
from lab.gpu import CONSTANT

_dir = Path(os.environ.get("LAB_WGSL_DIR", Path(__file__).resolve().parents[2] / "wgsl"))
_KEY = re.compile(r"\{\{([A-Z0-9_]+)\}\}")
_INCLUDE = re.compile(r"^//!include\s+(\S+)\s*$", re.MULTILINE)


def subgroup_consts(device) -> dict:
    """The line switches of a kernel with a workgroup reduction: its subgroup path or its shared-memory fallback.

    Lines prefixed `{{SG}}` are live only with the device's `subgroups` feature, lines prefixed `{{NOSG}}` only
    without it (the other prefix becomes `// `, a comment: a device without the feature rejects any subgroup
    builtin even in dead code). `{{SG_ENABLE}}` is the `enable subgroups;` directive the browser's WGSL requires
    (wgpu-native's naga refuses the directive and enables the builtins through the device feature).

    It lives here, beside the two directives, because the switches are a convention of the WGSL text shared by
    every family with a reduction (matvec, norm, softmax, sample, reduce.wgsl), not a fact of one op family.
    """
    if "subgroups" in device.info.features:
        enable = "enable subgroups;" if device.info.backend == "browser" else ""
        return {"SG_ENABLE": enable, "SG": "", "NOSG": "// "}
    return {"SG_ENABLE": "", "SG": "// ", "NOSG": ""}


# The grids of lab/format/iq_grids.py, packed for WGSL. A grid's values take few levels (IQ2's 8, 25, 43; IQ1's -1, 0,
# 1; IQ3_XXS's eight, IQ3_S's eight), so a point is stored as codes into its sorted levels, 2 bits a code for three
# levels and 3 for eight: an 8-value point (IQ2, IQ1) is 16 bits, a 4-value point (IQ3) 12, and point p is half p % 2
# of word p / 2 (value k at bits b*k.., b the code width), a quarter (IQ2, IQ1) or three eighths (IQ3) of the bytes
# of ggml's tables. The levels are bytes of two words (level c is byte c % 4 of word c / 4; IQ1's as int8), read as
# iq4_levels reads its table. quant.wgsl declares each grid as a module-scope `var<private>` initialized with this
# value and never written, and each level pair as a `const`. Why that form: quant.wgsl is included by get_rows, the
# matvecs and the GEMM and has no binding of its own, so a storage buffer or a workgroup copy would change every
# including kernel's bindings and entry point. A `const` array indexed at run time was tried first: naga copies the
# whole array into a function variable at every indexing site, and the GEMM (which inlines the dequant many times) took
# 25 s to compile on lavapipe, against 1.9 s with the private variable, which is indexed in place. Packed, and cut into
# arrays of at most GRID_PART words (NAME_GRID0, NAME_GRID1, ...), because the compile time of a kernel that indexes a
# private array grows faster than the array's length on lavapipe: a get_rows of IQ2_XXS's unpacked 512 words compiled
# in 8 s, IQ2_S's 2,048 in 70 s, IQ1S's 4,096 in more than 4 minutes; packed, IQ1S's 1,024 words in 17.5 s as one
# array, 4.5 s as four of 256, 4.0 s as eight of 128. Kernels of the other types do not pay for the unused tables.
# On the H200 (`lab bench kernels`, 14336 x 4096) the unpacked form read 0.09 TB/s in IQ2_XXS's matvec and 0.10 in
# IQ3_XXS's; packed, 0.25 and 0.20, IQ2_XS and IQ2_S 0.25-0.28, IQ3_S 0.22, but IQ1_S and IQ1_M (1,024 words) 0.04-0.05,
# as one array or four (the parts cost nothing there: IQ2_S 0.29 as one, 0.28 as two). All far under the issue's
# 1.0. So the grid types' own matvec loop (wgsl/matvec_iq.wgsl) binds ggml's unpacked table as a storage buffer instead
# (grid_bytes): on the H200 these arrays read there were 1.6-14x slower. get_rows and the GEMM still read them.
GRID_PART = 256
_GRIDS = {"IQ2XXS": (iq_grids.IQ2XXS_GRID, 8), "IQ2XS": (iq_grids.IQ2XS_GRID, 8), "IQ2S": (iq_grids.IQ2S_GRID, 8),
          "IQ3XXS": (iq_grids.IQ3XXS_GRID, 4), "IQ3S": (iq_grids.IQ3S_GRID, 4), "IQ1S": (iq_grids.IQ1S_GRID, 8)}


def _values(point: int, width: int) -> list[int]:
    """The values of a grid point (byte k = value k; int8, for IQ1's -1)."""
    return [((point >> (8 * k)) & 0xFF) - (256 if (point >> (8 * k)) & 0x80 else 0) for k in range(width)]


def packed_grid(points, width: int) -> tuple[list[int], list[int]]:
    """(levels, words): a grid's sorted distinct values and its points as codes into them, two points a u32 word
    (point p in bits 16(p % 2).., value k at bits b*k.., b = 2 bits for up to 4 levels, else 3)."""
    levels = sorted({v for p in points for v in _values(p, width)})
    b = 2 if len(levels) <= 4 else 3
    assert len(levels) <= 8 and b * width <= 16
    codes = [sum(levels.index(v) << (b * k) for k, v in enumerate(_values(p, width))) for p in points]
    return levels, [codes[i] | codes[i + 1] << 16 for i in range(0, len(codes), 2)]


@cache
def wgsl_tables() -> dict[str, str]:
    """KEY -> WGSL value, filled into every file: for each grid of lab/format/iq_grids.py, NAME_GRID (the packed points,
    `array<u32, N>(...)`), or NAME_GRID0, NAME_GRID1 ... (its parts of GRID_PART words) where it is longer, and
    NAME_LEVELS (`vec2<u32>(...)`: its levels, byte c = level c); IQ1S_DELTA (IQ1_S's and IQ1_M's offset) as a float."""
    out = {"IQ1S_DELTA": repr(iq_grids.IQ1S_DELTA)}
    for name, (points, width) in _GRIDS.items():
        levels, words = packed_grid(points, width)
        lv = [v & 0xFF for v in levels] + [0] * (8 - len(levels))
        parts = [words[i:i + GRID_PART] for i in range(0, len(words), GRID_PART)]
        for k, part in enumerate(parts):
            key = f"{name}_GRID" if len(parts) == 1 else f"{name}_GRID{k}"
            out[key] = f"array<u32, {len(part)}>(" + ", ".join(f"0x{w:x}u" for w in part) + ")"
        out[f"{name}_LEVELS"] = "vec2<u32>(" + ", ".join(
            f"0x{sum(v << (8 * k) for k, v in enumerate(lv[i:i + 4])):x}u" for i in (0, 4)) + ")"
    return out


def grid_bytes(name: str) -> bytes:
    """Grid NAME (a key of _GRIDS) as ggml lays it out, for a storage binding (wgsl/matvec_iq.wgsl's G): each point
    its 8 bytes (IQ2, IQ1), or 4 (IQ3), little-endian. No packing: a storage buffer is not compiled into the kernel,
    so its length costs no compile time."""
    points, width = _GRIDS[name]
    return struct.pack(f"<{len(points)}{'Q' if width == 8 else 'I'}", *points)


def set_dir(path) -> None:
    global _dir
    _dir = Path(path)


def wgsl_dir() -> Path:
    return _dir


def names() -> list[str]:
    return sorted(p.name for p in _dir.glob("*.wgsl"))


def source(name: str, **consts) -> str:
    """The text of wgsl/NAME.wgsl with includes pasted and every {{KEY}} filled from `consts`."""
    def fill(m: re.Match) -> str:
        key = m.group(1)
        if key not in consts and key in wgsl_tables():
            return wgsl_tables()[key]
        if key not in consts:
            raise KeyError(f"{name}: constant {{{{{key}}}}} was not given")
        value = consts[key]
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return repr(value)
        return str(value)

    text = _read(name if name.endswith(".wgsl") else name + ".wgsl", set(), lambda n: _KEY.sub(fill, n))
    return _KEY.sub(fill, text)


def _read(name: str, seen: set[str], fill_name) -> str:
    if name in seen:
        return ""
    seen.add(name)
    text = (_dir / name).read_text()
    return _INCLUDE.sub(lambda m: _read(fill_name(m.group(1)), seen, fill_name), text)


class KernelCache:
    """Pipelines cached by (file, entry, constants) and labelled with that key, so errors and
    profiles name the exact variant; and the constant tables some of them bind (`table`). The pipelines themselves
    are the device's (`Device.compiled`), shared by every cache on it."""

    def __init__(self, device) -> None:
        self.device = device
        self._cache: dict = {}
        self._tables: dict = {}     # (id(owner), label) -> Buffer (its .owner keeps that id from being reused)

    def table(self, label: str, data: bytes):
        """A storage buffer of kind CONSTANT holding `data` (a fact of a format, such as a quant grid), made once per
        owner: the device's current one (`Device.owning`), so the table lives and is freed with the buffers of
        whoever builds the ops that bind it (an engine, its probes, a kernel check), never left behind by them or
        pulled from under them. A table its owner has freed is made again."""
        owner = self.device.current_owner
        buf = self._tables.get((id(owner), label))
        if buf is not None and buf.owner is owner and buf in self.device.buffers:
            return buf
        self._tables = {k: b for k, b in self._tables.items() if b in self.device.buffers}
        buf = self.device.buffer(len(data), CONSTANT, label)
        self.device.write(buf, data)
        self._tables[(id(owner), label)] = buf
        return buf

    def get(self, name: str, entry: str = "main", **consts):
        key = (name, entry, tuple(sorted(consts.items())))
        k = self._cache.get(key)
        if k is None:
            label = f"{name}:{entry}" + "".join(f" {a}={b}" for a, b in key[2])
            k = self.device.compiled(source(name, **consts), label, entry)
            self._cache[key] = k
        return k
