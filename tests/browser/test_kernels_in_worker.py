"""Both backends run the same WGSL: the kernel cases of lab/host/reference/kernel_cases.py run inside the browser worker
(Chromium, SwiftShader WebGPU) and natively (wgpu-py on lavapipe), both through lab/instruments/kernelcheck.py, i.e.
through the engine's own op builders, and both are compared with the same expected values and tolerances as
tests/kernels.

Expected values come from the float64 references in lab/host/reference (kernels.py, quant.py: weights dequantized by
gguf.quants, attention.py). Every tolerance is the native test's, restated with its reason in kernel_cases.py, and
holds in the browser as it is: RoPE computes its own sin/cos (wgsl/rope.wgsl), since SwiftShader's builtins were
measured off by up to 1.9e-4, within the 2^-11 that WGSL allows.

Path: SwiftShader in Chromium offers `subgroups`, so the reduction kernels (matvec, RMSNorm, softmax, argmax,
top-k) run their subgroup path in the browser (`SG_ENABLE=enable subgroups;` in their labels); natively on
lavapipe too. test_reduction_path checks the kernel labels against the adapter's features and prints the path.

The cards' page serves the module; the cases go to the worker a few per message (`window.labKernelCheck`). Every case
runs with --slow; by default the reduction cases only (their path per adapter), since the verification card runs all of
them in the worker against the same float64 values (reference/kernels.json, from the same cases), held by
tests/browser/test_verify_page.py, and one case of each backward family (make_backward_cases: not the card's).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import sys

import pytest

from lab.gpu.shaders import KernelCache
from lab.host.reference.kernel_cases import I8_CASES, make_backward_cases, make_cases
from lab.instruments import kernelcheck

PER_MESSAGE = 6                   # cases per worker message
CASES = {c.name: c for c in make_cases() + make_backward_cases()}
# The backward kernels' cases are not the verification card's (reference/kernels.json holds the forward ones), so
# nothing else runs them in the worker by default: one case of each family does here, the rest with --slow.
BACKWARD_DEFAULT = ["rms_norm_back_n432_group72", "glu_back_geglu", "softcap_back_from_x", "embed_back_50x200_scaled",
                    "dx_back_Q4_K_t13", "lora_back_131x200_r5_t13", "shortconv_back_t13_n200_l3",
                    "rope_back_neox_pos300_rot32of80_factors",
                    "attention_back_gqa3_t13_pos7_hd80_cap3", "attention_back_gqa3_t70_pos30_hd64_window20_cap3_tiles",
                    "head_ce_Q4_K_v1000_c256_t3_cap4",
                    "optimizer_adamw_n10007_t700", "optimizer_sgd_n10007_t3"]
# the reduction kernels' cases: two matvecs (the rest differ in their loops, not their reduction), RMSNorm, softmax,
# argmax and top-k
REDUCTIONS = ["matvec_F32", "matvec_Q4_K"] + [n for n in CASES
                                              if n.split("_")[0] in ("rms", "softmax", "argmax", "top")]


# ------------------------------------------------------------------------------------------------ runs
def _encoded(spec: dict) -> dict:
    """JSON for the page: bytes in base64, and no None (JS null does not come back to Python as None)."""
    return {**{k: v for k, v in spec.items() if v is not None},
            "inputs": {k: base64.b64encode(v).decode() for k, v in spec["inputs"].items()}}


@pytest.fixture(scope="module")
def worker_page(card_page):
    """The cards' page (tests/browser/conftest.py `card_page`): the checks need a booted worker, no model; its console
    from here on."""
    card_page.console.clear()
    return card_page.page, card_page.console


def _in_worker(page, names: list[str]) -> dict:
    """name -> {"outputs", "kernels"} from the browser worker for the cases `names`, plus "adapter": its summary."""
    results: dict = {}
    for i in range(0, len(names), PER_MESSAGE):
        batch = names[i:i + PER_MESSAGE]
        reply = page.evaluate("cases => window.labKernelCheck(cases)", [_encoded(CASES[n].spec) for n in batch])
        assert reply["buffers"]["after"] == reply["buffers"]["before"], "the worker's checks left buffers behind"
        for name, r in zip(batch, reply["results"]):
            results[name] = {"outputs": {k: base64.b64decode(v) for k, v in r["outputs"].items()},
                             "kernels": r["kernels"]}
        results["adapter"] = reply["adapter"]
    return results


def _native(device, names: list[str]) -> dict:
    """name -> {"outputs", "kernels"} from the native device, through the same lab/instruments/kernelcheck.py."""
    kernels = KernelCache(device)

    async def run_all():
        return {name: await kernelcheck.run(device, kernels, CASES[name].spec) for name in names}

    # Playwright's sync API keeps an event loop running in this thread: run the native device in another.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        device.staging(0)       # the device's one read-back buffer, made at its first read: not kernelcheck's
        before = len(device.buffers)
        results = pool.submit(asyncio.run, run_all()).result()
    assert len(device.buffers) == before, "kernelcheck left buffers behind"
    return results


@pytest.fixture(scope="module")
def in_worker(worker_page) -> dict:
    return _in_worker(worker_page[0], list(CASES))


@pytest.fixture(scope="module")
def native(device) -> dict:
    return _native(device, list(CASES))


@pytest.fixture(scope="module")
def backward_default(worker_page, device) -> tuple[dict, dict]:
    """The default backward cases (one a family), in the worker and natively."""
    return _in_worker(worker_page[0], BACKWARD_DEFAULT), _native(device, BACKWARD_DEFAULT)


@pytest.fixture(scope="module")
def reductions(worker_page, device) -> tuple[dict, dict]:
    """The reduction families' cases (matvec, RMSNorm, softmax, argmax and top-k), in the worker and natively."""
    return _in_worker(worker_page[0], REDUCTIONS), _native(device, REDUCTIONS)


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.slow   # the verification card runs these same cases against the same float64 values in the worker, by
@pytest.mark.parametrize("name", list(CASES))       # default (tests/browser/test_verify_page.py test_card_on_a_hybrid)
def test_case(name, in_worker, native):
    _check(name, in_worker, native)


