"""Qwen3.5's gated delta-net kernel (wgsl/deltanet.wgsl via lab.ops.deltanet) against an oracle built from the
reference ops (lab/host/reference/ops.py: l2_norm, sigmoid, softplus, gated_delta_rule, rms_norm, silu) in float64
(lab/host/reference/kernel_cases.py deltanet_ref, the verification card's oracle too), over a conversation of steps through one
state buffer: a prefill chunk from position 0 over a state full of stale values, decode steps, a chunk at a position
past 0, then a new conversation from position 0 over the state the first one left. Each step's output and the state
it leaves are compared, with more value heads than key heads (ggml's broadcast) and as many, at S = 32 and at
Qwen3.5's S = 128, on both paths: with subgroups each column's rows split over lanes (4 at S = 32, 2 at 128, their
partial sums met by shuffles), without them one thread a column. Broken variants must fail: the decay's sign, the
beta gate without its sigmoid, the L2 norm over the whole q / k row instead of each head, the gate applied before the
norm instead of after it, the q / k head broadcast as h / ratio instead of h % n_k_heads, the state not zeroed at
position 0, the state stored transposed (ggml's layout, not the one the engine and the page read)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from checks import env, env1, free, read, upload  # noqa: F401  (fixtures)
from test_shortconv import Broken

from lab.host.reference.kernel_cases import deltanet_ref
from lab.host.reference import ops as ref
from lab.ops import make_step, step_bytes
from lab.ops.deltanet import deltanet, lanes

EPS = 1e-6              # Qwen3.5's rms eps, also its L2 norms'
# Tolerances, relative to the tensor's own largest magnitude at that step. Every product and sum of S terms rounds in
# f32 against the float64 oracle (~sqrt(S) eps32 of the terms' sizes: 1.3e-6 at S = 128); the state carries the errors
# of earlier tokens into later ones, but not growing: the decay is at most 1 and the update (I - beta k k^T, |k| = 1,
# beta < 1) is a contraction. The output is the state's read-out normalised per head (the rms norm divides by the
# head's own size) times silu of the gate (exp within a few ulp). Measured on lavapipe over these conversations (two
# seeds, both paths): out <= 5.6e-7 and state <= 8.4e-7 at S = 32 and 128; at S = 16, 48, 64 and 256 out <= 7.7e-7,
# state <= 1.0e-6; the broken variants move either by 0.2 or more.
OUT_TOL = 4e-6
STATE_TOL = 4e-6


@dataclass(frozen=True)
class Shape:
    n_k: int            # key heads
    n_v: int            # value heads
    S: int              # head size

    @property
    def conv_width(self) -> int:
        return 2 * self.n_k * self.S + self.n_v * self.S

    @property
    def layout(self) -> dict:
        """The in-projection row [q k v | z | beta | alpha | 3 floats nobody reads], as the engine's fused row."""
        z = self.conv_width
        return {"z_offset": z, "beta_offset": z + self.n_v * self.S, "alpha_offset": z + self.n_v * self.S + self.n_v,
                "proj_stride": z + self.n_v * self.S + 2 * self.n_v + 3}


class Oracle:
    """The layer's recurrence in float64 (lab.host.reference.kernel_cases.deltanet_ref: the reference ops), with its own state
    (never the GPU's)."""

    def __init__(self, shape: Shape, dt_bias, ssm_a, norm_w) -> None:
        self.sh, self.weights = shape, (dt_bias, ssm_a, norm_w)
        self.state = np.zeros((shape.n_v, shape.S, shape.S))

    def step(self, proj: np.ndarray, conv: np.ndarray, pos: int) -> np.ndarray:
        sh, lay = self.sh, self.sh.layout
        out, self.state = deltanet_ref(proj, conv, *self.weights, self.state, pos, n_k=sh.n_k, n_v=sh.n_v, S=sh.S,
                                       z_offset=lay["z_offset"], beta_offset=lay["beta_offset"],
                                       alpha_offset=lay["alpha_offset"], eps=EPS)
        return out


# (pos, t): a prefill chunk from 0 over stale values, decode steps, a chunk past 0, a new conversation over the state
# the first one left, and a decode step after it
PLAN = [(0, 6), (6, 1), (7, 1), (8, 9), (17, 1), (0, 3), (3, 1)]


