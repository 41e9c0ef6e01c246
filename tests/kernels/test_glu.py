"""SwiGLU / GeGLU (wgsl/glu.wgsl via lab.ops.glu) against numpy, separate and fused [gate | up] inputs."""

import pytest
from checks import check_glu, env1  # noqa: F401


@pytest.mark.parametrize("act", ["swiglu", "geglu"])
@pytest.mark.parametrize("fused", [False, True])
def test_glu(env1, act, fused):  # noqa: F811
    check_glu(env1, act, fused, t=5, pos=7, n=300)


@pytest.mark.parametrize("act", ["swiglu", "geglu"])
def test_large_gate_finite(env1, act):  # noqa: F811
    # |gate| up to ~400: exp(-g) overflows in silu and tanh's argument reaches 1e6 in gelu.
    check_glu(env1, act, True, t=3, pos=0, n=257, amp=100.0)


def test_out_must_differ(env1):  # noqa: F811
    import numpy as np
    from checks import upload

    from lab.ops.glu import glu
    b = upload(env1.device, np.zeros(8, np.float32))
    with pytest.raises(ValueError):
        glu(env1.device, env1.kernels, b, None, b, None, 4)
