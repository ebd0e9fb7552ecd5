import dataclasses

import pytest

from ragen_lit.algos import ADVANTAGE_ESTIMATORS, PRESETS, uses_critic
from ragen_lit.config import AlgoConfig, load_config

# Every preset's resolved `algo` section as it was when the presets still restated every field; the
# presets are now differences from the `AlgoConfig` defaults and must resolve to exactly these values.
SHARED = {
    "gamma": 1.0,
    "lam": 1.0,
    "high_level_gamma": 0.95,
    "clip_low": 0.2,
    "clip_high": 0.28,
    "dual_clip": 3.0,
    "entropy_coef": 0.001,
    "kl_coef": 0.0,
    "kl_estimator": "k3",
    "value_clip": 0.5,
    "ppo_epochs": 1,
    "turn_level_rewards": False,
}
RESOLVED = {
    "ppo": {**SHARED, "advantage": "gae", "whiten_advantages": True, "loss_agg": "token-mean"},
    "dapo": {**SHARED, "advantage": "gae", "whiten_advantages": True, "loss_agg": "token-mean"},
    "grpo": {**SHARED, "advantage": "grpo", "whiten_advantages": False, "loss_agg": "seq-mean-token-mean"},
    "drgrpo": {**SHARED, "advantage": "drgrpo", "whiten_advantages": False, "loss_agg": "seq-mean-token-sum-norm"},
}


@pytest.mark.parametrize("name", sorted(RESOLVED))
def test_each_preset_resolves_to_the_same_fields_as_before(name):
    resolved = dataclasses.asdict(load_config(None, [f"algo={name}"]).algo)
    assert resolved == {"name": name, **RESOLVED[name]}
    assert type(resolved["whiten_advantages"]) is bool and type(resolved["ppo_epochs"]) is int


def test_presets_name_only_fields_that_differ_from_the_defaults():
    assert set(PRESETS) == set(RESOLVED)
    defaults = dataclasses.asdict(AlgoConfig())
    assert PRESETS["ppo"] == {}
    for preset in PRESETS.values():
        assert preset.keys() <= defaults.keys() - {"name"}
        assert all(value != defaults[key] for key, value in preset.items())


def test_uses_critic():
    assert [uses_critic(a) for a in ADVANTAGE_ESTIMATORS] == [True, True, False, False, False]
    assert [uses_critic(RESOLVED[name]["advantage"]) for name in ("ppo", "dapo", "grpo", "drgrpo")] == [
        True,
        True,
        False,
        False,
    ]
    with pytest.raises(ValueError, match="algo.advantage"):
        uses_critic("a2c")
