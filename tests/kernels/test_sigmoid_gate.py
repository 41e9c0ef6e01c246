"""qwen35's attention output gate (elementwise.wgsl gate_to via lab.ops.elementwise.sigmoid_gate): att[j, :n] *=
sigmoid(gate[j, offset:offset+n]) with the gate read from its slice of the fused projection row, against numpy; and
broken variants that must fail (the gate read at the row's start, the sigmoid's sign, the stride of one row)."""

import asyncio

import numpy as np
import pytest

from lab import gpu, ops
from lab.gpu import shaders
from lab.gpu.shaders import KernelCache
from lab.host.reference.ops import sigmoid
from lab.ops import elementwise

N, WIDTH, OFFSET = 300, 900, 520        # n gated values of rows WIDTH wide, the gate at OFFSET (not a multiple of WG)
TOL = 4e-7                              # relative to |att|: exp's few ulps and one division, then one product


class Broken(KernelCache):
    def __init__(self, device, old, new) -> None:
        super().__init__(device)
        self.old, self.new = old, new

    def get(self, name, entry="main", **consts):
        key = ("broken", name, entry, tuple(sorted(consts.items())))
        if key not in self._cache:
            src = shaders.source(name, **consts)
            assert self.old in src, f"trap text {self.old!r} not found"
            self._cache[key] = self.device.kernel(src.replace(self.old, self.new), f"{name}:{entry} (broken)", entry)
        return self._cache[key]


def gate_error(device, kernels, t: int = 7) -> float:
    rng = np.random.default_rng(t)
    att = rng.standard_normal((t, N)).astype(np.float32)
    row = (rng.standard_normal((t, WIDTH)) * 4).astype(np.float32)
    row[0, OFFSET:OFFSET + 3] = [100.0, -100.0, 0.0]                 # saturating gates stay finite
    a = device.buffer(att.nbytes, gpu.CONVERSATION, "gate.att")
    g = device.buffer(row.nbytes, gpu.CONVERSATION, "gate.row")
    device.write(a, att.tobytes())
    device.write(g, row.tobytes())
    step = ops.make_step(device)
    op_list = elementwise.sigmoid_gate(device, kernels, a, g, step, N, WIDTH, OFFSET)
    device.run(ops.dispatches(op_list, t), [(step, 0, ops.step_bytes(5, t, 64))])
    got = np.frombuffer(asyncio.run(device.read(a, 0, att.nbytes)), np.float32).reshape(t, N)
    want = att.astype(np.float64) * sigmoid(row[:, OFFSET:OFFSET + N].astype(np.float64))
    assert np.all(np.isfinite(got))
    return float(np.abs(got - want).max() / np.abs(att).max())


def test_sigmoid_gate_matches_numpy(device, kernels):
    assert gate_error(device, kernels) <= TOL
    assert gate_error(device, kernels, t=1) <= TOL


@pytest.mark.parametrize("old,new", [
    ("r[j * pc._p0 + pc._p1 + c]", "r[j * pc._p0 + c]"),          # the gate read at the row's start
    ("exp(-r[j * pc._p0 + pc._p1 + c])", "exp(r[j * pc._p0 + pc._p1 + c])"),     # sigmoid's sign
    ("r[j * pc._p0 + pc._p1 + c]", "r[j * pc.n + pc._p1 + c]"),    # rows of n, not of the fused row's stride
])
def test_broken_gate_fails(device, old, new):
    assert gate_error(device, Broken(device, old, new)) > 100 * TOL
