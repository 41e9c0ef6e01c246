"""The first weights' draws (wgsl/init.wgsl via lab.ops.init) against the float64 oracle (lab/host/reference/init.py):
runs that fill no workgroup (256) evenly, from a tensor's first element and from inside it, at a buffer offset, with
a sentinel around the run that no dispatch may touch; a tensor filled in two pieces equal to the same tensor filled
whole (what lets a tensor lie in several buffers); a constant fill; the draws' mean and spread; then broken variants
of the kernel the same checks must catch."""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env1, free, patched, read, upload  # noqa: F401  (env1: fixture)

from lab.host.reference import init as oracle
from lab.ops import init

SENTINEL = 7.0
PAD = 61                   # floats of sentinel before and after the run


def fill(env: Env, n: int, *, key: int, first: int = 0, mean: float = 0.0, std: float = 1.0,
         pieces: tuple[int, ...] = ()) -> np.ndarray:
    """n elements from `first` drawn into a buffer of sentinels from its float PAD on, in one dispatch or cut at
    `pieces` (offsets within the run), all in one pass; the run read back, its sentinels checked."""
    dev = env.device
    buf = upload(dev, np.full(n + 2 * PAD, SENTINEL, np.float32))
    cuts = [0, *pieces, n]
    ops = [op for a, b in zip(cuts, cuts[1:])
           for op in init.normal(dev, env.kernels, buf, b - a, key=key, first=first + a, mean=mean, std=std,
                                 dst=PAD + a)]
    try:
        dev.run([op.at(1) for op in ops])
        out = read(dev, buf)
    finally:
        free(dev, buf)
    assert (out[:PAD] == SENTINEL).all() and (out[PAD + n:] == SENTINEL).all(), "a draw landed outside its run"
    return out[PAD:PAD + n]


def check(env: Env, n: int, *, key: int, first: int = 0, mean: float = 0.0, std: float = 1.0, **kw) -> float:
    got = fill(env, n, key=key, first=first, mean=mean, std=std, **kw).astype(np.float64)
    want = oracle.normal(key, first, n, mean, std)
    if not std:
        assert np.array_equal(got, want), f"a constant fill of {mean} came back as {got[got != want][:4]}"
        return 0.0
    err = np.abs(got - want) / std
    tol = oracle.z_tolerance(key, first, n)
    assert (err <= tol).all(), f"n={n} first={first}: |z - z64| {err[err > tol][:4]} > {tol[err > tol][:4]}"
    return float(err.max())


@pytest.mark.parametrize("n,first", [(1, 0), (255, 0), (1000, 0), (4099, 37), (300_001, 1 << 20)])
def test_the_draws_are_the_oracles(env1, n, first):
    k = init.key(1234, 7)
    worst = check(env1, n, key=k, first=first, mean=0.25, std=0.02)
    print(f"n={n} first={first}: worst |z - z64| = {worst:.2e}")


def test_a_tensor_in_pieces_is_the_tensor_whole(env1):
    k = init.key(5, 3)
    whole = fill(env1, 10_000, key=k)
    assert np.array_equal(whole, fill(env1, 10_000, key=k, pieces=(64, 4096)))


def test_seeds_and_streams_draw_apart(env1):
    a = fill(env1, 512, key=init.key(0, 0))
    for k in (init.key(1, 0), init.key(0, 1)):
        b = fill(env1, 512, key=k)
        assert np.corrcoef(a, b)[0, 1] ** 2 < 0.05 and not np.allclose(a, b)
    assert len({init.key(s, t) for s in range(50) for t in range(50)}) == 2500


def test_a_constant_fill(env1):
    check(env1, 300, key=9, mean=1.0, std=0.0)


def test_the_draws_are_standard_normals(env1):
    n = 200_000
    z = fill(env1, n, key=init.key(42, 0)).astype(np.float64)
    # 5 standard errors: the mean's 1/sqrt(n), the variance's sqrt(2/n), the fourth moment's sqrt(96/n)
    assert abs(z.mean()) < 5 / np.sqrt(n) and abs(z.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs((z ** 4).mean() - 3) < 5 * np.sqrt(96 / n)
    assert np.abs(z).max() < 5.8


def test_bad_arguments_are_refused(env1):
    buf = upload(env1.device, np.zeros(16, np.float32))
    try:
        for kw, words in [(dict(n=0), "must lie"), (dict(n=17), "pass the end"), (dict(n=4, std=-1.0), "std"),
                          (dict(n=4, first=init.MAX_ELEMENTS - 2), "must lie")]:
            with pytest.raises(ValueError, match=words):
                init.normal(env1.device, env1.kernels, buf, key=1, **kw)
    finally:
        free(env1.device, buf)
    with pytest.raises(ValueError, match="seed"):
        init.key(-1, 0)


@pytest.mark.parametrize("old,new", [
    ("let e = p.first + i;", "let e = i;"),                                    # the run's place in its tensor lost
    ("let u2 = uniform01(2u * e + 1u);", "let u2 = uniform01(2u * e);"),       # both uniforms from one draw
    ("let z = -sqrt(", "let z = sqrt("),                                       # cos's shift not undone
    ("(f32(pcg(pcg(p.key) ^ j) >> 9u) + 0.5)", "(f32(pcg(p.key ^ j) >> 9u) + 0.5)"),  # the key not hashed
    ("w[p.dst + i] = p.mean + p.sd * z;", "w[p.dst + i] = p.sd * z;"),        # the mean dropped
    ("w[p.dst + i] = p.mean", "w[i] = p.mean"),                                # the run's place in its buffer lost
])
def test_broken_kernels_are_caught(env1, old, new):
    broken = patched(env1, "init", old, new)
    with pytest.raises(AssertionError):
        check(broken, 1000, key=init.key(3, 1), first=4096, mean=0.5, std=0.02)
