import math
import statistics
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.config import ConfigError, load_config
from ragen_lit.filtering import (
    STRATEGIES,
    dynamic_sampling_keep,
    filter_stats,
    reward_variance_scores,
    rv_buckets,
    select_groups,
    select_trajectories,
)


def t(values):
    return torch.tensor(values, dtype=torch.float32)


def kept(mask):
    return mask.nonzero().flatten().tolist()


def groups_with_std(stds):
    """K = 2 groups [0, s·√2] whose ddof=1 std is exactly s (up to rounding)."""
    return torch.tensor([[0.0, s * math.sqrt(2.0)] for s in stds], dtype=torch.float64)


# population variances 4, 1, 0, 9, 0, 1 (total 15); descending order 3, 0, 1, 5, 2, 4
REWARDS = t([[0, 4], [0, 2], [0, 0], [0, 6], [1, 1], [0, 2]])


# ---------------------------------------------------------------- scores


def test_reward_variance_scores_by_hand():
    rewards = t([[0, 1, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    torch.testing.assert_close(reward_variance_scores(rewards), t([0.25, 0.0, 0.1875]))
    torch.testing.assert_close(reward_variance_scores(rewards, "std"), t([math.sqrt(1 / 3), 0.0, 0.5]))
    single = t([[3.0], [5.0]])
    assert reward_variance_scores(single).tolist() == [0.0, 0.0]
    assert reward_variance_scores(single, "std").tolist() == [0.0, 0.0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rewards_are_rejected(bad):
    rewards = t([[0.0, 1.0], [bad, 1.0]])
    with pytest.raises(ValueError, match=r"NaN or inf in groups \[1\]"):
        select_groups(rewards)
    with pytest.raises(ValueError, match="NaN or inf"):
        select_trajectories(rewards, 0.5)
    with pytest.raises(ValueError, match="NaN or inf"):
        filter_stats(rewards, torch.ones(2, dtype=torch.bool))


def test_malformed_rewards_are_rejected():
    with pytest.raises(ValueError, match=r"\[G, K\]"):
        select_groups(t([0.0, 1.0]))
    with pytest.raises(ValueError, match="float"):
        select_groups(torch.tensor([[0, 1]]))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"strategy": "top_q"}, "filter.strategy"),
        ({"score": "mad"}, "filter.score"),
        ({"strategy": "top_p", "value": 0.0}, "filter.value"),
        ({"strategy": "top_p_softmax", "value": float("nan")}, "filter.value"),
        ({"strategy": "top_k", "value": -1}, "filter.value"),
        ({"strategy": "min_p", "value": 1.5}, "filter.value"),
        ({"strategy": "quartile"}, "filter.quartile"),
        ({"strategy": "quartile", "quartile": 5}, "filter.quartile"),
    ],
)
def test_invalid_configuration_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        select_groups(REWARDS, **kwargs)


TOP_P_RANGE = "in (0, 1] (0 keeps no group)"
TOP_K_RANGE = "a fraction in (0, 1) or a whole count >= 1 (0 keeps no group)"
TRAJECTORY_RANGE = "in (0, 1] (the share of each group's rollouts kept; 0 keeps none)"


@pytest.mark.parametrize(
    "strategy, level, value, allowed",
    [
        ("top_p", "group", 0.9, None),
        ("top_p", "group", 1.0, None),
        ("top_p", "group", 0.0, TOP_P_RANGE),
        ("top_p", "group", 1.5, TOP_P_RANGE),
        ("top_p_softmax", "group", 1.5, TOP_P_RANGE),
        ("min_p", "group", 0.0, None),
        ("min_p", "group", 1.0, None),
        ("min_p", "group", 1.5, "in [0, 1]"),
        ("top_k", "group", 0.5, None),
        ("top_k", "group", 3.0, None),
        ("top_k", "group", 0.0, TOP_K_RANGE),
        ("top_k", "group", 2.7, TOP_K_RANGE),
        ("none", "group", 7.0, None),  # not read by this strategy
        ("top_p", "trajectory", 0.5, None),
        ("top_p", "trajectory", 1.0, None),
        ("top_p", "trajectory", 0.0, TRAJECTORY_RANGE),
        ("top_p", "trajectory", 1.5, TRAJECTORY_RANGE),
    ],
)
def test_the_config_and_the_filters_take_the_same_filter_values(strategy, level, value, allowed):
    """One range rule (`choices.filter_value_error`) behind both entry points: a value `load_config` refuses, the
    filter functions refuse with the same line (naming the key, the value and the range), and the other way round."""
    overrides = [f"filter.strategy={strategy}", f"filter.level={level}", f"filter.value={value}"]
    select = partial(select_groups, REWARDS, strategy) if level == "group" else partial(select_trajectories, REWARDS)
    if allowed is None:
        assert load_config(None, overrides).filter.value == value
        select(value)
        return
    scope = f"filter.strategy={strategy}" if level == "group" else "filter.level=trajectory"
    message = f"filter.value={value!r} is out of range for {scope}; it must be {allowed}"
    with pytest.raises(ConfigError) as from_config:
        load_config(None, overrides)
    with pytest.raises(ValueError) as from_filter:
        select(value)
    assert str(from_config.value) == str(from_filter.value) == message


