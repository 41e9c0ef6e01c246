"""Native shader modules go without naga's runtime checks (bounds, loop bounding) unless asked.

The checks halved our GEMMs' speed on the H200; dropping them must not change a single result. Each
case runs the same kernels on a device with the checks and one without, and wants the same bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.gpu.shaders import KernelCache
from lab.host.native import open_native
from lab.host.reference import quant as qo
from lab.host.reference.quant import DOT_TOL
from tests.kernels.quant_rig import Rig


@pytest.fixture(scope="module")
def checked():
    return open_native(checks=True)


def test_default_is_unchecked_and_the_environment_restores_checks(device, monkeypatch):
    assert device.shader_checks is False
    monkeypatch.setenv("LAB_SHADER_CHECKS", "1")
    assert open_native().shader_checks is True


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "F16"])
def test_same_bytes_with_and_without_checks(device, checked, name):
    cols = 3 * 256
    raw = qo.random_tensor(name, 70, cols, seed=5)
    W = qo.dequant(raw, name)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(cols).astype(np.float32)
    X = rng.standard_normal((37, cols)).astype(np.float32)
    out = []
    for dev in (device, checked):
        with Rig(dev, KernelCache(dev)) as r:
            w = r.weight(name, raw)
            out.append((r.matvec(w, x), r.matmul(w, X)))
    (y, Y), (y_checked, Y_checked) = out
    assert qo.dot_err(y, W, x) <= DOT_TOL and qo.dot_err(Y, W, X) <= DOT_TOL
    assert y.tobytes() == y_checked.tobytes() and Y.tobytes() == Y_checked.tobytes()
