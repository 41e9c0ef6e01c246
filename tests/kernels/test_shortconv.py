"""The depthwise causal conv kernel (wgsl/shortconv.wgsl via lab.ops.shortconv) in both modes against a numpy oracle
written here, loop by loop, apart from the reference forward's: a conversation's steps (a prefill chunk from position
0 over a state full of stale values, decode steps, a chunk longer than the ring, a step again from positions back),
each step's output and the ring of conv inputs it leaves. Mode "gated" is LFM2's C * conv(B * x); mode "silu" is
Qwen3.5's silu(conv(x)) over the first n floats of rows wider than n. Broken variants must fail: the state read one
position off, the taps reversed, the state not written, C applied before the conv instead of after it, the silu
missing, the silu mode's rows read at n floats instead of their stride."""

from __future__ import annotations

import numpy as np
import pytest
from checks import env1, free, read, upload  # noqa: F401  (fixtures)

from lab.gpu import shaders
from lab.gpu.shaders import KernelCache
from lab.host.reference.ops import silu
from lab.ops import make_step, step_bytes
from lab.ops.shortconv import shortconv

N = 200                 # channels: not a multiple of the workgroup
L = 3                   # l_cache of every LFM2 release
RING = L - 1 + 6        # the ring: 6 positions of rewind
STRIDE = N + 37         # silu mode: the x channels, then floats the conv must not read (Qwen3.5's z, beta, alpha)
L_SILU = 4              # ssm.conv_kernel of every Qwen3.5 release
# relative to the largest |y|: gated, L products summed in the kernel's order, then one product; silu, the same sum,
# then silu's exp (within 3 + 2|x| ulp on Vulkan, |x| < ~10 here) and a division: a few ulp more. Measured on lavapipe
# over this conversation: 1.2e-7 (gated), 1.3e-7 (silu); the broken variants move it by 1 or more.
TOL = {"gated": 1e-6, "silu": 2e-6}


class Oracle:
    """The conv over a conversation's whole history of conv inputs u (B*x, or x), one position at a time (no state:
    the history itself)."""

    def __init__(self, w: np.ndarray, mode: str, ring: int) -> None:
        self.w = w.astype(np.float64)       # [N, L]
        self.mode, self.ring_rows = mode, ring
        self.u: list[np.ndarray] = []       # u of positions 0, 1, ...
        self.slots: dict[int, int] = {}     # ring row -> the position last written there

    def step(self, rows: np.ndarray, pos: int) -> np.ndarray:
        del self.u[pos:]                    # stepping from `pos` replaces what came after it
        taps = self.w.shape[1]
        rows = rows.astype(np.float64)
        if self.mode == "gated":
            b, c, x = (rows[:, k * N:(k + 1) * N] for k in range(3))
            u = b * x
        else:
            u = rows[:, :N]
        out = []
        for j in range(len(rows)):
            self.u.append(u[j])
            q = pos + j
            acc = np.zeros(N)
            for i in range(taps):
                src = q - (taps - 1) + i
                acc += self.w[:, i] * (self.u[src] if src >= 0 else 0.0)
            out.append(c[j] * acc if self.mode == "gated" else silu(acc))
        for q in range(max(pos, pos + len(rows) - self.ring_rows), pos + len(rows)):
            self.slots[q % self.ring_rows] = q
        return np.array(out)

    def ring(self) -> dict[int, np.ndarray]:
        """{ring row: u} the ring must hold: each row's last written position, where it is one of the history's (a
        row last written past a step back holds a position the conversation no longer has)."""
        return {row: self.u[q] for row, q in self.slots.items() if q < len(self.u)}


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


