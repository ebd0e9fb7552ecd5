"""`EnvSetup` follows the config `fit` plays, and the expert's episodes of it carry the config's options."""

from __future__ import annotations

from ragen_lit.agent.rollout import EpisodeLimits
from ragen_lit.config import load_config
from ragen_lit.presets.expert_episodes import EnvSetup


def test_an_extra_env_is_set_up_as_its_config_plays_it():
    cfg = load_config(None, ["env.name=coding", "env.options={max_attempts: 2}", "rollout.max_new_tokens=256"])
    setup = EnvSetup.of(cfg.env, cfg.rollout)
    assert setup.name == "coding" and setup.options == {"max_attempts": 2}
    r = cfg.rollout
    assert setup.limits == EpisodeLimits(
        r.max_turns, r.max_actions_per_turn, r.max_actions_per_episode, 256, r.max_context_tokens, r.format_penalty
    )
    assert setup.make_env().max_attempts == 2
    assert EnvSetup("frozenlake").limits == EpisodeLimits()  # the built-in envs keep the default limits
