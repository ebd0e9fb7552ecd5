"""DAPO in the data-selection stage: `RolloutDataModule.sample` refills the batch with groups of non-zero reward
variance up to `rollout.groups`, trims an over-filled batch and stops at `algo.max_sampling_rounds`; each round
draws fresh seeds and unique group ids. `shape_overlong` adds R_length per turn. Rollouts come from a fake
`run_rollouts` whose rewards are set per env seed."""

from __future__ import annotations

import logging

import pytest
import torch

from ragen_lit.agent.trajectory import Trajectory, Turn
from ragen_lit.config import load_config
from ragen_lit.training.batch import collate
from ragen_lit.training.data import ROUND_SEED_STRIDE, RolloutDataModule, shape_overlong
from ragen_lit.training.sections import DataSections

SEED, GROUPS, K = 10000, 4, 2


class FakeRollouts(RolloutDataModule):
    """Rollouts without a model: a group whose env seed is in `signal` gets rewards 0, 1, ...; others all 0."""

    def __init__(self, cfg, signal: set[int]):
        super().__init__(cfg)
        self.signal = signal
        self.calls: list[list[int]] = []

    def run_rollouts(self, module, seeds, groups, temperature, seed):
        self.calls.append(sorted(set(seeds)))
        return [
            Trajectory(group=g, seed=s, reward=float(k % K) if s in self.signal else 0.0)
            for k, (s, g) in enumerate(zip(seeds, groups))
        ]


def _data(signal, *overrides):
    cfg = load_config(
        None,
        ["algo=dapo", f"rollout.groups={GROUPS}", f"rollout.group_size={K}", f"rollout.seed={SEED}", *overrides],
    )
    return FakeRollouts(DataSections.of(cfg), signal)


def test_refills_to_a_full_batch_and_trims_the_overfill():
    # round 0: groups 0 and 2 carry signal (2 of 4); round 1: groups 1, 2 and 3 (5 in all: one too many)
    signal = {SEED, SEED + 2} | {SEED + ROUND_SEED_STRIDE + g for g in (1, 2, 3)}
    data = _data(signal)
    everything, batch, metrics = data.sample(None, iteration=0)
    # round r draws fresh env seeds, ROUND_SEED_STRIDE * r above the first round's; group ids 4r + g
    assert data.calls == [[SEED + g for g in range(4)], [SEED + ROUND_SEED_STRIDE + g for g in range(4)]]
    assert sorted({t.group for t in everything}) == list(range(8))
    # the first 4 qualifying groups in (round, group) order: 0, 2, then 5, 6; group 7 is trimmed
    assert sorted({t.group for t in batch}) == [0, 2, 5, 6] and len(batch) == GROUPS * K
    assert metrics == {
        "sampling/rounds": 2.0,
        "sampling/groups_generated": 8.0,
        "sampling/groups_kept": 4.0,
        "sampling/cap_hit": 0.0,
    }


def test_stops_at_the_round_cap_and_trains_on_what_it_kept(caplog):
    # one qualifying group per round, 3 rounds allowed: 3 of the 4 groups, then the cap
    signal = {SEED + ROUND_SEED_STRIDE * r + r for r in range(5)}
    data = _data(signal, "algo.max_sampling_rounds=3")
    with caplog.at_level(logging.WARNING, logger="ragen_lit.training.data"):
        everything, batch, metrics = data.sample(None, iteration=0)
    assert len(data.calls) == 3 and len(everything) == 3 * GROUPS * K
    assert sorted({t.group for t in batch}) == [0, 5, 10]
    assert metrics == {
        "sampling/rounds": 3.0,
        "sampling/groups_generated": 12.0,
        "sampling/groups_kept": 3.0,
        "sampling/cap_hit": 1.0,
    }
    assert [r.getMessage() for r in caplog.records] == [
        "dynamic sampling: 3 of rollout.groups=4 groups with non-zero reward variance after "
        "algo.max_sampling_rounds=3 rounds; iteration 0 trains on those"
    ]
    # the filter then selects among the kept groups only
    keep_rows, stats = data.select(batch)
    assert stats["filter/kept_count"] == 3.0 and len(keep_rows) == 3 * K


