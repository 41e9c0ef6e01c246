"""Argmax and top-k (wgsl/sample.wgsl via lab.ops.sample) against numpy, on both reduction paths."""

import pytest

from oracles import check_argmax, check_topk, env  # noqa: F401


def test_argmax_big_vocab_ties(env):  # noqa: F811
    check_argmax(env, n=262_144, rows=1, ties=True)


def test_argmax_rows_per_token(env):  # noqa: F811
    check_argmax(env, n=5000, rows=None, max_rows=4, t=3, pos=7)


def test_argmax_last_row_nan_inf(env):  # noqa: F811
    check_argmax(env, n=3001, rows="last", t=4, pos=7, special=True)


def test_argmax_qwen_vocab(env):  # noqa: F811
    check_argmax(env, n=151_936, rows=2, ties=True)


def test_topk_big_vocab(env):  # noqa: F811
    check_topk(env, n=262_139, k=40)


def test_topk_ties_fixed_rows(env):  # noqa: F811
    check_topk(env, n=9000, k=64, rows=2, quantize=0.5)


def test_topk_fewer_candidates_than_k(env):  # noqa: F811
    check_topk(env, n=50, k=40, rows="last", t=3, pos=7, special=True)


def test_topk_per_token(env):  # noqa: F811
    check_topk(env, n=4097, k=5, rows=None, max_rows=3, t=2, pos=7)


def test_topk_refuses_big_k(env):  # noqa: F811
    from lab.ops.sample import top_k
    with pytest.raises(ValueError):
        top_k(env.device, env.kernels, None, None, None, 1000, 65)
