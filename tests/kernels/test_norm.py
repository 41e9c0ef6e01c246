"""RMSNorm (wgsl/norm.wgsl via lab.ops.norm) against numpy, on the subgroup and the fallback reduction path."""

import pytest
from checks import check_rms_norm, env  # noqa: F401  (env: fixture over both reduction paths)


def test_rows(env):  # noqa: F811
    check_rms_norm(env, t=5, pos=7, n=1000, eps=1e-5)


def test_rows_wide_one_token(env):  # noqa: F811
    check_rms_norm(env, t=1, pos=300, n=2883, eps=1e-6)


def test_in_place(env):  # noqa: F811
    check_rms_norm(env, t=5, pos=7, n=1000, eps=1e-5, inplace=True)


@pytest.mark.parametrize("head_dim", [72, 256])
def test_per_head(env, head_dim):  # noqa: F811
    check_rms_norm(env, t=3, pos=11, n=6 * head_dim, eps=1e-6, group=head_dim)


def test_per_head_fused_qkv_strided(env):  # noqa: F811
    check_rms_norm(env, t=5, pos=7, eps=1e-6, fused=(4, 2, 40))


def test_group_must_divide(env):  # noqa: F811
    from lab.ops.norm import rms_norm
    with pytest.raises(ValueError):
        rms_norm(env.device, env.kernels, None, None, None, None, 100, 1e-5, group=30)


@pytest.mark.parametrize("inplace", [True, False])
def test_residual_add(env, inplace):  # noqa: F811
    """Gemma's post-norm and the residual add in one dispatch: y = norm(x) * w and res += y; rows past the
    step's tokens untouched in both."""
    import numpy as np
    from checks import assert_close, free, ops_step, read, run, upload

    from lab.host.reference.kernels import NORM_TOL, f32, rms_norm_ref
    from lab.ops.norm import rms_norm
    rng = np.random.default_rng(3)
    dev, t, n = env.device, 5, 640
    x = f32(rng.standard_normal((8, n)) * 2.0)
    r0 = f32(rng.standard_normal((8, n)) * 50.0)            # the residual stream is larger than the branch
    w = f32(rng.uniform(0.2, 2.0, n))
    xb, wb, rb = upload(dev, x), upload(dev, w), upload(dev, r0)
    yb = xb if inplace else upload(dev, np.zeros_like(x))
    run(env, rms_norm(dev, env.kernels, xb, wb, yb, ops_step(env), n, 1e-6, residual=rb), 7, t)
    want = rms_norm_ref(x[:t], w, 1e-6, n)
    y, res = read(dev, yb).reshape(8, n), read(dev, rb).reshape(8, n)
    assert_close(y[:t], want, NORM_TOL, "normed", axis=(1,))
    # res = r0 + y: one more rounding at the residual's magnitude, so compared against r0's size
    assert np.max(np.abs(res[:t] - (r0[:t] + want))) <= 2e-6 * np.max(np.abs(r0))
    assert np.array_equal(res[t:], r0[t:])
    free(dev, *{id(b): b for b in (xb, wb, rb, yb)}.values())


def test_two_weights_q_then_k_heads(env):  # noqa: F811
    """Gemma's q and k norms in one op: per head over Q heads (weight wq) then K heads (wk) of a fused row,
    in place; V untouched."""
    import numpy as np
    from checks import assert_close, free, ops_step, read, run, upload

    from lab.host.reference.kernels import NORM_TOL, f32, rms_norm_ref
    from lab.ops.norm import rms_norm
    rng = np.random.default_rng(4)
    dev, t, nh, nkv, hd = env.device, 3, 4, 1, 256
    width = (nh + 2 * nkv) * hd
    x = f32(rng.standard_normal((4, width)) * 3.0)
    wq, wk = f32(rng.uniform(0.2, 2.0, hd)), f32(rng.uniform(-1.0, 1.0, hd))
    xb, qb, kb = upload(dev, x), upload(dev, wq), upload(dev, wk)
    run(env, rms_norm(dev, env.kernels, xb, qb, xb, ops_step(env), (nh + nkv) * hd, 1e-6, group=hd, in_stride=width,
                      w2=kb, split=nh), 9, t)
    y = read(dev, xb).reshape(4, width)
    q, k = nh * hd, (nh + nkv) * hd
    assert_close(y[:t, :q].reshape(t, nh, hd), rms_norm_ref(x[:t, :q], wq, 1e-6, hd).reshape(t, nh, hd), NORM_TOL,
                 "q heads", axis=(2,))
    assert_close(y[:t, q:k].reshape(t, nkv, hd), rms_norm_ref(x[:t, q:k], wk, 1e-6, hd).reshape(t, nkv, hd),
                 NORM_TOL, "k heads", axis=(2,))
    assert np.array_equal(y[:t, k:], x[:t, k:]) and np.array_equal(y[t:], x[t:])
    with pytest.raises(ValueError):
        rms_norm(dev, env.kernels, xb, qb, xb, ops_step(env), (nh + nkv) * hd, 1e-6, group=hd, w2=kb, split=0)
    free(dev, xb, qb, kb)