def test_a_first_round_with_signal_everywhere_needs_no_refill():
    data = _data({SEED + g for g in range(GROUPS)})
    everything, batch, metrics = data.sample(None, iteration=0)
    assert len(data.calls) == 1 and batch == everything
    assert metrics["sampling/rounds"] == 1.0 and metrics["sampling/cap_hit"] == 0.0


def test_without_dynamic_sampling_one_round_is_the_batch():
    data = _data(set(), "algo.dynamic_sampling=false")
    everything, batch, metrics = data.sample(None, iteration=3)
    assert data.calls == [[SEED + GROUPS * 3 + g for g in range(GROUPS)]]
    assert batch is everything and metrics == {}


def _trajectory(turn_lengths, turn_rewards):
    traj = Trajectory(group=0, seed=0, token_ids=[1, 2])
    for length, reward in zip(turn_lengths, turn_rewards):
        start = len(traj.token_ids)
        traj.append([5] * length, sampled=True)
        traj.turns.append(Turn(start, start + length, "r", ["a"], reward, True))
        traj.append([7, 8], sampled=False)
        traj.reward += reward
    return traj


def test_shape_overlong_adds_each_turns_penalty_to_its_reward_and_to_the_return():
    # L_max = 10, L_cache = round(0.2 * 10) = 2: lengths 8 -> 0, 9 -> -0.5, 10 (cut off) -> -1
    trajectories = [_trajectory([9, 10], [0.0, 1.0]), _trajectory([8], [1.0])]
    shaped, metrics = shape_overlong(trajectories, max_new_tokens=10, cache_fraction=0.2)
    assert [[turn.reward for turn in t.turns] for t in shaped] == [[-0.5, 0.0], [1.0]]
    assert [t.reward for t in shaped] == [-0.5, 1.0]
    assert [t.reward for t in trajectories] == [1.0, 1.0]  # the rollouts themselves are not changed
    assert metrics == {"overlong/penalty_mean": pytest.approx(-0.75), "overlong/penalised_turn_rate": 2 / 3}
    # the shaped return sits on the last sampled token; with turn-level rewards each turn's on its end
    batch = collate(shaped, pad_token_id=0)
    assert batch["token_rewards"][0].sum() == -0.5 and batch["scores"].tolist() == [-0.5, 1.0]
    turn_level = collate(shaped, pad_token_id=0, turn_level_rewards=True)["token_rewards"][0]
    assert turn_level[turn_level != 0].tolist() == [-0.5]  # turn 2's shaped reward is 0.0
    assert torch.equal(turn_level.nonzero().flatten(), torch.tensor([2 + 9 - 1]))


class _RecordingEngine:
    def __init__(self):
        self.calls: list[str] = []

    def sync(self, model):
        self.calls.append("sync")

    def release(self):
        self.calls.append("release")


@pytest.mark.parametrize("fails", [False, True])
def test_every_rollout_syncs_first_and_releases_the_engine_after_it_even_when_it_fails(monkeypatch, fails):
    from types import SimpleNamespace

    from ragen_lit.training import data as data_module

    def fake_rollout(engine, *args):
        engine.calls.append("rollout")
        if fails:
            raise RuntimeError("an env crashed")
        return []

    monkeypatch.setattr(data_module, "rollout", fake_rollout)
    data = RolloutDataModule(DataSections.of(load_config(None, [])))
    data.engine = _RecordingEngine()
    module = SimpleNamespace(inference_policy=lambda: torch.nn.Linear(1, 1), chat=None)
    if fails:
        with pytest.raises(RuntimeError, match="crashed"):
            data.run_rollouts(module, [1], [0], temperature=1.0, seed=0)
    else:
        assert data.run_rollouts(module, [1], [0], temperature=1.0, seed=0) == []
    assert data.engine.calls == ["sync", "rollout", "release"]