# ---------------------------------------------------------------- strategies by hand


@pytest.mark.parametrize(
    "strategy, value, include_zero, quartile, expected",
    [
        ("none", 0.9, True, None, [0, 1, 2, 3, 4, 5]),
        ("none", 0.9, False, None, [0, 1, 3, 5]),
        ("top_p", 0.9, True, None, [0, 1, 3]),  # 9+4+1 = 14 >= 13.5; tie 1 vs 5 goes to index 1
        ("top_p", 0.9, False, None, [0, 1, 3]),
        ("top_p", 0.8, True, None, [0, 3]),  # 13 >= 12
        ("top_p", 0.6, True, None, [3]),  # 9 >= 9 exactly
        ("top_p", 0.5, True, None, [3]),
        ("top_p", 1.0, True, None, [0, 1, 2, 3, 4, 5]),
        ("top_p", 1.0, False, None, [0, 1, 3, 5]),
        ("top_p_softmax", 0.9, True, None, [3]),  # e^9 / (e^9 + e^4 + 2e + 2) = 0.9924
        ("top_p_softmax", 0.995, True, None, [0, 3]),  # + e^4/... = 0.9991
        ("top_k", 0.5, True, None, [0, 1, 3]),  # floor(0.5 * 6) = 3
        ("top_k", 0.1, True, None, [3]),  # floor(0.6) = 0 -> at least 1
        ("top_k", 2, True, None, [0, 3]),
        ("top_k", 10, True, None, [0, 1, 2, 3, 4, 5]),
        ("top_k", 0.9, False, None, [0, 1, 3, 5]),  # floor(5.4) = 5 of all 6, but only 4 candidates
        ("min_p", 0.25, True, None, [0, 3]),  # >= 2.25
        ("min_p", 0.1, True, None, [0, 1, 3, 5]),  # >= 0.9
        ("min_p", 0.0, True, None, [0, 1, 2, 3, 4, 5]),
        ("min_p", 0.0, False, None, [0, 1, 3, 5]),
        ("nonzero", 0.9, True, None, [0, 1, 3, 5]),
        ("quartile", 0.9, True, 1, [0, 3]),  # 6 groups -> quartile sizes 2, 2, 1, 1
        ("quartile", 0.9, True, 2, [1, 5]),
        ("quartile", 0.9, True, 3, [2]),
        ("quartile", 0.9, True, 4, [4]),
        ("quartile", 0.9, False, 1, [3]),  # 4 candidates -> one each
        ("quartile", 0.9, False, 4, [5]),
    ],
)
def test_strategies_by_hand(strategy, value, include_zero, quartile, expected):
    keep = select_groups(REWARDS, strategy, value, include_zero=include_zero, quartile=quartile)
    assert keep.dtype == torch.bool and keep.shape == (6,)
    assert kept(keep) == expected


def test_std_score_changes_the_mass_but_not_the_order():
    # stds 2.83, 1.41, 0, 4.24, 0, 1.41 (total 9.9): 4.24 < 0.5 * 9.9 = 4.95 <= 4.24 + 2.83
    assert kept(select_groups(REWARDS, "top_p", 0.5, score="std")) == [0, 3]
    assert kept(select_groups(REWARDS, "top_p", 0.5, score="var")) == [3]  # 9 >= 0.5 * 15


