"""Algorithm presets (spec §5): `algo=ppo|dapo|grpo|drgrpo` sets the `AlgoConfig` section in one word;
single fields can then be overridden (`algo=grpo algo.clip_high=0.2`).

| preset | advantage | whitened | loss aggregation        | critic |
|--------|-----------|----------|-------------------------|--------|
| ppo    | gae       | yes      | token-mean              | yes    |
| dapo   | gae       | yes      | token-mean              | yes    |
| grpo   | grpo      | no       | seq-mean-token-mean     | no     |
| drgrpo | drgrpo    | no       | seq-mean-token-sum-norm | no     |
All share clip 0.2 / 0.28 (clip-higher), dual-clip 3, entropy coef 0.001 and no KL loss (k3 if turned
on). DAPO differs from PPO only in intent, as in the reference's main-table script: pair it with
`filter.strategy=nonzero` for DAPO's dynamic sampling (drop groups whose rewards are all equal).
GRPO-family advantages are already normalised per group, so they are not whitened again.
"""

from __future__ import annotations

ADVANTAGE_ESTIMATORS = ("gae", "bilevel_gae", "grpo", "drgrpo", "rloo")
_CRITIC_ESTIMATORS = ("gae", "bilevel_gae")

# Each preset lists only where it differs from the `AlgoConfig` defaults, which are PPO's: the config
# resolves `algo=<name>` to defaults + these fields (+ any `algo.x=y` overrides).
PRESETS: dict[str, dict[str, object]] = {
    "ppo": {},
    "dapo": {},
    "grpo": {"advantage": "grpo", "whiten_advantages": False, "loss_agg": "seq-mean-token-mean"},
    "drgrpo": {"advantage": "drgrpo", "whiten_advantages": False, "loss_agg": "seq-mean-token-sum-norm"},
}


def uses_critic(advantage: str) -> bool:
    """Whether the advantage estimator needs a value model (GAE family) or not (group baselines)."""
    if advantage not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"algo.advantage must be one of {ADVANTAGE_ESTIMATORS}, got {advantage!r}")
    return advantage in _CRITIC_ESTIMATORS
