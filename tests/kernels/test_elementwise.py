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


def _check_copy(env, kernels):
    import numpy as np
    from checks import ops_step, read, run, upload

    from lab.ops.elementwise import copy_rows
    rng = np.random.default_rng(5)
    n, src_off, dst_off = 67, 3 * 67, 2 * 67 + 5          # training's saved rows: layer slots at offsets
    src = rng.standard_normal(12 * n).astype(np.float32)
    dst = np.full(20 * n, 7.0, np.float32)
    bs, bd = upload(env.device, src), upload(env.device, dst)
    run(env, copy_rows(env.device, kernels, bs, bd, ops_step(env), n, src_offset=src_off, dst_offset=dst_off),
        pos=0, t=5)
    want = dst.copy()
    want[dst_off:dst_off + 5 * n] = src[src_off:src_off + 5 * n]
    return np.array_equal(read(env.device, bd), want)       # a copy: exact, and nothing past the step's rows


def test_copy_rows_at_offsets(env1):  # noqa: F811
    assert _check_copy(env1, env1.kernels)


def test_copy_rows_broken_fails(env1):  # noqa: F811
    from checks import patched
    broken = patched(env1, "elementwise", "r[pc._p1 + i]; }", "r[i]; }")     # the source offset ignored
    assert not _check_copy(env1, broken.kernels)


def test_copy_rows_refuses_short_buffers(env1):  # noqa: F811
    import numpy as np
    from checks import ops_step, upload

    from lab.ops.elementwise import copy_rows
    a, b = upload(env1.device, np.zeros(10, np.float32)), upload(env1.device, np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="no row of 8 floats at 5"):
        copy_rows(env1.device, env1.kernels, a, b, ops_step(env1), 8, dst_offset=5)
    with pytest.raises(ValueError, match="two buffers"):
        copy_rows(env1.device, env1.kernels, a, a, ops_step(env1), 8)
