"""wgsl/matmul_i8.wgsl natively, with its tensor-core products written out in plain WGSL (tests/kernels/i8_plain.py).

The int8 GEMM runs only where Chromium offers int8 subgroup matrices (the H200 page, where
tests/browser/test_kernels_in_worker.py runs these same cases). Here everything but the matrix products runs as the
page runs it: each type's unpack to int8 (the 256-value types' blocks of 32, Q6_K's and Q3_K's halves), the double
buffers, the per-block scaling. So a wrong byte offset, nibble, scale or half shows up here on lavapipe, against
lab/host/reference/kernel_cases.py's I8_CASES and their tolerance; what only the tensor cores can get wrong stays the page's.
"""

from __future__ import annotations

import asyncio

import pytest

from lab.host.reference.kernel_cases import I8_CASES
from lab.instruments import kernelcheck
from lab.ops.matmul import I8_TYPES
from tests.kernels.i8_plain import PlainKernels, int8_adapter


@pytest.fixture(scope="module")
def outputs(device):
    """Every case's outputs, on an adapter that says it has int8 matrices (matmul_i8's gate)."""
    with int8_adapter(device):
        kernels = PlainKernels(device)
        return {name: asyncio.run(kernelcheck.run(device, kernels, c.spec)) for name, c in I8_CASES.items()}


@pytest.mark.parametrize("name", list(I8_CASES))
def test_int8_gemm_case(name, outputs):
    out = outputs[name]
    assert all(label.startswith(("matmul_i8 plain", "q8_rows")) for label in out["kernels"]), out["kernels"]
    err, tol = I8_CASES[name].check(out["outputs"])
    assert err <= tol, f"{name}: error {err:.3g} > tolerance {tol:.3g}"


def test_every_type_has_a_case():
    assert {c.spec["type"] for c in I8_CASES.values()} == set(I8_TYPES)
