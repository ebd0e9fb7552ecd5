"""`metrics.gradient_buckets`: each rollout gets its group's reward-variance bucket, q1 the lowest (the
paper's Q1 → Q6 ascending order), and each bucket's mean RV is logged as `grad/rv/q{b}`."""

from __future__ import annotations

import pytest
import torch

from ragen_lit.metrics.gradient_buckets import bucket_reward_variance, row_buckets

# groups of 2 rollouts; Var (ddof=0) of [a, 0] is (a/2)²: .25, 0, .0625, .01, .16, .09
SIX_GROUPS = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.5, 0.0], [0.2, 0.0], [0.8, 0.0], [0.6, 0.0]], dtype=torch.float64)


def test_row_buckets_rank_groups_by_ascending_reward_variance_and_repeat_per_rollout():
    # variances .25, 0, .0625: bucket 0 is the lowest, so 2, 0, 1
    rewards = SIX_GROUPS[:3]
    assert row_buckets(rewards, "var", num_buckets=3).tolist() == [2, 2, 0, 0, 1, 1]
    # never more buckets than groups
    assert row_buckets(rewards, "var", num_buckets=6).tolist() == [2, 2, 0, 0, 1, 1]
    # fewer: the ranking is cut into runs of (nearly) equal count, the first one larger
    assert row_buckets(rewards, "var", num_buckets=2).tolist() == [1, 1, 0, 0, 0, 0]


def test_bucket_1_holds_the_lowest_variance_groups_and_the_rv_values_ascend():
    # ascending: g1 (0), g3 (.01), g2 (.0625), g5 (.09), g4 (.16), g0 (.25)
    assert row_buckets(SIX_GROUPS, "var").tolist() == [5, 5, 0, 0, 2, 2, 1, 1, 4, 4, 3, 3]
    rv = bucket_reward_variance(SIX_GROUPS, "var")
    assert list(rv) == [f"grad/rv/q{b}" for b in range(1, 7)]
    assert list(rv.values()) == pytest.approx([0.0, 0.01, 0.0625, 0.09, 0.16, 0.25])
    assert rv["grad/rv/q1"] < rv["grad/rv/q6"]
    # three buckets of two groups: the mean of each pair's variances
    rv3 = bucket_reward_variance(SIX_GROUPS, "var", num_buckets=3)
    assert list(rv3.values()) == pytest.approx([0.005, (0.0625 + 0.09) / 2, (0.16 + 0.25) / 2])
