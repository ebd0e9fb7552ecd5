import math

import pytest

from ragen_lit.analysis.stats import (
    finite,
    fisher_exact_p,
    mean,
    proportion_difference,
    std,
    summarize,
    welch_difference,
    wilson_interval,
)


def test_mean_std_n_drop_nan():
    assert mean([1.0, 2.0, 3.0]) == 2.0
    # s² = ((1-2)² + 0 + (3-2)²) / (3 - 1) = 1
    assert std([1.0, 2.0, 3.0]) == 1.0
    assert finite([1.0, math.nan]) == [1.0]
    assert summarize([1.0, math.nan, 3.0]) == pytest.approx(summarize([1.0, 3.0]))
    assert summarize([1.0, math.nan, 3.0]).n == 2
    assert math.isnan(std([5.0])) and math.isnan(mean([]))


def test_welch_interval_by_hand():
    # a = [2,4,6]: mean 4, s² = 4; b = [1,2,3]: mean 2, s² = 1
    # se² = 4/3 + 1/3 = 5/3; ν = (5/3)² / ((4/3)²/2 + (1/3)²/2) = (25/9) / (17/18) = 50/17 ≈ 2.941
    # t_{0.975, 50/17} = 3.21876 (scipy.stats.t.ppf), half width = 3.21876 · sqrt(5/3) = 3.21876 · 1.29099 = 4.15540
    d = welch_difference([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert d.delta == 2.0
    assert d.df == pytest.approx(50 / 17)
    assert d.high - d.delta == pytest.approx(4.15540, abs=1e-4)
    assert (d.low, d.high) == pytest.approx((2.0 - (d.high - 2.0), d.high))


def test_welch_equal_variances_gives_df_n1_plus_n2_minus_2():
    # s² = 0.04 both, n = 3: se² = 0.04/3 · 2 = 0.026667, ν = se⁴ / (2 · (0.04/3)² / 2) = 4
    # t_{0.975, 4} = 2.776445; half = 2.776445 · 0.1632993 = 0.453392
    d = welch_difference([0.5, 0.7, 0.9], [0.2, 0.4, 0.6])
    assert d.delta == pytest.approx(0.3)
    assert d.df == pytest.approx(4.0)
    assert (d.low, d.high) == pytest.approx((0.3 - 0.453392, 0.3 + 0.453392), abs=1e-5)


def test_welch_needs_two_per_side_and_handles_zero_spread():
    d = welch_difference([1.0], [1.0, 2.0])
    assert d.delta == -0.5 and math.isnan(d.low) and math.isnan(d.high) and math.isnan(d.df)
    flat = welch_difference([1.0, 1.0], [0.5, 0.5])
    assert (flat.low, flat.delta, flat.high) == (0.5, 0.5, 0.5) and flat.df == math.inf


def test_wilson_and_newcombe_intervals_match_newcombes_worked_examples():
    """Newcombe (1998, Stat. Med. 17:857 and 873): Wilson 0/10 -> [0, 0.2775], 81/263 -> [0.2553, 0.3662]; the
    difference 56/70 - 48/80 = 0.2 -> [0.0524, 0.3339] (hybrid score method 10)."""
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    d = proportion_difference(56, 70, 48, 80)
    assert (d.delta, d.low, d.high) == pytest.approx((0.2, 0.0524, 0.3339), abs=1e-4)
    # equal shares: a symmetric interval around 0; an empty side gives no interval
    same = proportion_difference(4, 16, 4, 16)
    assert same.delta == 0 and same.low == pytest.approx(-same.high)
    assert math.isnan(proportion_difference(0, 0, 1, 2).delta)


def test_fisher_exact_p_by_hand():
    # margins 2 + 2 runs, 2 successes: P(k1 = 0) = P(k1 = 2) = C(2,0)C(2,2)/C(4,2) = 1/6, P(k1 = 1) = 4/6
    assert fisher_exact_p(0, 2, 2, 2) == pytest.approx(1 / 3)
    assert fisher_exact_p(1, 2, 1, 2) == pytest.approx(1.0)
    # 7 of 16 against 4 of 16: the earlier collapse recipe's rates
    assert fisher_exact_p(7, 16, 4, 16) == pytest.approx(0.458, abs=5e-4)
    assert math.isnan(fisher_exact_p(0, 0, 1, 2))
