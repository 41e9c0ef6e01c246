"""Row softmax (wgsl/softmax.wgsl via lab.ops.softmax) against numpy, on both reduction paths."""

from checks import check_softmax, env  # noqa: F401

from lab.ops.rows import Rows


def test_rows_per_token(env):  # noqa: F811
    check_softmax(env, t=5, pos=7, n=1000)


def test_large_logits_in_place(env):  # noqa: F811
    check_softmax(env, t=5, pos=7, n=1000, lo=100.0, hi=1000.0, inplace=True)


def test_large_negative_logits(env):  # noqa: F811
    check_softmax(env, t=3, pos=7, n=777, lo=-1e4, hi=-9e3)


def test_scale(env):  # noqa: F811
    check_softmax(env, t=4, pos=7, n=1000, lo=-10.0, hi=10.0, scale=0.7)


def test_short_rows(env):  # noqa: F811
    check_softmax(env, t=5, pos=7, n=37)


def test_last_row(env):  # noqa: F811
    check_softmax(env, t=5, pos=7, n=1000, rows=Rows.last())
    check_softmax(env, t=5, pos=7, n=1000, rows=Rows.last(), inplace=True)


def test_fixed_rows(env):  # noqa: F811
    check_softmax(env, t=5, pos=7, n=500, rows=Rows.fixed(2))
