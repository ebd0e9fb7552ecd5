"""`RolloutDataModule.select` at `filter.level=trajectory`: the kept rows, and a keep rate that counts rollouts."""

from __future__ import annotations

from types import SimpleNamespace

from ragen_lit.config import load_config
from ragen_lit.training.data import RolloutDataModule
from ragen_lit.training.sections import DataSections


def test_trajectory_level_keeps_rollouts_and_reports_their_share():
    cfg = load_config(None, ["filter.level=trajectory", "filter.value=0.5", "rollout.group_size=4"])
    rewards = [[1.0, 0.0, 0.5, 0.2], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]]
    trajectories = [SimpleNamespace(reward=r, group=g) for g, row in enumerate(rewards) for r in row]
    keep_rows, stats = RolloutDataModule(DataSections.of(cfg)).select(trajectories)
    # the top and the bottom rollout of each group (ties by index): 6 of the 12
    assert keep_rows == [0, 1, 4, 7, 10, 11]
    # it was 1.0 (every group keeps some rollout), and the update's keep rate with it
    assert stats["filter/kept_ratio"] == 0.5 and stats["filter/kept_count"] == 6.0
