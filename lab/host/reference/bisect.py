"""Find the first traced tensor where the GPU engine departs from the numpy reference.

    from lab.host.reference import Reference
    from lab.host.reference.bisect import bisect
    ref = Reference(path); ref.forward(ids, trace=True)
    gpu_trace = ...                     # same names, same shapes (see lab/host/reference/forward.py)
    hit = bisect(ref.trace, gpu_trace, ref.trace_order, tol=1e-2)
    if hit: print(hit)                  # ('attn_out-3', 0.04)

The error of one tensor is max|a - b| / max|ref|: relative to the tensor's own scale, so one
tolerance fits embeddings, probabilities and logits alike. Names missing from the GPU trace are
skipped (an engine may record a subset); a shape mismatch counts as an infinite error.

As a script it compares two saved traces (.npz, one array per name):
    python -m lab.host.reference.bisect ref.npz gpu.npz [--tol 0.01] [--all]
order = the reference file's key order (np.savez keeps insertion order: save `ref.trace` as is).
"""

from __future__ import annotations

import sys

import numpy as np


def rel_error(ref: np.ndarray, got: np.ndarray) -> float:
    a = np.asarray(ref, dtype=np.float64)
    b = np.asarray(got, dtype=np.float64)
    if a.shape != b.shape:
        if a.size == b.size:
            b = b.reshape(a.shape)
        else:
            return float("inf")
    if a.size == 0:
        return 0.0
    d = np.abs(a - b)
    if not np.all(np.isfinite(b)):
        return float("inf")
    scale = float(np.max(np.abs(a)))
    diff = float(np.max(d))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def errors(ref_trace: dict, gpu_trace: dict, order: list[str]) -> list[tuple[str, float]]:
    """(name, relative error) for every name in `order` that both traces hold."""
    return [(n, rel_error(ref_trace[n], gpu_trace[n])) for n in order if n in ref_trace and n in gpu_trace]


def bisect(ref_trace: dict, gpu_trace: dict, order: list[str], tol: float = 1e-2) -> tuple[str, float] | None:
    """The first name in `order` whose relative error exceeds tol, with that error; None if all pass.

    Named for what it is used for: the first divergence in a forward pass is the bug, everything
    after it inherits the error. The scan is linear (tensors are cheap to compare)."""
    for name in order:
        if name in ref_trace and name in gpu_trace:
            e = rel_error(ref_trace[name], gpu_trace[name])
            if not e <= tol:
                return name, e
    return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lab.host.reference.bisect", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref", help="reference trace .npz")
    ap.add_argument("gpu", help="GPU trace .npz")
    ap.add_argument("--tol", type=float, default=1e-2)
    ap.add_argument("--all", action="store_true", help="print every tensor's error")
    a = ap.parse_args(argv)
    ref = np.load(a.ref)
    gpu = np.load(a.gpu)
    order = list(ref.files)
    if a.all:
        for n, e in errors(ref, gpu, order):
            print(f"{e:10.3e}  {'FAIL' if not e <= a.tol else 'ok  '}  {n}")
    hit = bisect(ref, gpu, order, a.tol)
    if hit is None:
        print(f"all {len([n for n in order if n in gpu.files])} shared tensors within {a.tol}")
        return 0
    print(f"first divergence: {hit[0]}  relative error {hit[1]:.3e} > {a.tol}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
