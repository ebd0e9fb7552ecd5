"""pass@k and the success interval of `evaluate`, on hand-computed cases and the laws they follow."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragen_lit.analysis.stats import wilson_interval
from ragen_lit.evaluation.estimators import effective_episodes, mean_pass_at_k, pass_at_k, success_interval


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
