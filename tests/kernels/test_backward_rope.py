"""RoPE backward (wgsl/backward_rope.wgsl via lab.ops.backward_rope.rope_back) against the float64 oracle
(lab/host/reference/grads_attention.py rope_grad): both pairings, partial rotary dims, frequency factors, a position
scale, compact rows and the Q and K heads of a fused [dq | dk | dv] gradient row, at token counts and head counts that
fill no 64-wide workgroup evenly; then the forward followed by the backward (the identity), and broken variants the
same check must catch.

Tolerance (grads_attention.rope_back_tol, the forward's rope_tol): 1e-6 + 1.5e-7 max|theta| of each head's largest
value, theta's rounding being the forward's; -s prints the measured errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, assert_close, env1, free, ops_step, patched, read, run, upload  # noqa: F401  (env1: fixture)

from lab.host.reference.grads_attention import rope_angles, rope_back_tol, rope_grad
from lab.host.reference.kernels import f32, rel_err
from lab.ops.backward_rope import rope_back
from lab.ops.rope import rope


def check_rope_back(env: Env, mode: str, t: int, pos: int, n_head: int, head_dim: int, n_rot: int | None = None,
                    factors=None, fused: tuple[int, int] | None = None, base: float = 10000.0, scale: float = 1.0,
                    seed: int = 0) -> float:
    """rope_back over t tokens of t + 2 rows (rows past the step must keep their bytes): n_head compact heads, or
    fused=(nh, nkv): the nh + nkv Q and K heads of a fused gradient row, its V heads untouched. Returns the error
    relative to each head's largest gradient; raises AssertionError past the tolerance or when anything else moved."""
    rng = np.random.default_rng(seed)
    n_rot = head_dim if n_rot is None else n_rot
    n_rows = t + 2
    nh_rot, stride = (n_head, n_head * head_dim) if fused is None else (sum(fused), (sum(fused) + fused[1]) * head_dim)
    g = f32(rng.standard_normal((n_rows, stride)) * rng.uniform(0.5, 4.0, (n_rows, 1)))
    gb = upload(env.device, g)
    run(env, rope_back(env.device, env.kernels, gb, ops_step(env), nh_rot, head_dim, n_rot, base, scale, mode,
                       row_stride=stride, freq_factors=factors), pos, t)
    got = read(env.device, gb).reshape(n_rows, stride)
    free(env.device, gb)
    width = nh_rot * head_dim
    heads = g[:t, :width].reshape(t, nh_rot, head_dim)
    want = rope_grad(heads, pos + np.arange(t), n_rot, base, mode, scale, factors)
    rot = got[:t, :width].reshape(t, nh_rot, head_dim)
    tol = rope_back_tol(float(np.max(np.abs(rope_angles(pos + np.arange(t), n_rot, base, scale, factors)))))
    what = f"rope_back {mode} t={t} pos={pos} heads={fused or n_head} n_rot={n_rot}/{head_dim}"
    assert_close(rot, want, tol, what, axis=(2,))
    if not np.array_equal(rot[:, :, n_rot:], heads[:, :, n_rot:]):
        raise AssertionError(f"{what}: changed dims past n_rot")
    if not (np.array_equal(got[:t, width:], g[:t, width:]) and np.array_equal(got[t:], g[t:])):
        raise AssertionError(f"{what}: touched V heads or rows past the step")
    return rel_err(rot, want, axis=(2,))


FACTORS_32 = [1.0 + 0.25 * i for i in range(32)]
FACTORS_24 = [0.5 + 0.5 * (i % 5) for i in range(24)]

CASES = [  # mode, t, pos, n_head, head_dim, n_rot, factors, fused
    ("norm", 1, 0, 3, 64, None, None, None),             # position 0: the identity
    ("neox", 3, 7, 5, 80, 64, None, None),               # 5 x 32 pairs: 160 invocations, 2.5 workgroups
    ("norm", 13, 100, 3, 96, 64, FACTORS_32, None),      # frequency factors, partial rotary
    ("neox", 37, 21, 0, 64, 48, FACTORS_24, (6, 2)),     # fused: Q and K heads of [dq | dk | dv], GQA 3
    ("norm", 37, 0, 0, 80, None, None, (3, 1)),
]


@pytest.mark.parametrize("mode,t,pos,n_head,head_dim,n_rot,factors,fused", CASES)
def test_rope_back(env1, mode, t, pos, n_head, head_dim, n_rot, factors, fused):  # noqa: F811
    e = check_rope_back(env1, mode, t, pos, n_head, head_dim, n_rot, factors, fused, seed=t * 100 + pos)
    print(f"rope_back {mode} t={t} pos={pos} hd={head_dim} n_rot={n_rot} factors={factors is not None} "
          f"fused={fused}: {e:.2e}")


