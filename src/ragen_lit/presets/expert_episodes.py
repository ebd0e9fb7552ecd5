"""The scripted expert's episodes of an env as `fit` plays it: the SFT data of the tiny model's build
(`tiny/build.py`) and of `python -m ragen_lit warm-start` (`training/warm_start.py`).

`EnvSetup` is an env with the options and episode limits of a config; `expert_episodes` runs any engine
(the `ExpertEngine` of `tiny/expert.py`) through the real rollout loop on it, so the trajectories hold
exactly the token ids and loss masks RL later samples and scores, in the chat template of the tokenizer
that renders them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.rollout import EpisodeLimits, rollout
from ragen_lit.agent.trajectory import Trajectory
from ragen_lit.config import EnvConfig, RolloutConfig
from ragen_lit.engines.base import Engine, SamplingParams
from ragen_lit.envs import make_env
from ragen_lit.errors import ConfigError

# First seed of the expert's SFT episodes: far from validation (123..) and RL training (10000 + 8 * iteration + group).
SFT_SEED = 6_000_000


@dataclass(frozen=True)
class EnvSetup:
    """An env as `fit` plays it: its constructor options and episode limits (`conf/<env>.yaml` has them). The
    expert's episodes of an extra env use the same ones, so the model imitates the prompts RL will show it
    (attempts, searches and actions per turn are stated in them) at the reply length RL allows."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    limits: EpisodeLimits = EpisodeLimits()

    @classmethod
    def of(cls, env: EnvConfig, rollout: RolloutConfig) -> EnvSetup:
        """The env a config's `env` section names, with its options and `rollout`'s episode limits."""
        return cls(env.name, dict(env.options), EpisodeLimits.of(rollout))

    def make_env(self):
        return make_env(self.name, **self.options)


def expert_episodes(
    expert: Engine,
    chat: ChatFormat,
    setup: EnvSetup,
    first_seed: int,
    count: int,
    max_new_tokens: int | None = None,
    held_out: Sequence[int] = (),
) -> list[Trajectory]:
    """`count` expert episodes of `setup`'s env, options and limits (`max_new_tokens` overrides its reply budget),
    on the seeds `episode_seeds` draws from `first_seed` on, none playing the task of a `held_out` seed."""
    if count <= 0:
        return []
    seeds = episode_seeds(setup.make_env().item_count, first_seed, count, held_out)
    limits = setup.limits
    if max_new_tokens is not None:
        limits = dataclasses.replace(limits, max_new_tokens=max_new_tokens)
    return rollout(expert, setup.make_env, seeds, seeds, chat, limits, SamplingParams())


def episode_seeds(item_count: int | None, first_seed: int, count: int, held_out: Sequence[int] = ()) -> list[int]:
    """`count` seeds from `first_seed` upwards, skipping those that play the same task as a `held_out` seed.

    An env that reads its tasks from a data set plays item `seed % item_count` (`TextEnv.item_count`), so
    seed 6,000,123 is validation seed 123's task when there are 1,000 items: warm-start episodes on it
    would let validation measure recall. Envs that generate every instance from its seed (`item_count`
    None) get `first_seed, first_seed + 1, ...` as they are; so does any env whose first `count` seeds
    miss the held-out items already (the four envs of the shipped model, whose build this leaves as it was).
    """
    if item_count is None:
        return list(range(first_seed, first_seed + count))
    blocked = {seed % item_count for seed in held_out}
    if len(blocked) >= item_count:
        raise ConfigError(
            f"every one of the env's {item_count} tasks is a validation task of seeds {held_out}: "
            "nothing left to train on"
        )
    seeds, seed = [], first_seed
    while len(seeds) < count:
        if seed % item_count not in blocked:
            seeds.append(seed)
        seed += 1
    return seeds