def converse(device, kernels, shape: Shape, seed: int = 0, measured: dict | None = None) -> None:
    """The conversation of PLAN through one state buffer; AssertionError at the first wrong output or state."""
    rng = np.random.default_rng(seed)
    sh, lay = shape, shape.layout
    dt_bias = rng.standard_normal(sh.n_v).astype(np.float32)
    ssm_a = -rng.uniform(0.05, 1.0, sh.n_v).astype(np.float32)    # decays of ~0.5..0.97 a token: the state remembers
    norm_w = rng.uniform(0.5, 1.5, sh.S).astype(np.float32)
    oracle = Oracle(sh, dt_bias, ssm_a, norm_w)
    t_max = max(t for _, t in PLAN)
    proj_b = upload(device, np.zeros((t_max, lay["proj_stride"]), np.float32))
    conv_b = upload(device, np.zeros((t_max, sh.conv_width), np.float32))
    dt_b, a_b, w_b = upload(device, dt_bias), upload(device, ssm_a), upload(device, norm_w)
    # stale values from an earlier conversation: a step at position 0 must read none of them
    state_b = upload(device, rng.standard_normal((sh.n_v, sh.S, sh.S)).astype(np.float32) * 100)
    out_b = upload(device, np.zeros((t_max, sh.n_v * sh.S), np.float32))
    step_b = make_step(device, "test.deltanet step")
    ops = deltanet(device, kernels, proj_b, conv_b, dt_b, a_b, w_b, state_b, out_b, step_b, n_k_heads=sh.n_k,
                   n_v_heads=sh.n_v, head_dim=sh.S, eps=EPS, **lay)
    try:
        for pos, t in PLAN:
            proj = rng.standard_normal((t, lay["proj_stride"])).astype(np.float32)
            proj[:, lay["beta_offset"]:lay["beta_offset"] + sh.n_v] *= 2.0      # beta across (0, 1), not near 1/2
            conv = ref.silu(rng.standard_normal((t, sh.conv_width)) * 1.5).astype(np.float32)   # as the conv hands it
            device.write(proj_b, proj.tobytes())
            device.write(conv_b, conv.tobytes())
            device.run([op.at(t) for op in ops], writes=[(step_b, 0, step_bytes(pos, t, 128))])
            want = oracle.step(proj, conv, pos)
            got = read(device, out_b).reshape(t_max, -1)[:t]
            err = np.abs(got - want).max() / np.abs(want).max()
            got_s = read(device, state_b).reshape(sh.n_v, sh.S, sh.S)
            err_s = np.abs(got_s - oracle.state).max() / np.abs(oracle.state).max()
            if measured is not None:
                measured["out"] = max(measured.get("out", 0.0), err)
                measured["state"] = max(measured.get("state", 0.0), err_s)
            assert err <= OUT_TOL, f"{shape}, step at {pos} of {t}: out error {err:.3g}"
            assert err_s <= STATE_TOL, f"{shape}, step at {pos} of {t}: state error {err_s:.3g}"
    finally:
        free(device, proj_b, conv_b, dt_b, a_b, w_b, state_b, out_b, step_b)


BROADCAST = Shape(n_k=2, n_v=4, S=32)      # two value heads a key head (Qwen3.5: 16 key heads, 16 or 32 value heads)


@pytest.mark.parametrize("shape", [BROADCAST, Shape(n_k=3, n_v=3, S=32), Shape(n_k=2, n_v=2, S=128)], ids=str)
def test_deltanet_matches_the_oracle(env, shape):  # noqa: F811
    """Both paths: with subgroups each column split over lanes(S) lanes (4 at S = 32, 2 at 128), without them one."""
    converse(env.device, env.kernels, shape)


def test_lanes_a_column(env):  # noqa: F811
    """The split the speed rests on, which no oracle sees: S lanes(S) threads up to 256 with subgroups, else S."""
    want = [4, 4, 4, 2, 1] if "subgroups" in env.device.info.features else [1] * 5
    assert [lanes(env.device, S) for S in (16, 32, 64, 128, 256)] == want


@pytest.mark.parametrize("what,subs", [
    ("the decay's sign", [("let decay = exp(", "let decay = exp(-")]),
    ("beta without its sigmoid", [("let beta = sigmoid(", "let beta = (")]),
    ("the L2 norm over the whole q and k rows", [(
        "t.sq = vec2<f32>(dot(t.q, t.q), dot(t.k, t.k));",
        "for (var r = 0u; r < K; r++) { let x = conv[row + r]; let y = conv[row + K + r]; "
        "if (i == 0u) { t.sq += vec2(x * x, y * y); } }")]),
    ("the gate applied before the norm", [("select(0.0, o * o,", "select(0.0, o * o * silu(cur.z) * silu(cur.z),")]),
    ("the head broadcast h / ratio", [("let hk = h % p.n_k_heads;", "let hk = h / (p.n_v_heads / p.n_k_heads);")]),
    ("the state not zeroed at position 0", [("if (step.pos > 0u) {", "if (true) {")]),
    ("the state stored transposed", [("let col = h * S * S + c;", "let col = h * S * S + c * S;"),
                                     ("state[col + r * S]", "state[col + r]")]),
])
def test_broken_deltanet_fails(env1, what, subs):  # noqa: F811
    with pytest.raises(AssertionError, match="error"):
        converse(env1.device, Broken(env1.device, subs), BROADCAST)


def test_arguments_are_checked(env1):  # noqa: F811
    dev, sh = env1.device, BROADCAST
    big = upload(dev, np.zeros(4 * sh.n_v * sh.S * sh.S, np.float32))
    small = upload(dev, np.zeros(sh.n_v, np.float32))
    step_b = make_step(dev, "test.deltanet step")
    lay = sh.layout

    def call(proj=big, conv=big, state=big, out=None, **kw):
        args = {"n_k_heads": sh.n_k, "n_v_heads": sh.n_v, "head_dim": sh.S, "eps": EPS, **lay, **kw}
        return deltanet(dev, env1.kernels, proj, conv, small, small, big, state, big if out is None else out,
                        step_b, **args)
    with pytest.raises(ValueError, match="head_dim"):
        call(head_dim=24)
    with pytest.raises(ValueError, match="multiple"):
        call(n_k_heads=3)
    with pytest.raises(ValueError, match="alpha"):
        call(alpha_offset=lay["proj_stride"] - 1)
    with pytest.raises(ValueError, match="conv holds"):
        call(conv=small)
    with pytest.raises(ValueError, match="state holds"):
        call(state=small, out=upload(dev, np.zeros(sh.n_v * sh.S, np.float32)))
    with pytest.raises(ValueError, match="own"):
        call()
    free(dev, big, small, step_b)