def test_far_position_scaled(env1):  # noqa: F811
    """theta up to 1,500 rad (pos 3,000, position scale 0.5): the tolerance's theta term."""
    e = check_rope_back(env1, "neox", 13, 3000, 2, 128, base=1e6, scale=0.5, seed=9)
    print(f"rope_back neox pos=3000 scale=0.5: {e:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["norm", "neox"])
@pytest.mark.parametrize("t,pos", [(1, 0), (1, 5000), (3, 0), (13, 7), (37, 100), (70, 1000)])
@pytest.mark.parametrize("head_dim,n_rot", [(64, None), (64, 32), (80, 80), (96, 64), (128, 128), (256, 128)])
@pytest.mark.parametrize("factors", [False, True])
def test_rope_back_sweep(env1, mode, t, pos, head_dim, n_rot, factors):  # noqa: F811
    half = (n_rot or head_dim) // 2
    ff = [0.5 + 0.25 * (i % 7) for i in range(half)] if factors else None
    e = check_rope_back(env1, mode, t, pos, 3, head_dim, n_rot, ff, None if t % 2 else (4, 2), seed=t + pos)
    print(f"rope_back sweep {mode} t={t} pos={pos} hd={head_dim} n_rot={n_rot} factors={factors}: {e:.2e}")


@pytest.mark.parametrize("mode", ["norm", "neox"])
def test_backward_undoes_the_forward(env1, mode):  # noqa: F811
    """A rotation's transpose is its inverse: the forward kernel then the backward leave each head as it was, to the
    two rotations' rounding (twice the tolerance)."""
    rng = np.random.default_rng(4)
    t, pos, nh, hd, n_rot = 13, 40, 3, 80, 64
    x = f32(rng.standard_normal((t, nh * hd)))
    xb = upload(env1.device, x)
    ops = rope(env1.device, env1.kernels, xb, ops_step(env1), nh, hd, n_rot, 10000.0, 1.0, mode)
    run(env1, ops + rope_back(env1.device, env1.kernels, xb, ops_step(env1), nh, hd, n_rot, 10000.0, 1.0, mode), pos, t)
    got = read(env1.device, xb).reshape(t, nh, hd)
    free(env1.device, xb)
    assert_close(got, x.reshape(t, nh, hd), 2 * rope_back_tol(pos + t), f"rope then rope_back {mode}", axis=(2,))


def test_arguments(env1):  # noqa: F811
    for kw in ({"n_rot": 65}, {"n_rot": 7}, {"mode": "yarn"}, {"row_stride": 100}):
        with pytest.raises(ValueError):
            rope_back(env1.device, env1.kernels, None, None, 2, 64, **kw)


# Broken variants: each must fail the check that the real kernel passes above.
POS_ANGLE = ("g[base + ab.x] = g0 * cs.x + g1 * cs.y;\n    g[base + ab.y] = g1 * cs.x - g0 * cs.y;",
             "g[base + ab.x] = g0 * cs.x - g1 * cs.y;\n    g[base + ab.y] = g1 * cs.x + g0 * cs.y;")


@pytest.mark.parametrize("mode,old,new,fused", [
    ("norm", *POS_ANGLE, None),                                                    # rotation by +theta (the forward)
    ("neox", *POS_ANGLE, None),
    ("neox", "vec2<u32>(i, i + p.half)", "vec2<u32>(2u * i, 2u * i + 1u)", None),  # the other pairing's partner
    ("norm", "vec2<u32>(2u * i, 2u * i + 1u)", "vec2<u32>(i, i + p.half)", None),
    ("neox", "f32(step.pos + row)", "f32(step.pos + row + 1u)", None),             # one position late
    ("norm", "freqs[i]", "freqs[p.half - 1u - i]", None),                          # the frequency table reversed
    ("neox", "row * p.row_stride", "row * p.n_head * p.head_dim", (6, 2)),         # the fused row's stride ignored
])
def test_broken_variants_fail(env1, mode, old, new, fused):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite|touched|changed") as info:
        check_rope_back(patched(env1, "backward_rope", old, new), mode, 13, 100, 3, 96, 64, FACTORS_32, fused,
                        seed=77)
    print(f"broken rope_back {mode} {new!r}: {str(info.value).splitlines()[0]}")
