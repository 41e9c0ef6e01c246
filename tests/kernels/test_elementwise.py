"""Elementwise ops (wgsl/elementwise.wgsl) against numpy: add / mul / scale / fill_zero through the tests' own
builders (elementwise_ops.py), the bias add and last-row copy through lab.ops.elementwise."""

import asyncio

import pytest
from checks import check_elementwise, check_fill_zero, env1  # noqa: F401


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("where", ["out", "a", "b"])
def test_binary(env1, op, where):  # noqa: F811
    check_elementwise(env1, op, where, t=5, pos=7, n=1000)


def test_scale(env1):  # noqa: F811
    check_elementwise(env1, "scale", t=5, pos=7, n=1000)


def test_fill_zero_small(env1):  # noqa: F811
    grids = check_fill_zero(env1, 1001)
    assert grids == [(4, 1, 1)]


def test_fill_zero_folds_past_65535_groups(env1):  # noqa: F811
    n = 65535 * 64 + 1000            # 4.2M words with 64-wide groups: more than 65535 groups in x
    grids = check_fill_zero(env1, n, wg=64)
    assert grids[0][1] == 2


def test_fill_zero_slices_past_binding_limit(env1, monkeypatch):  # noqa: F811
    monkeypatch.setitem(env1.device.info.limits, "max_storage_buffer_binding_size", 1 << 16)
    grids = check_fill_zero(env1, 50_000)   # 200 kB over 64 kB bindings: four slices
    assert len(grids) == 4


def test_selftest_scale_add_unchanged(env1):  # noqa: F811
    from lab.instruments import selftest
    r = asyncio.run(selftest.run(env1.device))
    assert r["ok"], r


def test_bias_into_a_slice_of_fused_rows(env1):  # noqa: F811
    # qwen2's K bias added into columns [q, q+kv) of a fused [t, q+2kv] row; other columns untouched.
    import numpy as np
    from checks import ops_step, read, run, upload

    from lab.ops.elementwise import add_bias
    rng = np.random.default_rng(3)
    t, width, off, n = 5, 40, 24, 8
    x = rng.standard_normal((7, width)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    bx, bb = upload(env1.device, x), upload(env1.device, b)
    run(env1, add_bias(env1.device, env1.kernels, bx, bb, ops_step(env1), n, stride=width, offset=off), pos=3, t=t)
    want = x.copy()
    want[:t, off:off + n] += b
    assert np.array_equal(read(env1.device, bx).reshape(7, width), want)   # one f32 add: exact


def test_last_row_follows_the_step(env1):  # noqa: F811
    import numpy as np
    from checks import ops_step, read, run, upload

    from lab.ops.elementwise import last_row
    rng = np.random.default_rng(4)
    n = 300
    x = rng.standard_normal((9, n)).astype(np.float32)
    bx, out = upload(env1.device, x), upload(env1.device, np.zeros(n, np.float32))
    ops = last_row(env1.device, env1.kernels, bx, out, ops_step(env1), n)
    for t in (1, 6, 9):
        run(env1, ops, pos=0, t=t)
        assert np.array_equal(read(env1.device, out), x[t - 1])