def test_reference_numbers_linear_and_softmax_top_p():
    # docs/METHOD.md §4 (worked cases): stds [.52,.52,.3,.3,0,0,0,0], top_p 0.9
    rewards = groups_with_std([0.52, 0.52, 0.3, 0.3, 0, 0, 0, 0])
    assert select_groups(rewards, "top_p", 0.9, score="std").sum() == 4
    assert select_groups(rewards, "top_p_softmax", 0.9, score="std").sum() == 7
    assert select_groups(rewards, "top_p_softmax", 0.9, score="std", include_zero=False).sum() == 4


def test_reference_numbers_with_binary_rewards():
    # 0/1 rewards, 16 rollouts: two p=.5 groups (std .516), two p=1/8 groups (std .342), four all-fail groups
    def group(successes):
        return [1.0] * successes + [0.0] * (16 - successes)

    rewards = t([group(8), group(8), group(2), group(2), group(0), group(0), group(0), group(0)])
    assert kept(select_groups(rewards, "top_p", 0.9, score="std")) == [0, 1, 2, 3]
    assert kept(select_groups(rewards, "top_p_softmax", 0.9, score="std")) == [0, 1, 2, 3, 4, 5, 6]
    assert kept(select_groups(rewards, "top_p_softmax", 0.9, score="std", include_zero=False)) == [0, 1, 2, 3]


def test_reference_numbers_sokoban_scale():
    # docs/METHOD.md §4 (worked cases): stds like [5, 4, 1, .5, 0 ...]: softmax keeps 2, linear keeps 3
    rewards = groups_with_std([5, 4, 1, 0.5, 0, 0, 0, 0])
    assert kept(select_groups(rewards, "top_p", 0.9, score="std")) == [0, 1, 2]
    assert kept(select_groups(rewards, "top_p_softmax", 0.9, score="std")) == [0, 1]


