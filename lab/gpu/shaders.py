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
from functools import cache
from pathlib import Path

from lab.format import iq_grids

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


# The grids of lab/format/iq_grids.py as WGSL array values of u32 words, little-endian as in memory: an 8-value point
# of IQ2's or IQ1's is words 2i (values 0-3) and 2i + 1 (values 4-7), one byte a value; an IQ3 point (4 values) word i.
# quant.wgsl declares each as a module-scope `var<private>` initialized with this value and never written. Why that
# form: quant.wgsl is included by get_rows, the matvecs and the GEMM and has no binding of its own, so a storage buffer
# or a workgroup copy would change every including kernel's bindings and entry point. A `const` array indexed at run
# time was tried first: naga copies the whole array into a function variable at every indexing site, and the GEMM
# (which inlines the dequant many times) took 25 s to compile on lavapipe, against 1.9 s with the private variable,
# which is indexed in place; a compiler can keep a read-only private array with a constant initializer as constant
# data (Mesa's nir_opt_large_constants does). Kernels of the other types do not pay for the unused tables. On the
# H200 this form is slow: IQ2_XXS's and IQ3_XXS's matvecs read 0.09-0.10 TB/s (docs/performance.md), far under the
# issue's 1.0: a storage binding or a workgroup copy of the grid is the next thing to measure.
_GRIDS = {"IQ2XXS_GRID": (iq_grids.IQ2XXS_GRID, 8), "IQ2XS_GRID": (iq_grids.IQ2XS_GRID, 8),
          "IQ2S_GRID": (iq_grids.IQ2S_GRID, 8), "IQ3XXS_GRID": (iq_grids.IQ3XXS_GRID, 4),
          "IQ3S_GRID": (iq_grids.IQ3S_GRID, 4), "IQ1S_GRID": (iq_grids.IQ1S_GRID, 8)}


@cache
def wgsl_tables() -> dict[str, str]:
    """KEY -> `array<u32, N>(...)` for each grid of lab/format/iq_grids.py."""
    out = {}
    for key, (points, width) in _GRIDS.items():
        words = [(p >> (32 * k)) & 0xFFFFFFFF for p in points for k in range(width // 4)]
        out[key] = f"array<u32, {len(words)}>(" + ", ".join(f"0x{w:x}u" for w in words) + ")"
    return out


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
    profiles name the exact variant."""

    def __init__(self, device) -> None:
        self.device = device
        self._cache: dict = {}

    def get(self, name: str, entry: str = "main", **consts):
        key = (name, entry, tuple(sorted(consts.items())))
        k = self._cache.get(key)
        if k is None:
            label = f"{name}:{entry}" + "".join(f" {a}={b}" for a, b in key[2])
            k = self.device.kernel(source(name, **consts), label, entry)
            self._cache[key] = k
        return k
