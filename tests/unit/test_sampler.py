"""The sampler: greedy, the top-k/top-p/min-p/temperature chain, and a seeded PRNG that is the same
on every Python (pure integer arithmetic)."""

from __future__ import annotations

import collections
import math

import pytest

from lab.engine.sampler import NONE, Pcg32, Sampler
from lab.settings import Settings

CANDS = [(10, 5.0), (11, 4.5), (12, 4.0), (13, 2.0), (14, 1.0), (15, -3.0)]


def test_pcg32_known_stream():
    # Pinned outputs: a change to the generator would silently change every seeded reply, in the
    # browser and natively. (The browser test checks Pyodide gives the same stream.)
    r = Pcg32(42)
    assert [r.next_u32() for _ in range(4)] == [1085446021, 176895750, 789123591, 1684778745]
    assert Pcg32(7).uniform() == 0.9421610984146349


def test_greedy_and_zero_temperature_take_the_top():
    assert Sampler(Settings(greedy=True)).pick(CANDS) == 10
    assert Sampler(Settings(greedy=False, temperature=0)).pick(CANDS) == 10


def test_seed_reproducible_and_seeds_differ():
    s = Settings(greedy=False, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123)
    one = Sampler(s)
    seq1 = [one.pick(CANDS) for _ in range(50)]
    two = Sampler(s)
    seq2 = [two.pick(CANDS) for _ in range(50)]
    assert seq1 == seq2
    other = Sampler(Settings(greedy=False, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=124))
    assert [other.pick(CANDS) for _ in range(50)] != seq1


def test_distribution_matches_softmax():
    s = Sampler(Settings(greedy=False, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5))
    n = 20000
    counts = collections.Counter(s.pick(CANDS) for _ in range(n))
    z = sum(math.exp(lg) for _, lg in CANDS)
    for tok, lg in CANDS:
        p = math.exp(lg) / z
        # 5 standard deviations of a binomial count: fails only on a real bias.
        assert abs(counts[tok] / n - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-4, tok


def test_truncations():
    def draws(st):
        smp = Sampler(st)
        return {smp.pick(CANDS) for _ in range(400)}

    assert draws(Settings(greedy=False, temperature=5.0, top_k=2, top_p=1.0, min_p=0.0)) == {10, 11}
    # top-p 0.5: p(10) ~ 0.50..., so only 10 and perhaps 11 survive.
    assert draws(Settings(greedy=False, temperature=5.0, top_k=0, top_p=0.5, min_p=0.0)) <= {10, 11}
    # min-p 0.5 keeps tokens with p >= 0.5 * p(top): 10 (1.0), 11 (0.61); 12 is 0.37.
    assert draws(Settings(greedy=False, temperature=5.0, top_k=0, top_p=1.0, min_p=0.5)) == {10, 11}


def test_bad_settings():
    for bad in (Settings(temperature=-1), Settings(top_p=0), Settings(min_p=1.0), Settings(top_k=-2)):
        with pytest.raises(ValueError):
            bad.check()


def test_a_nan_or_infinite_logit_never_becomes_a_token():
    nan, inf = float("nan"), float("inf")
    for greedy in (True, False):
        s = Sampler(Settings(greedy=greedy, seed=3))
        assert s.pick([(7, nan), (8, inf), (9, -inf), (4, 0.5), (5, 0.25)]) in (4, 5)
        assert s.pick([(7, nan), (8, inf), (9, -inf)]) == NONE


def test_settings_from_a_message_take_the_defaults_and_types():
    assert Settings.from_dict({}) == Settings()
    assert Settings.from_dict({"temperature": "0.5", "top_k": 7.0, "greedy": 0}) == Settings(
        greedy=False, temperature=0.5, top_k=7)
    with pytest.raises(ValueError, match="top_p"):
        Settings.from_dict({"top_p": "many"})
    with pytest.raises(ValueError, match="top-p"):
        Settings.from_dict({"top_p": 2})
