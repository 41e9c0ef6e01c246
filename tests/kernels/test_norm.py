"""RMSNorm (wgsl/norm.wgsl via lab.ops.norm) against numpy, on the subgroup and the fallback reduction path."""

import pytest

from oracles import check_rms_norm, env  # noqa: F401  (env: fixture over both reduction paths)


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
