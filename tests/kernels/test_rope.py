"""RoPE (wgsl/rope.wgsl via lab.ops.rope) against numpy: both pairings, partial rotary dims, fused QKV rows."""

import pytest
from checks import check_rope, env1  # noqa: F401


@pytest.mark.parametrize("mode", ["adjacent", "neox"])
def test_full(env1, mode):  # noqa: F811
    check_rope(env1, mode, t=5, pos=7, n_head=4, head_dim=64)


@pytest.mark.parametrize("mode", ["adjacent", "neox"])
def test_partial_rotary(env1, mode):  # noqa: F811
    check_rope(env1, mode, t=5, pos=7, n_head=3, head_dim=80, n_rot=32)


@pytest.mark.parametrize("mode", ["adjacent", "neox"])
def test_fused_qkv(env1, mode):  # noqa: F811
    check_rope(env1, mode, t=4, pos=13, head_dim=32, fused=(4, 2))


@pytest.mark.parametrize("mode", ["adjacent", "neox"])
@pytest.mark.parametrize("t,pos,heads,n_rot", [(4, 13, (4, 2), None), (1, 21, (6, 2), None), (3, 5, (2, 2), 16),
                                               (5, 30, (4, 1), None)])
def test_fused_with_cache_write(env1, mode, t, pos, heads, n_rot):  # noqa: F811
    """The decode plans' op: rope of the fused row, its K and V into the cache rows pos .. pos+t-1 (GQA, partial
    rotary, a prefill chunk; the last case runs past the cache's 32 rows, which must be dropped)."""
    check_rope(env1, mode, t=t, pos=pos, head_dim=32, n_rot=n_rot, fused=heads, n_ctx=32)


def test_far_position_scaled(env1):  # noqa: F811
    check_rope(env1, "neox", t=3, pos=3000, n_head=2, head_dim=128, base=1e6, scale=0.5)


def test_freq_factors(env1):  # noqa: F811
    factors = [1.0 + 0.25 * i for i in range(16)]
    check_rope(env1, "adjacent", t=2, pos=40, n_head=2, head_dim=32, factors=factors)


def test_position_zero_identity(env1):  # noqa: F811
    check_rope(env1, "neox", t=1, pos=0, n_head=2, head_dim=16)


def test_llama_mode_numbers():
    from lab.ops.rope import MODES
    assert MODES[0] == MODES["norm"] == "rope_adjacent" and MODES[2] == "rope_neox"


def test_bad_n_rot(env1):  # noqa: F811
    from lab.ops.rope import rope
    with pytest.raises(ValueError):
        rope(env1.device, env1.kernels, None, None, 2, 64, n_rot=65)


def test_one_op_prefill_then_decode(env1):  # noqa: F811
    """The op is built once; prefill (t=5 at pos 0) and decode (t=1 at pos 5) differ only in the step buffer."""
    import numpy as np
    from checks import assert_close, ops_step, read, run, upload

    from lab.host.reference.kernels import f32, rope_ref, rope_tol
    from lab.ops.rope import rope
    dev = env1.device
    rng = np.random.default_rng(9)
    x = f32(rng.standard_normal((8, 2 * 64)))
    xb = upload(dev, x)
    ops = rope(dev, env1.kernels, xb, ops_step(env1), 2, 64, freq_base=1e4, mode="neox")
    run(env1, ops, 0, 5)
    assert_close(read(dev, xb).reshape(8, -1)[:5], rope_ref(x[:5], 0, 2, 64, 64, 1e4, 1.0, "neox"), rope_tol(5),
                 "prefill")
    dev.write(xb, x.tobytes())
    run(env1, ops, 5, 1)
    y = read(dev, xb).reshape(8, -1)
    assert_close(y[:1], rope_ref(x[:1], 5, 2, 64, 64, 1e4, 1.0, "neox"), rope_tol(6), "decode")
    assert np.array_equal(y[1:], x[1:])
