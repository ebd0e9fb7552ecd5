"""`metrics.gradient_buckets.row_buckets`: each rollout gets its group's reward-variance bucket."""

from __future__ import annotations

import torch

from ragen_lit.metrics.gradient_buckets import row_buckets


def test_row_buckets_rank_groups_by_reward_variance_and_repeat_per_rollout():
    # groups of 2 with variances .25, 0, .0625: bucket 0 is the highest (`rv_buckets`), so 0, 2, 1
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.5, 0.0]], dtype=torch.float64)
    assert row_buckets(rewards, "var", num_buckets=3).tolist() == [0, 0, 2, 2, 1, 1]
    # never more buckets than groups
    assert row_buckets(rewards, "var", num_buckets=6).tolist() == [0, 0, 2, 2, 1, 1]
    # fewer: the ranking is cut into runs of (nearly) equal count, the first one larger
    assert row_buckets(rewards, "var", num_buckets=2).tolist() == [0, 0, 1, 1, 0, 0]
