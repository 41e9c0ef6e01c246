"""Argmax and top-k (wgsl/sample.wgsl via lab.ops.sample) against numpy, on both reduction paths."""

import pytest
from checks import check_argmax, check_topk, env  # noqa: F401

from lab.ops.rows import Rows


def test_argmax_big_vocab_ties(env):  # noqa: F811
    check_argmax(env, n=262_144, rows=Rows.fixed(1), ties=True)


def test_argmax_rows_per_token(env):  # noqa: F811
    check_argmax(env, n=5000, rows=Rows.per_token(4), t=3, pos=7)


def test_argmax_last_row_nan_inf(env):  # noqa: F811
    check_argmax(env, n=3001, rows=Rows.last(), t=4, pos=7, special=True)


def test_argmax_of_a_row_with_nothing_finite_is_none(env):  # noqa: F811
    """A NaN or infinite logit never becomes a token id: a row of NaN and +-inf gives 0xffffffff (lab.engine.session stops
    there and names the broken layer)."""
    import numpy as np
    from checks import free, ops_step, read, run, upload

    from lab.ops.sample import NONE, argmax
    x = np.full((2, 3000), np.nan, np.float32)
    x[0, ::3], x[0, 1::3], x[1, 7] = np.inf, -np.inf, 0.5
    xb, ob = upload(env.device, x), upload(env.device, np.zeros(2, np.uint32))
    run(env, argmax(env.device, env.kernels, xb, ob, ops_step(env), 3000, rows=Rows.fixed(2)), 0, 1)
    assert list(read(env.device, ob, np.uint32)) == [NONE, 7]
    free(env.device, xb, ob)


def test_argmax_qwen_vocab(env):  # noqa: F811
    check_argmax(env, n=151_936, rows=Rows.fixed(2), ties=True)


def test_topk_big_vocab(env):  # noqa: F811
    check_topk(env, n=262_139, k=40)


def test_topk_ties_fixed_rows(env):  # noqa: F811
    check_topk(env, n=9000, k=64, rows=Rows.fixed(2), quantize=0.5)


def test_topk_fewer_candidates_than_k(env):  # noqa: F811
    check_topk(env, n=50, k=40, rows=Rows.last(), t=3, pos=7, special=True)


def test_topk_per_token(env):  # noqa: F811
    check_topk(env, n=4097, k=5, rows=Rows.per_token(3), t=2, pos=7)


def test_topk_refuses_big_k(env):  # noqa: F811
    from lab.ops.sample import top_k
    with pytest.raises(ValueError):
        top_k(env.device, env.kernels, None, None, None, 1000, 65)


def test_rows_values():
    from lab.ops.rows import ROWS_FIXED, ROWS_LAST, ROWS_TOKENS, check
    assert [Rows.fixed(3).at(t) for t in (0, 1, 5)] == [3, 3, 3]
    assert [Rows.per_token(4).at(t) for t in (0, 1, 5)] == [0, 1, 4]
    assert [Rows.per_token().at(t) for t in (0, 1, 5)] == [0, 1, 5] and not Rows.per_token().capped
    assert [Rows.last().at(t) for t in (0, 1, 5)] == [0, 1, 1]
    assert (Rows.fixed(2).mode, Rows.per_token(2).mode, Rows.last().mode) == (ROWS_FIXED, ROWS_TOKENS, ROWS_LAST)
    for bad in (0, -1, 2.0, None, "last", True):
        with pytest.raises(ValueError):
            Rows.fixed(bad)
    for bad in (0, 2.5):
        with pytest.raises(ValueError):
            Rows.per_token(bad)
    for bad in (2, None, "last"):      # the old spellings are refused, not guessed at
        with pytest.raises(ValueError, match="must be a Rows"):
            check(bad)


def test_per_token_sampling_needs_a_cap(env):  # noqa: F811
    from lab.ops.sample import argmax
    with pytest.raises(ValueError, match="max_rows"):
        argmax(env.device, env.kernels, None, None, None, 1000, rows=Rows.per_token())
