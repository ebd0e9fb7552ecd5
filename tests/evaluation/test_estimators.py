"""pass@k, its bootstrap interval and the success interval of `evaluate`, on hand-computed cases and the laws they
follow."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragen_lit.analysis.stats import wilson_interval
from ragen_lit.evaluation.estimators import (
    BOOTSTRAP_RESAMPLES,
    bootstrap_pass_at_k,
    effective_episodes,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_intervals,
    success_interval,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 1 / 4),  # 1 - C(3,1)/C(4,1) = 1 - 3/4
        (4, 1, 2, 1 / 2),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (5, 2, 3, 9 / 10),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (10, 0, 5, 0.0),
        (4, 3, 2, 1.0),  # n - c < k: every pair holds a success
        (4, 4, 4, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_one_minus_the_binomial_ratio(case):
    n, c, k = case
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-9)


@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_1_is_the_success_rate_and_pass_at_k_grows_with_k(case):
    n, c = case
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 0), (4, 1, 5), (4, 5, 1), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_over_items():
    # items with 1, 4 and 0 successes of 4: pass@2 = 1/2, 1, 0
    assert mean_pass_at_k([1, 4, 0], 4, 2) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("successes", "samples", "expected"),
    [
        ([1, 0, 1], 1, 3.0),  # one sample each: the episodes are independent
        ([2, 2, 2], 4, 12.0),  # items alike: no variance between them, the samples count fully
        ([4, 0, 4, 0], 4, 4.0),  # all or nothing per item: p(1-p)/Var = 0.25 / (1/12) = 3, clamped up to N = 4
        # rates 1, 0, .5, .5 around p = .5: Var = (.25 + .25) / (4 * 3) = 1/24, p(1-p)/Var = .25 * 24 = 6
        ([4, 0, 2, 2], 4, 6.0),
        ([0, 0, 0], 4, 3.0),  # p = 0: no variance to read, the items count
        ([3, 1, 2, 2], 4, 16.0),  # Var = .125 / 12: p(1-p)/Var = 24, clamped down to NK = 16
    ],
)
def test_effective_episodes_hand_computed(successes, samples, expected):
    assert effective_episodes(successes, samples) == pytest.approx(expected)


def test_success_interval_is_wilsons_at_the_effective_count():
    assert success_interval([1, 0, 1, 1, 0], 1) == pytest.approx(wilson_interval(3, 5))
    assert success_interval([4, 0, 2, 2], 4) == pytest.approx(wilson_interval(3, 6))  # p = .5 at 6 episodes


@given(st.integers(1, 8).flatmap(lambda k: st.tuples(st.just(k), st.lists(st.integers(0, k), min_size=2, max_size=30))))
def test_success_interval_is_between_the_items_and_all_samples(case):
    samples, successes = case
    low, high = success_interval(successes, samples)
    n = len(successes)
    p = sum(successes) / (n * samples)
    assert low - 1e-9 <= p <= high + 1e-9
    wide, narrow = wilson_interval(p * n, n), wilson_interval(p * n * samples, n * samples)
    assert wide[0] - 1e-9 <= low <= narrow[0] + 1e-9 and narrow[1] - 1e-9 <= high <= wide[1] + 1e-9


@pytest.mark.parametrize(
    ("successes", "samples"),
    [
        ([4, 4, 4], 4),  # every sample of every episode succeeds: every pass@k is 1
        ([0, 0, 0, 0], 4),  # none does: 0
        ([2, 2, 2], 4),  # episodes alike: a resample of them is the same episodes
        ([1], 3),  # one episode: every resample is that episode
    ],
)
def test_pass_at_k_interval_collapses_to_the_point_when_episodes_agree(successes, samples):
    intervals = pass_at_k_intervals(successes, samples)
    assert list(intervals) == list(range(1, samples + 1))
    for k, (low, high) in intervals.items():
        point = mean_pass_at_k(successes, samples, k)
        assert low == pytest.approx(point, abs=1e-12) and high == pytest.approx(point, abs=1e-12)


def _enumerated(successes: list[int], samples: int, k: int) -> dict[float, float]:
    """The bootstrap distribution of mean pass@k, exactly: each of the N^N ordered resamples, equally likely."""
    n = len(successes)
    law: dict[float, float] = {}
    for picks in itertools.product(successes, repeat=n):
        mean = round(mean_pass_at_k(list(picks), samples, k), 9)
        law[mean] = law.get(mean, 0.0) + n**-n
    return law


def _quantile(law: dict[float, float], q: float, margin: float) -> float:
    """The q-quantile of `law`, checked to be one that 2,000 draws find: the CDF is not within `margin` of q at any
    value (so the sample quantile lands on the same value but with vanishing probability)."""
    cdf = 0.0
    for value in sorted(law):
        cdf += law[value]
        assert abs(cdf - q) > margin, (value, cdf, q)
        if cdf > q:
            return value
    raise AssertionError("unreachable")


def test_pass_at_k_bootstrap_follows_the_enumerated_resampling_distribution():
    # one episode of four with 1 success of 2, the others none: pass@1 per episode is 1/2, 0, 0, 0 and pass@2 is
    # 1, 0, 0, 0, so the resampled mean pass@2 is Binomial(4, 1/4) / 4: P = .316, .422, .211, .047, .004 at
    # 0, 1/4, 1/2, 3/4, 1, whose 2.5% and 97.5% quantiles are 0 and 3/4 (the CDF passes .975 at 3/4)
    successes, samples = [1, 0, 0, 0], 2
    draws = bootstrap_pass_at_k(successes, samples, [1, 2])
    assert draws.shape == (BOOTSTRAP_RESAMPLES, 2)
    intervals = pass_at_k_intervals(successes, samples)
    assert intervals[2] == (0.0, 0.75) and intervals[1] == (0.0, 0.375)
    for column, k in enumerate([1, 2]):
        law = _enumerated(successes, samples, k)
        assert intervals[k] == pytest.approx((_quantile(law, 0.025, 0.01), _quantile(law, 0.975, 0.01)))
        # each value's share of the 2,000 resamples is its enumerated probability within 5 standard errors
        values, counts = np.unique(np.round(draws[:, column], 9), return_counts=True)
        assert set(values.tolist()) <= set(law)
        for value, count in zip(values.tolist(), counts.tolist()):
            p = law[value]
            assert abs(count / BOOTSTRAP_RESAMPLES - p) <= 5 * math.sqrt(p * (1 - p) / BOOTSTRAP_RESAMPLES) + 1e-9


def test_pass_at_k_bootstrap_spread_is_the_standard_error_over_episodes():
    # many episodes: the bootstrap's spread of the mean is the episodes' standard deviation / sqrt(N), and the
    # interval is close to point +- 1.96 standard errors; samples of one episode are not counted as independent
    generator = random.Random(7)
    samples = 8
    successes = [generator.choice([0, 0, 1, 4, 8]) for _ in range(400)]
    draws = bootstrap_pass_at_k(successes, samples, [1, 4, 8])
    intervals = pass_at_k_intervals(successes, samples)
    for column, k in enumerate([1, 4, 8]):
        per_episode = np.array([pass_at_k(samples, c, k) for c in successes])
        standard_error = per_episode.std() / math.sqrt(len(successes))
        assert draws[:, column].std() == pytest.approx(standard_error, rel=0.1)
        assert draws[:, column].mean() == pytest.approx(per_episode.mean(), abs=0.5 * standard_error)
        low, high = intervals[k]
        assert low == pytest.approx(per_episode.mean() - 1.96 * standard_error, abs=0.5 * standard_error)
        assert high == pytest.approx(per_episode.mean() + 1.96 * standard_error, abs=0.5 * standard_error)


def test_pass_at_k_interval_is_reproducible_and_depends_on_the_seed_alone():
    successes, samples = [3, 0, 1, 4, 2, 0, 0, 1], 4
    first = pass_at_k_intervals(successes, samples)
    assert pass_at_k_intervals(successes, samples) == first
    assert pass_at_k_intervals(list(reversed(successes)), samples) == first  # the episodes' order does not matter
    assert pass_at_k_intervals(successes, samples, seed=1) != first
    assert pass_at_k_intervals(successes, samples, confidence=0.5)[1][0] > first[1][0]  # a narrower interval


@given(st.integers(1, 8).flatmap(lambda k: st.tuples(st.just(k), st.lists(st.integers(0, k), min_size=1, max_size=30))))
def test_pass_at_k_interval_holds_the_point_between_zero_and_one(case):
    samples, successes = case
    for k, (low, high) in pass_at_k_intervals(successes, samples, resamples=200).items():
        point = mean_pass_at_k(successes, samples, k)
        assert 0.0 <= low <= high <= 1.0
        # a percentile interval need not hold the point, but a resampled mean falls on either side of the point far
        # more often than 2.5% of the time (an outlier episode is left out of (1 - 1/N)^N <= 37% of resamples), so
        # here it does; the tolerance is float summation
        assert low - 1e-9 <= point <= high + 1e-9


@pytest.mark.parametrize("successes", [[], [1, 5], [-1, 0]])
def test_pass_at_k_bootstrap_refuses_impossible_counts(successes):
    with pytest.raises(ValueError, match="bootstrap needs"):
        pass_at_k_intervals(successes, 4)