def converse(device, kernels, mode: str = "gated", seed: int = 0) -> None:
    """Steps of a conversation through one state buffer; raises AssertionError at the first wrong output or ring."""
    rng = np.random.default_rng(seed)
    taps = L if mode == "gated" else L_SILU
    ring = taps - 1 + 6
    width = 3 * N if mode == "gated" else STRIDE
    w = rng.standard_normal((N, taps)).astype(np.float32)
    oracle = Oracle(w, mode, ring)
    t_max = 40
    src_b = upload(device, np.zeros((t_max, width), np.float32))
    w_b = upload(device, w)
    # stale values from an earlier conversation: a step at position 0 must read none of them
    state_b = upload(device, rng.standard_normal((ring, N)).astype(np.float32) * 100)
    y_b = upload(device, np.zeros((t_max, N), np.float32))
    step_b = make_step(device, "test.shortconv step")
    ops = shortconv(device, kernels, src_b, w_b, state_b, y_b, step_b, n=N, l_cache=taps, ring=ring, mode=mode,
                    stride=None if mode == "gated" else STRIDE)
    # (pos, t): a prefill chunk, decode steps, a chunk longer than the ring, a step 6 positions back, one from 0 again
    plan = [(0, 5), (5, 1), (6, 1), (7, 25), (32, 1), (27, 4), (31, 1), (0, 3), (3, 1)]
    for pos, t in plan:
        rows = rng.standard_normal((t, width)).astype(np.float32)
        device.write(src_b, rows.tobytes())
        device.run([op.at(t) for op in ops], writes=[(step_b, 0, step_bytes(pos, t, 128))])
        want = oracle.step(rows, pos)
        got = read(device, y_b).reshape(t_max, N)[:t]
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= TOL[mode], f"step at {pos} of {t}: y error {err:.3g}"
        state = read(device, state_b).reshape(ring, N)
        for row, u in oracle.ring().items():
            assert np.allclose(state[row], u, rtol=1e-6, atol=0), f"step at {pos} of {t}: ring row {row} is wrong"
    free(device, src_b, w_b, state_b, y_b, step_b)


@pytest.mark.parametrize("mode", ["gated", "silu"])
def test_shortconv_matches_the_oracle(env1, mode):  # noqa: F811
    converse(env1.device, env1.kernels, mode)


STATE_OFF = ("state[((pos - back) % RING)", "state[((pos - back + 1u) % RING)")


@pytest.mark.parametrize("mode,what,subs", [
    ("gated", "the state read one position off", [STATE_OFF]),
    ("gated", "the taps reversed", [("taps[i] = w[c * LC + i]", "taps[i] = w[c * LC + (LC - 1u - i)]")]),
    ("gated", "the state not written", [("if (j + RING >= t) {", "if (false) {")]),
    ("gated", "C applied before the conv", [("u *= src[row + 2u * p.n + c];",
                                             "u *= src[row + 2u * p.n + c] * src[row + p.n + c];"),
                                            ("y[j * p.n + c] = src[row + p.n + c] * acc;", "y[j * p.n + c] = acc;")]),
    ("gated", "only the last l_cache - 1 rows kept (no ring)", [("if (j + RING >= t) {", "if (j + LC - 1u >= t) {")]),
    ("silu", "the state read one position off", [STATE_OFF]),
    ("silu", "the silu missing", [("y[j * p.n + c] = silu(acc);", "y[j * p.n + c] = acc;")]),
    ("silu", "rows read at n floats, not the stride", [("let row = j * p.stride;", "let row = j * p.n;")]),
    ("silu", "the taps reversed", [("taps[i] = w[c * LC + i]", "taps[i] = w[c * LC + (LC - 1u - i)]")]),
])
def test_broken_shortconv_fails(env1, mode, what, subs):  # noqa: F811
    with pytest.raises(AssertionError, match="error|ring row"):
        converse(env1.device, Broken(env1.device, subs), mode)


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
    with pytest.raises(ValueError, match="mode"):
        shortconv(dev, env1.kernels, b, b, b, small, step_b, n=N, l_cache=L, ring=L - 1, mode="relu")
    with pytest.raises(ValueError, match="cannot hold"):
        shortconv(dev, env1.kernels, b, b, b, small, step_b, n=N, l_cache=L, ring=L - 1, mode="silu", stride=N - 1)
    with pytest.raises(ValueError, match="src holds"):
        shortconv(dev, env1.kernels, small, b, b, b, step_b, n=N, l_cache=L, ring=L - 1, mode="silu", stride=2 * N)
    free(dev, b, small, step_b)