ALL_EQUAL = t([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize(
    "strategy, value, expected",
    [
        ("none", 0.9, [0, 1, 2, 3]),
        ("top_p", 0.9, []),  # nothing to learn from: an empty iteration
        ("top_p", 1.0, [0, 1, 2, 3]),  # the no-filter setting keeps everything
        ("top_p_softmax", 0.9, [0, 1, 2, 3]),  # uniform probabilities: .25 .5 .75 1
        ("top_p_softmax", 0.5, [0, 1]),  # ties by group index
        ("top_k", 0.5, [0, 1]),
        ("min_p", 0.5, [0, 1, 2, 3]),
        ("nonzero", 0.9, []),
    ],
)
def test_all_equal_rewards(strategy, value, expected):
    assert kept(select_groups(ALL_EQUAL, strategy, value)) == expected


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_all_equal_rewards_without_zero_groups_keep_nothing(strategy):
    assert not select_groups(ALL_EQUAL, strategy, 0.5, include_zero=False, quartile=1).any()


def test_single_group():
    rewards = t([[0.0, 1.0, 1.0]])
    for strategy in ("none", "top_p", "top_p_softmax", "top_k", "min_p", "nonzero"):
        assert select_groups(rewards, strategy, 0.5).tolist() == [True]
    assert select_groups(rewards, "quartile", quartile=1).tolist() == [True]
    assert select_groups(rewards, "quartile", quartile=2).tolist() == [False]


def test_one_rollout_per_group_has_zero_variance():
    rewards = t([[0.0], [1.0], [5.0]])
    for score in ("var", "std"):
        assert not select_groups(rewards, "top_p", 0.9, score=score).any()
        assert not select_groups(rewards, "nonzero", score=score).any()
        assert select_groups(rewards, "none", score=score).all()


def test_dynamic_sampling_keeps_the_first_groups_with_reward_variance_and_trims_to_the_target():
    rewards = t([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.0], [2.0, 1.0], [-0.1, -0.1], [0.0, 1.0]])
    # groups 1, 3, 4, 6 have non-zero variance; a target of 2 keeps the first two of them
    assert dynamic_sampling_keep(rewards, 2).tolist() == [False, True, False, True, False, False, False]
    assert dynamic_sampling_keep(rewards, 4).tolist() == [False, True, False, True, True, False, True]
    # fewer qualifying groups than the target: all of them (the caller hits its round cap)
    assert dynamic_sampling_keep(rewards, 6).tolist() == [False, True, False, True, True, False, True]
    assert not dynamic_sampling_keep(rewards, 0).any()
    # the rule is `nonzero`'s, with the trim added
    assert dynamic_sampling_keep(rewards, 7).tolist() == select_groups(rewards, "nonzero").tolist()
    with pytest.raises(ValueError, match="num_groups"):
        dynamic_sampling_keep(rewards, -1)


# ---------------------------------------------------------------- selection laws (hypothesis)

distinct_spreads = st.lists(st.integers(0, 400), min_size=1, max_size=12, unique=True)
strategy_settings = st.sampled_from(
    [
        ("none", 0.9, None),
        ("top_p", 0.3, None),
        ("top_p", 0.9, None),
        ("top_p", 0.98, None),
        ("top_p_softmax", 0.9, None),
        ("top_k", 0.5, None),
        ("top_k", 3, None),
        ("min_p", 0.3, None),
        ("nonzero", 0.9, None),
        ("quartile", 0.9, 1),
        ("quartile", 0.9, 3),
    ]
)


@settings(max_examples=80, deadline=None)
@given(distinct_spreads, strategy_settings, st.booleans(), st.randoms(use_true_random=False))
def test_selection_with_distinct_scores_is_invariant_to_group_order(spreads, setting, include_zero, rng):
    strategy, value, quartile = setting
    rewards = torch.tensor([[0.0, s / 10.0] for s in spreads], dtype=torch.float64)
    permutation = list(range(len(spreads)))
    rng.shuffle(permutation)
    keep = select_groups(rewards, strategy, value, include_zero=include_zero, quartile=quartile)
    permuted = select_groups(rewards[permutation], strategy, value, include_zero=include_zero, quartile=quartile)
    assert torch.equal(permuted, keep[permutation])


reward_matrices = st.integers(1, 10).flatmap(
    lambda g: st.integers(1, 6).flatmap(
        lambda k: st.lists(
            st.lists(st.sampled_from([0.0, 0.1, 1.0, -0.1, 10.0]), min_size=k, max_size=k), min_size=g, max_size=g
        )
    )
)


@settings(max_examples=80, deadline=None)
@given(reward_matrices, st.sampled_from(["var", "std"]), st.booleans())
def test_top_p_one_keeps_every_nonzero_group(rows, score, include_zero):
    rewards = t(rows)
    keep = select_groups(rewards, "top_p", 1.0, score=score, include_zero=include_zero)
    nonzero = reward_variance_scores(rewards, score) > 1e-10
    assert keep[nonzero].all()
    assert keep.all() if include_zero else torch.equal(keep, nonzero)


@settings(max_examples=80, deadline=None)
@given(reward_matrices, st.floats(0.05, 0.99), st.sampled_from(["var", "std"]))
def test_linear_top_p_keeps_the_shortest_prefix_reaching_the_mass(rows, value, score):
    rewards = t(rows)
    scores = reward_variance_scores(rewards, score).double()
    keep = select_groups(rewards, "top_p", value, score=score)
    total = scores.sum().item()
    if scores.max() <= 1e-10:
        assert not keep.any()
        return
    kept_scores = sorted(scores[keep].tolist())
    assert sum(kept_scores) >= value * total * (1 - 1e-5)
    assert sum(kept_scores[1:]) < value * total * (1 + 1e-5)
    if (~keep).any():
        assert min(kept_scores) >= scores[~keep].max().item()


@settings(max_examples=80, deadline=None)
@given(reward_matrices, st.sampled_from([("top_p_softmax", 0.7), ("top_k", 0.5), ("top_k", 2), ("min_p", 0.5)]))
def test_kept_groups_score_at_least_every_dropped_group(rows, setting):
    rewards = t(rows)
    strategy, value = setting
    scores = reward_variance_scores(rewards)
    keep = select_groups(rewards, strategy, value)
    assert keep.any()
    if (~keep).any():
        assert scores[keep].min() >= scores[~keep].max()
    if strategy == "top_k":
        expected = int(value) if value >= 1 else max(1, math.floor(value * len(rows)))
        assert int(keep.sum()) == min(expected, len(rows))


# ---------------------------------------------------------------- trajectory level


def test_select_trajectories_by_hand():
    rewards = t([[3, 1, 2, 0, 5, 4, 6, 7], [1, 1, 1, 1, 1, 1, 1, 1]])
    keep = select_trajectories(rewards, 0.5)  # 2 from each end of 8
    assert kept(keep[0]) == [1, 3, 6, 7]
    assert kept(keep[1]) == [0, 1, 6, 7]  # ties: first in index order at the top, last at the bottom


def test_select_trajectories_edge_cases():
    rewards = t([[0.0, 2.0, 1.0, 3.0]])
    assert kept(select_trajectories(rewards, 0.1)[0]) == [0, 3]  # at least one from each end
    assert select_trajectories(rewards, 1.0).all()
    assert select_trajectories(t([[4.0], [2.0]]), 0.5).all()  # K = 1
    with pytest.raises(ValueError, match="filter.value"):
        select_trajectories(rewards, 0.0)


# ---------------------------------------------------------------- statistics


def test_filter_stats_by_hand():
    rows = [[0, 1, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]]
    stds = [statistics.stdev(r) for r in rows]
    variances = [statistics.pvariance(r) for r in rows]
    stats = filter_stats(t(rows), torch.tensor([True, False, False]))
    expected = {
        "kept_count": 1.0,
        "kept_ratio": 1 / 3,
        "reward_std_mean": statistics.mean(stds),
        "reward_std_max": max(stds),
        "kept_reward_std_mean": stds[0],
        "kept_reward_std_max": stds[0],
        "zero_variance_count": 1.0,
        "rv_cv": statistics.pstdev(variances) / statistics.mean(variances),
        "empty": 0.0,
    }
    assert stats == pytest.approx(expected)
    assert all(isinstance(v, float) for v in stats.values())


def test_filter_stats_at_trajectory_level_count_rollouts():
    # value .5, K = 4: the top and the bottom rollout of each group (ties by index), 6 of 12 rollouts
    rows = [[1.0, 0.0, 0.5, 0.2], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]]
    keep = select_trajectories(t(rows), 0.5)
    assert keep.tolist() == [[True, True, False, False], [True, False, False, True], [False, False, True, True]]
    stats = filter_stats(t(rows), keep)
    # kept rewards per group: {1, 0}, {1, 1}, {0, 1}: stds √½, 0, √½
    assert stats["kept_count"] == 6.0 and stats["kept_ratio"] == 0.5 and stats["empty"] == 0.0
    assert stats["kept_reward_std_mean"] == pytest.approx(2 * math.sqrt(0.5) / 3)
    assert stats["kept_reward_std_max"] == pytest.approx(math.sqrt(0.5))
    # the all-groups statistics do not depend on the level
    group_level = filter_stats(t(rows), torch.ones(3, dtype=torch.bool))
    for key in ("reward_std_mean", "reward_std_max", "zero_variance_count", "rv_cv"):
        assert stats[key] == group_level[key]
    # one kept rollout has std 0; a group keeping none is left out of the kept stds
    one = filter_stats(t(rows), torch.tensor([[True, False, False, False], [False] * 4, [False] * 4]))
    assert one["kept_count"] == 1.0 and one["kept_ratio"] == 1 / 12 and one["kept_reward_std_max"] == 0.0


