"""LFM2's short-conv kernel (wgsl/shortconv.wgsl via lab.ops.shortconv) against a numpy oracle written here, loop by
loop, apart from the reference forward's: a conversation's steps (a prefill chunk from position 0 over a state full of
stale values, decode steps, a chunk longer than the ring, a step again from positions back), each step's C * conv and
the ring of B*x rows it leaves; and broken variants that must fail (the state read one position off, the taps
reversed, the state not written, C applied before the conv instead of after it)."""

from __future__ import annotations

import numpy as np
import pytest
from checks import env1, free, read, upload  # noqa: F401  (fixtures)

from lab.gpu import shaders
from lab.gpu.shaders import KernelCache
from lab.ops import make_step, step_bytes
from lab.ops.shortconv import shortconv

N = 200                 # channels: not a multiple of the workgroup
L = 3                   # l_cache of every LFM2 release
RING = L - 1 + 6        # the ring: 6 positions of rewind
TOL = 1e-6              # relative to the largest |y|: 3 products summed in the kernel's order, then one product


class Oracle:
    """The conv over a conversation's whole history of B*x, one position at a time (no state: the history itself)."""

    def __init__(self, w: np.ndarray) -> None:
        self.w = w.astype(np.float64)       # [N, L]
        self.bx: list[np.ndarray] = []      # bx of positions 0, 1, ...
        self.slots: dict[int, int] = {}     # ring row -> the position last written there

    def step(self, bcx: np.ndarray, pos: int) -> np.ndarray:
        del self.bx[pos:]                   # stepping from `pos` replaces what came after it
        b, c, x = (bcx[:, k * N:(k + 1) * N].astype(np.float64) for k in range(3))
        out = []
        for j in range(len(bcx)):
            self.bx.append(b[j] * x[j])
            q = pos + j
            acc = np.zeros(N)
            for i in range(L):
                src = q - (L - 1) + i
                acc += self.w[:, i] * (self.bx[src] if src >= 0 else 0.0)
            out.append(c[j] * acc)
        for q in range(max(pos, pos + len(bcx) - RING), pos + len(bcx)):
            self.slots[q % RING] = q
        return np.array(out)

    def ring(self) -> dict[int, np.ndarray]:
        """{ring row: bx} the ring must hold: each row's last written position, where it is one of the history's (a
        row last written past a step back holds a position the conversation no longer has)."""
        return {row: self.bx[q] for row, q in self.slots.items() if q < len(self.bx)}


class Broken(KernelCache):
    """shortconv.wgsl with each (old, new) replaced; refuses a substitution whose text is missing."""

    def __init__(self, device, subs) -> None:
        super().__init__(device)
        self.subs = subs

    def get(self, name, entry="main", **consts):
        key = ("broken", name, entry, tuple(sorted(consts.items())))
        if key not in self._cache:
            src = shaders.source(name, **consts)
            for old, new in self.subs:
                assert old in src, f"trap text {old!r} not found"
                src = src.replace(old, new)
            self._cache[key] = self.device.kernel(src, f"{name}:{entry} (broken)", entry)
        return self._cache[key]


def converse(device, kernels, seed: int = 0) -> None:
    """Steps of a conversation through one state buffer; raises AssertionError at the first wrong output or ring."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, L)).astype(np.float32)
    oracle = Oracle(w)
    t_max = 40
    bcx_b = upload(device, np.zeros((t_max, 3 * N), np.float32))
    w_b = upload(device, w)
    # stale values from an earlier conversation: a step at position 0 must read none of them
    state_b = upload(device, rng.standard_normal((RING, N)).astype(np.float32) * 100)
    y_b = upload(device, np.zeros((t_max, N), np.float32))
    step_b = make_step(device, "test.shortconv step")
    ops = shortconv(device, kernels, bcx_b, w_b, state_b, y_b, step_b, n=N, l_cache=L, ring=RING)
    # (pos, t): a prefill chunk, decode steps, a chunk longer than the ring, a step 6 positions back, one from 0 again
    plan = [(0, 5), (5, 1), (6, 1), (7, 25), (32, 1), (27, 4), (31, 1), (0, 3), (3, 1)]
    for pos, t in plan:
        bcx = rng.standard_normal((t, 3 * N)).astype(np.float32)
        device.write(bcx_b, bcx.tobytes())
        device.run([op.at(t) for op in ops], writes=[(step_b, 0, step_bytes(pos, t, 128))])
        want = oracle.step(bcx, pos)
        got = read(device, y_b).reshape(t_max, N)[:t]
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= TOL, f"step at {pos} of {t}: y error {err:.3g}"
        ring = read(device, state_b).reshape(RING, N)
        for row, bx in oracle.ring().items():
            assert np.allclose(ring[row], bx, rtol=1e-6, atol=0), f"step at {pos} of {t}: ring row {row} is wrong"
    free(device, bcx_b, w_b, state_b, y_b, step_b)


def test_shortconv_matches_the_oracle(env1):  # noqa: F811
    converse(env1.device, env1.kernels)


@pytest.mark.parametrize("what,subs", [
    ("the state read one position off", [("state[((pos - back) % RING)", "state[((pos - back + 1u) % RING)")]),
    ("the taps reversed", [("taps[i] = w[c * LC + i]", "taps[i] = w[c * LC + (LC - 1u - i)]")]),
    ("the state not written", [("if (j + RING >= t) {", "if (false) {")]),
    ("C applied before the conv", [("let bx = bcx[row + c] * bcx[row + 2u * p.n + c];",
                                    "let bx = bcx[row + c] * bcx[row + p.n + c] * bcx[row + 2u * p.n + c];"),
                                   ("y[j * p.n + c] = bcx[row + p.n + c] * acc;", "y[j * p.n + c] = acc;")]),
    ("only the last l_cache - 1 rows kept (no ring)", [("if (j + RING >= t) {", "if (j + LC - 1u >= t) {")]),
])
def test_broken_shortconv_fails(env1, what, subs):  # noqa: F811
    with pytest.raises(AssertionError, match="error|ring row"):
        converse(env1.device, Broken(env1.device, subs))


def test_arguments_are_checked(env1):  # noqa: F811
    dev = env1.device
    b = upload(dev, np.zeros(4 * N * 3, np.float32))
    small = upload(dev, np.zeros(N, np.float32))
    step_b = make_step(dev, "test.shortconv step")
    with pytest.raises(ValueError, match="ring"):
        shortconv(dev, env1.kernels, b, b, b, small, step_b, n=N, l_cache=L, ring=L - 2)
    with pytest.raises(ValueError, match="state holds"):
        shortconv(dev, env1.kernels, b, b, small, small, step_b, n=N, l_cache=L, ring=RING)
    with pytest.raises(ValueError, match="own"):
        shortconv(dev, env1.kernels, b, b, b, b, step_b, n=N, l_cache=L, ring=L - 1)
    free(dev, b, small, step_b)
