"""The seeds a run derives (`ragen_lit.seeds`) are the ones every run so far used: the numbers below were computed
from the formulas as they stood before `derive_seed` named them, and the runs on the results page reproduce from
them. Each is checked at the helper and at the site that draws with it, through the real code path."""

from __future__ import annotations

import types

import pytest
import torch

from ragen_lit.agent.trajectory import Trajectory
from ragen_lit.config import load_config
from ragen_lit.metrics import collapse
from ragen_lit.seeds import DIAGNOSTIC_DRAWS, MINIBATCH_ORDER, ROLLOUT_SAMPLING, derive_seed
from ragen_lit.training import data
from ragen_lit.training.data import ROUND_SEED_STRIDE, RolloutDataModule
from ragen_lit.training.sections import DataSections


@pytest.mark.parametrize(
    "base, stream, offset, seed",
    [
        (0, ROLLOUT_SAMPLING, 0, 0),
        (3, ROLLOUT_SAMPLING, 5, 300014),
        (3, ROLLOUT_SAMPLING, 5 + 2 * ROUND_SEED_STRIDE, 200300014),
        (12345, ROLLOUT_SAMPLING, 399 + ROUND_SEED_STRIDE, 1334537434),
        (0, MINIBATCH_ORDER, 0, 0),
        (3, MINIBATCH_ORDER, 17, 23774),
        (12345, MINIBATCH_ORDER, 399, 97760454),
        (1, DIAGNOSTIC_DRAWS, 0, 1000003),
        (48, DIAGNOSTIC_DRAWS, 0, 48000144),
        (200, DIAGNOSTIC_DRAWS, 0, 200000600),
    ],
)
def test_derived_seeds_are_todays(base, stream, offset, seed):
    assert derive_seed(base, stream, offset) == seed


class RecordingRollouts(RolloutDataModule):
    """Rollouts without a model (every reward 0); records the sampling seed of each call."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.sampling_seeds = []

    def run_rollouts(self, module, seeds, groups, temperature, seed):
        self.sampling_seeds.append(seed)
        return [Trajectory(group=g, seed=s, reward=0.0) for s, g in zip(seeds, groups)]


def test_the_rollouts_of_each_sampling_round_get_todays_seed():
    cfg = load_config(None, ["algo=dapo", "algo.max_sampling_rounds=3", "trainer.seed=3", "rollout.groups=2"])
    rollouts = RecordingRollouts(DataSections.of(cfg))
    rollouts.sample(None, iteration=5)  # no group has reward variance: all 3 rounds run
    assert rollouts.sampling_seeds == [300014, 100300014, 200300014]


def test_the_minibatch_order_gets_todays_seed(monkeypatch):
    seeds = []
    monkeypatch.setattr(data, "plan_minibatches", lambda *args: seeds.append(args[-1].initial_seed()) or [])
    monkeypatch.setattr(data, "collate", lambda *args, **kwargs: {})
    rollouts = RecordingRollouts(DataSections.of(load_config(None, ["trainer.seed=12345", "rollout.groups=2"])))
    rollouts.select = lambda sampled: (list(range(len(sampled))), {"filter/kept_ratio": 1.0})
    module = types.SimpleNamespace(
        device=torch.device("cpu"),
        pad_token_id=0,
        collapse_diagnostics=lambda trajectories, iteration: {},
        gradient_buckets=lambda trajectories, iteration: {},
        prepare_batch=lambda batch, keep_ratio: {},
    )
    rollouts.trainer = types.SimpleNamespace(lightning_module=module, current_epoch=399)
    rollouts.train_dataloader()
    assert seeds == [97760454]


def test_the_diagnostics_draw_gets_todays_seed(monkeypatch):
    class Drawn(Exception):
        pass

    def recording_random(seed):
        seeds.append(seed)
        raise Drawn  # the seed is all this test reads

    seeds = []
    monkeypatch.setattr(collapse, "random", types.SimpleNamespace(Random=recording_random))
    diagnostics = collapse.CollapseDiagnostics(load_config(None, ["diagnostics.every_n_iterations=2"]).diagnostics)
    with pytest.raises(Drawn):
        diagnostics.maybe_compute(None, None, [], iteration=48)
    assert seeds == [48000144]
