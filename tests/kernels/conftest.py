"""The kernel tests' shared fixtures (the native `device` is tests/conftest.py's): a pipeline cache per test module,
and the same adapter with subgroups disabled, for the shared-memory reduction path."""

from __future__ import annotations

import pytest

from lab.gpu.shaders import KernelCache
from lab.host.native import open_native


@pytest.fixture(scope="module")
def kernels(device):
    return KernelCache(device)


@pytest.fixture(scope="module")
def device_nosg():
    return open_native(disable=("subgroups",))


@pytest.fixture(scope="module")
def kernels_nosg(device_nosg):
    return KernelCache(device_nosg)
