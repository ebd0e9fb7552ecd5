"""`choices`: the algorithm presets resolve to their sections, `uses_critic`, and the module stays free of torch."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_lit.choices import ADVANTAGE_ESTIMATORS, PRESETS, uses_critic
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
    "gigpo_gamma": 0.95,
    "gigpo_episode_weight": 1.0,
    "gigpo_step_weight": 1.0,
    "gigpo_std_normalize": True,
}
NO_DAPO = {"dynamic_sampling": False, "max_sampling_rounds": 4, "overlong_cache_fraction": 0.0}
# DAPO (Yu et al. 2025): group-relative advantages, token-mean, clip-higher, no KL, dynamic sampling, overlong
# shaping with L_cache = 0.2 L_max; whitening stays on (it acts on GAE only: `algo=dapo algo.advantage=gae`)
RESOLVED = {
    "ppo": {**SHARED, **NO_DAPO, "advantage": "gae", "whiten_advantages": True, "loss_agg": "token-mean"},
    "dapo": {
        **SHARED,
        "advantage": "grpo",
        "whiten_advantages": True,
        "loss_agg": "token-mean",
        "dynamic_sampling": True,
        "max_sampling_rounds": 4,
        "overlong_cache_fraction": 0.2,
    },
    "grpo": {**SHARED, **NO_DAPO, "advantage": "grpo", "whiten_advantages": False, "loss_agg": "seq-mean-token-mean"},
    "drgrpo": {
        **SHARED,
        **NO_DAPO,
        "advantage": "drgrpo",
        "whiten_advantages": False,
        "loss_agg": "seq-mean-token-sum-norm",
    },
    # GiGPO (Feng et al. 2025): GRPO's episode advantage + anchor-state step advantages from per-turn rewards
    "gigpo": {
        **SHARED,
        **NO_DAPO,
        "advantage": "gigpo",
        "whiten_advantages": False,
        "loss_agg": "seq-mean-token-mean",
        "turn_level_rewards": True,
    },
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
    assert [uses_critic(a) for a in ADVANTAGE_ESTIMATORS] == [True, True, False, False, False, False]
    assert [uses_critic(RESOLVED[name]["advantage"]) for name in ("ppo", "dapo", "grpo", "drgrpo")] == [
        True,
        False,
        False,
        False,
    ]
    with pytest.raises(ValueError, match="algo.advantage"):
        uses_critic("a2c")


def test_the_references_dapo_is_ppo_field_for_field():
    """The paper's DAPO row (the RAGEN reference's DAPO: GAE + whitening + token-mean + clip-higher, no KL, no
    dynamic sampling or length shaping) stays reachable from `algo=dapo` by the override the presets document."""
    reference = load_config(
        None, ["algo=dapo", "algo.advantage=gae", "algo.dynamic_sampling=false", "algo.overlong_cache_fraction=0"]
    ).algo
    assert {**dataclasses.asdict(reference), "name": "ppo"} == dataclasses.asdict(load_config(None, ["algo=ppo"]).algo)


def test_loading_a_config_imports_no_torch_transformers_or_lightning():
    """The config names its choices from `choices`; a tool that only reads or checks a config stays light."""
    script = (
        "import sys, ragen_lit.config as c; c.load_config('conf/frozenlake.yaml', ['algo=ppo']); "
        "print(sorted(m for m in ('torch', 'transformers', 'lightning') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
