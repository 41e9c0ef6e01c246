"""The final logit soft-cap (elementwise.wgsl softcap_to, gemma2): x = c * tanh(x / c) in place, over one row
per token of the step or over a fixed number of rows, against numpy."""

import asyncio

import numpy as np
import pytest

from lab import gpu, ops
from lab.ops import elementwise


@pytest.mark.parametrize("rows,t", [(0, 5), (1, 5), (0, 1)])
def test_softcap_rows(device, kernels, rows, t):
    n, cap = 1000, 3.0
    rng = np.random.default_rng(rows * 10 + t)
    x = (rng.standard_normal((t, n)) * 8).astype(np.float32)     # well past the cap: tanh saturates
    x[0, :4] = [1e30, -1e30, 0.0, 1e-3]                           # huge arguments stay finite (clamped)
    buf = device.buffer(x.nbytes, gpu.CONVERSATION, "softcap.x")
    device.write(buf, x.tobytes())
    step = ops.make_step(device)
    op_list = elementwise.softcap(device, kernels, buf, step, n, cap, rows=rows)
    device.run(ops.dispatches(op_list, t), [(step, 0, ops.step_bytes(0, t, 64))])
    got = np.frombuffer(asyncio.run(device.read(buf, 0, x.nbytes)), np.float32).reshape(t, n)
    done = t if rows == 0 else rows
    want = x.copy()
    want[:done] = cap * np.tanh(x[:done].astype(np.float64) / cap)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * cap)   # tanh in f32: a few ulps of cap
    assert np.array_equal(got[done:], x[done:])                         # rows past the count untouched
