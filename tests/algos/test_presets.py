import dataclasses

import pytest

from ragen_lit.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGG_MODES, PRESETS, uses_critic
from ragen_lit.config import AlgoConfig

FIELDS = {
    "advantage", "gamma", "lam", "high_level_gamma", "whiten_advantages", "clip_low", "clip_high",
    "dual_clip", "loss_agg", "entropy_coef", "kl_coef", "kl_estimator", "value_clip", "ppo_epochs",
}


def test_every_preset_sets_every_field_with_a_valid_value():
    assert set(PRESETS) == {"ppo", "dapo", "grpo", "drgrpo"}
    for preset in PRESETS.values():
        assert set(preset) == FIELDS
        assert preset["advantage"] in ADVANTAGE_ESTIMATORS
        assert preset["loss_agg"] in LOSS_AGG_MODES
        assert preset["kl_estimator"] in KL_ESTIMATORS
        assert (preset["clip_low"], preset["clip_high"], preset["entropy_coef"]) == (0.2, 0.28, 0.001)


def test_presets_follow_spec_section_5():
    combos = {
        name: (p["advantage"], p["whiten_advantages"], p["loss_agg"], p["kl_coef"]) for name, p in PRESETS.items()
    }
    assert combos == {
        "ppo": ("gae", True, "token-mean", 0.0),
        "dapo": ("gae", True, "token-mean", 0.0),
        "grpo": ("grpo", False, "seq-mean-token-mean", 0.0),
        "drgrpo": ("drgrpo", False, "seq-mean-token-sum-norm", 0.0),
    }


def test_ppo_preset_equals_the_algo_config_defaults():
    defaults = {f.name: f.default for f in dataclasses.fields(AlgoConfig) if f.name in FIELDS}
    assert defaults == PRESETS["ppo"]


def test_uses_critic():
    assert [uses_critic(a) for a in ADVANTAGE_ESTIMATORS] == [True, True, False, False, False]
    assert [uses_critic(PRESETS[name]["advantage"]) for name in ("ppo", "dapo", "grpo", "drgrpo")] == [
        True, True, False, False,
    ]
    with pytest.raises(ValueError, match="algo.advantage"):
        uses_critic("a2c")
