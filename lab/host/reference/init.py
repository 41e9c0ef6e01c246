"""The float64 oracle of wgsl/init.wgsl (lab.ops.init): the same hash, the same uniforms (exact in f32, so exact here
too), and Box-Muller in float64. tests/kernels/test_init.py holds the kernel to it.

    normal(key, first, n, mean, std) -> float64 array of elements first .. first + n - 1
"""

from __future__ import annotations

import numpy as np

# The kernel's z = r cos(theta), r = sqrt(-2 ln u1), carries the f32 roundings of ln, sqrt and cos. Where u1 nears 1,
# ln's error is absolute (WGSL allows 2^-21 on [0.5, 2]) and r's derivative 1 / r blows it up: r moves by 2^-21 / r.
# Elsewhere a few ulp each: 1e-5 absolute on z is well above them (measured worst: tests/kernels/test_init.py prints
# it with -s) and far below what a wrong draw does (a wrong hash input, index or formula moves z by O(1)).
Z_TOL = 1e-5
LN_ABS = 2.0 ** -21


def _pcg(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint64)
    state = (v * 747796405 + 2891336453) & 0xFFFFFFFF
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & 0xFFFFFFFF
    return ((word >> 22) ^ word) & 0xFFFFFFFF


def uniforms(key: int, j: np.ndarray) -> np.ndarray:
    """The kernel's uniform of hash input j: ((hash >> 9) + 0.5) / 2^23, in (0, 1)."""
    h = _pcg(_pcg(np.array([key], np.uint64)) ^ j.astype(np.uint64))
    return ((h >> 9).astype(np.float64) + 0.5) / 2.0 ** 23


def standard(key: int, first: int, n: int) -> np.ndarray:
    e = np.arange(first, first + n, dtype=np.uint64)
    u1, u2 = uniforms(key, 2 * e), uniforms(key, 2 * e + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def z_tolerance(key: int, first: int, n: int) -> np.ndarray:
    """Each element's bound on |z - z64|: Z_TOL, plus ln's absolute error carried through r = sqrt(-2 ln u1)."""
    e = np.arange(first, first + n, dtype=np.uint64)
    r = np.sqrt(-2.0 * np.log(uniforms(key, 2 * e)))
    return Z_TOL + LN_ABS / r


def normal(key: int, first: int, n: int, mean: float = 0.0, std: float = 1.0) -> np.ndarray:
    return mean + std * standard(key, first, n)