@pytest.mark.parametrize("name", BACKWARD_DEFAULT)
def test_backward_case(name, backward_default):
    _check(name, *backward_default)


def _check(name: str, in_worker: dict, native: dict) -> None:
    case = CASES[name]
    b_err, tol = case.check(in_worker[name]["outputs"])
    n_err, _ = case.check(native[name]["outputs"])
    print(f"{name}: browser {b_err:.3g}, native {n_err:.3g} (tolerance {tol:.3g})", file=sys.stderr)
    assert b_err <= tol, f"{name} in the browser worker: error {b_err:.3g} > tolerance {tol:.3g}"
    assert n_err <= tol, f"{name} natively: error {n_err:.3g} > tolerance {tol:.3g}"
    assert in_worker[name]["kernels"] and len(in_worker[name]["kernels"]) == len(native[name]["kernels"])


def test_reduction_path(reductions, device, worker_page):
    """The reduction kernels were built for the path each adapter's features give: subgroups or the fallback."""
    in_worker, native = reductions
    adapter = in_worker["adapter"]
    paths = {"browser": "subgroups" in adapter["features"], "native": "subgroups" in device.info.features}
    print(f"browser adapter {adapter['name']!r}: {'subgroup' if paths['browser'] else 'fallback'} path; native "
          f"{device.info.name!r}: {'subgroup' if paths['native'] else 'fallback'} path", file=sys.stderr)
    for where, results in (("browser", in_worker), ("native", native)):
        labels = [k for n in results if n != "adapter" for k in results[n]["kernels"]
                  if k.split(":")[0] in ("matvec", "norm", "softmax", "sample")]
        assert len(labels) >= 5
        for label in labels:     # the SG lines are live (switch empty) exactly on the subgroup path
            assert (" SG= " in label) == paths[where], f"{where}: {label}"
            if where == "browser" and paths[where]:
                assert "SG_ENABLE=enable subgroups;" in label, label
    assert [t for k, t in worker_page[1] if k == "error"] == []


# ------------------------------------------------------------------------------------------------ tensor cores
# The int8 GEMM (wgsl/matmul_i8.wgsl) runs only where the adapter has Chromium's int8 subgroup matrices
# (AdapterInfo.int8_matrix: the H200 page, not SwiftShader or the native backend), so these cases run in the worker
# alone (natively, tests/kernels/test_matmul_i8.py runs them with the matrix products written out in plain WGSL).
# The cases and their checks: lab/host/reference/kernel_cases.py (I8_CASES).


@pytest.fixture(scope="module")
def i8_in_worker(worker_page, reductions) -> dict:
    adapter = reductions[0]["adapter"]
    if not adapter.get("int8_matrix"):
        pytest.skip(f"{adapter['name']}: no int8 subgroup matrices (the H200 page has them)")
    page, _ = worker_page
    reply = page.evaluate("cases => window.labKernelCheck(cases)", [_encoded(c.spec) for c in I8_CASES.values()])
    assert reply["buffers"]["after"] == reply["buffers"]["before"], "the worker's checks left buffers behind"
    return {name: {k: base64.b64decode(v) for k, v in r["outputs"].items()}
            for name, r in zip(I8_CASES, reply["results"])}


@pytest.mark.parametrize("name", list(I8_CASES))
def test_int8_matrix_case(name, i8_in_worker):
    err, tol = I8_CASES[name].check(i8_in_worker[name])
    print(f"{name}: browser {err:.3g} (tolerance {tol:.3g})", file=sys.stderr)
    assert err <= tol, f"{name} in the browser worker: error {err:.3g} > tolerance {tol:.3g}"