def test_filter_stats_empty_selection_and_zero_variance():
    stats = filter_stats(t([[1.0, 1.0], [2.0, 2.0]]), torch.zeros(2, dtype=torch.bool))
    assert stats["empty"] == 1.0 and stats["kept_count"] == 0.0 and stats["kept_reward_std_max"] == 0.0
    assert stats["zero_variance_count"] == 2.0 and stats["rv_cv"] == 0.0
    with pytest.raises(ValueError, match="keep"):
        filter_stats(t([[1.0, 1.0]]), torch.ones(2, dtype=torch.bool))


def test_rv_buckets_by_hand():
    # 7 groups, 6 buckets of sizes 2, 1, 1, 1, 1, 1 in ascending order: {0, 1}, {2}, {3}, {4}, {5}, {6}
    scores = t([1, 5, 3, 2, 4, 0, 6])
    assert rv_buckets(scores).tolist() == [0, 4, 2, 1, 3, 0, 5]
    assert rv_buckets(t([2, 2, 2, 2]), num_buckets=2).tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="num_buckets"):
        rv_buckets(scores, num_buckets=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=1, max_size=30), st.integers(1, 8))
def test_rv_buckets_have_equal_counts_and_follow_the_ranking(values, num_buckets):
    scores = torch.tensor(values, dtype=torch.float64)
    buckets = rv_buckets(scores, num_buckets)
    counts = torch.bincount(buckets, minlength=num_buckets)
    assert counts.max() - counts.min() <= 1 and int(counts.sum()) == len(values)
    order = torch.sort(scores, stable=True).indices
    assert (buckets[order].diff() >= 0).all()
