"""The names config fields accept, one tuple per concept, the algorithm presets and the range rule of `filter.value`:
torch-free, one source each.

`config` validates against these, so loading a config imports no torch, transformers or Lightning; the rooms that
implement each name (`algos`, `filtering`, `engines`, `models`, the cross-scorer) import the same tuple from here
and check their own arguments against it.

Algorithm presets (docs/METHOD.md §5): `algo=ppo|dapo|grpo|drgrpo|gigpo` sets the `AlgoConfig` section in one word;
single fields can then be overridden (`algo=grpo algo.clip_high=0.2`).

| preset | advantage | whitened | loss aggregation        | critic | dynamic sampling | overlong shaping |
|--------|-----------|----------|-------------------------|--------|------------------|------------------|
| ppo    | gae       | yes      | token-mean              | yes    | no               | no               |
| dapo   | grpo      | (no)     | token-mean              | no     | yes (4 rounds)   | L_cache 0.2·L_max |
| grpo   | grpo      | no       | seq-mean-token-mean     | no     | no               | no               |
| drgrpo | drgrpo    | no       | seq-mean-token-sum-norm | no     | no               | no               |
| gigpo  | gigpo     | no       | seq-mean-token-mean     | no     | no               | no               |
All share clip 0.2 / 0.28 (clip-higher), dual-clip 3, entropy coef 0.001 and no KL loss (k3 if turned
on). GRPO-family advantages are already normalised per group, so they are not whitened again (the `dapo`
preset keeps `whiten_advantages` on; it acts only on a GAE advantage, see below).

`dapo` is DAPO as Yu et al. 2025 define it: group-relative advantages (r − mean) / std, token-level loss
aggregation over all tokens of the mini-batch, clip-higher, no KL, dynamic sampling (`algo.dynamic_sampling`:
refill the batch with groups of non-zero reward variance, `filtering.dynamic_sampling_keep`) and overlong
reward shaping (`algo.overlong_cache_fraction`, `reward_shaping.overlong_penalty`: L_cache = 0.2·L_max, the
paper's 4096 of 20480). It keeps the shared entropy bonus and dual-clip, which DAPO's objective does not
have: `algo.entropy_coef=0 algo.dual_clip=0` gives the bare objective.

The RAGEN reference's "DAPO" (its main-table row, and so the paper's) is GAE with a critic + whitening +
token-mean + clip-higher + no KL, without dynamic sampling or length shaping: this project's PPO preset
field for field. `algo=dapo algo.advantage=gae` turns the critic and whitened GAE back on under DAPO's
sampling and shaping; `algo=dapo algo.advantage=gae algo.dynamic_sampling=false algo.overlong_cache_fraction=0`
is the reference's DAPO exactly.

`gigpo` is GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"): GRPO's
episode-level group advantage plus a step-level one over anchor states, the identical environment states
that several rollouts of a group visit (`advantages.gigpo_advantages`). Each turn's tokens get
`gigpo_episode_weight`·A^E + `gigpo_step_weight`·A^S, A^S normalising the turn's discounted return
(discount `gigpo_gamma`, 0.95 as in the paper) among the group's turns taken in the same state. The
preset carries each turn's reward on its own end token (`turn_level_rewards`), which the step returns
are summed from. What "identical" means is the env's `state_key` (FrozenLake: the player's cell; Sokoban:
player and boxes); an env without one refuses `gigpo` at config time.
"""

from __future__ import annotations

import math

# -- algorithms (`algos`) ------------------------------------------------------------------------------
ADVANTAGE_ESTIMATORS = ("gae", "bilevel_gae", "grpo", "drgrpo", "rloo", "gigpo")
_CRITIC_ESTIMATORS = ("gae", "bilevel_gae")
KEEP_RATE_SCALINGS = ("none", "linear", "sqrt")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
LR_DECAYS = ("constant", "linear", "cosine")

# Each preset lists only where it differs from the `AlgoConfig` defaults, which are PPO's: the config
# resolves `algo=<name>` to defaults + these fields (+ any `algo.x=y` overrides).
PRESETS: dict[str, dict[str, object]] = {
    "ppo": {},
    "dapo": {"advantage": "grpo", "dynamic_sampling": True, "overlong_cache_fraction": 0.2},
    "grpo": {"advantage": "grpo", "whiten_advantages": False, "loss_agg": "seq-mean-token-mean"},
    "drgrpo": {"advantage": "drgrpo", "whiten_advantages": False, "loss_agg": "seq-mean-token-sum-norm"},
    "gigpo": {
        "advantage": "gigpo",
        "whiten_advantages": False,
        "loss_agg": "seq-mean-token-mean",
        "turn_level_rewards": True,
    },
}


def uses_critic(advantage: str) -> bool:
    """Whether the advantage estimator needs a value model (GAE family) or not (group baselines)."""
    if advantage not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"algo.advantage must be one of {ADVANTAGE_ESTIMATORS}, got {advantage!r}")
    return advantage in _CRITIC_ESTIMATORS


# -- the reward-variance filter (`filtering`) --------------------------------------------------------------
STRATEGIES = ("none", "top_p", "top_p_softmax", "top_k", "min_p", "nonzero", "quartile")
SCORES = ("var", "std")


# `filter.value`'s range per strategy (at filter.level=trajectory, under the key "trajectory"): the range in words
# and its test
FILTER_VALUE_RANGES = {
    "trajectory": ("in (0, 1] (the share of each group's rollouts kept; 0 keeps none)", lambda v: 0.0 < v <= 1.0),
    "top_p": ("in (0, 1] (0 keeps no group)", lambda v: 0.0 < v <= 1.0),
    "top_p_softmax": ("in (0, 1] (0 keeps no group)", lambda v: 0.0 < v <= 1.0),
    "min_p": ("in [0, 1]", lambda v: 0.0 <= v <= 1.0),
    "top_k": (
        "a fraction in (0, 1) or a whole count >= 1 (0 keeps no group)",
        lambda v: 0.0 < v < 1.0 or v == int(v) >= 1,
    ),
}


def filter_value_error(strategy: str, value: object, level: str = "group") -> str | None:
    """The one range rule of `filter.value` (`FILTER_VALUE_RANGES`): None where `value` is allowed for `strategy` at
    `level`, else the one-line error naming the key, the value and the range allowed. `config` raises it as a
    ConfigError before a run starts and `filtering` as a ValueError on its own arguments, so the filters take every
    config that loads. At the group level `top_p` and `top_p_softmax` read a mass (1 keeps every group), `min_p` a
    ratio of the best score, `top_k` a fraction of the groups or a count; the other strategies do not read it."""
    trajectory = level == "trajectory"
    rule = FILTER_VALUE_RANGES.get("trajectory" if trajectory else strategy)
    if rule is None:
        return None
    allowed, fits = rule
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and fits(value):
        return None
    scope = "filter.level=trajectory" if trajectory else f"filter.strategy={strategy}"
    return f"filter.value={value!r} is out of range for {scope}; it must be {allowed}"


# -- rollout engines (`engines`) ---------------------------------------------------------------------------
ENGINES = ("hf", "vllm")
# the transformers engine's decode loops
HF_CACHE_MODES = ("auto", "dynamic", "static", "graph")

# -- models (`models`) -------------------------------------------------------------------------------------
# floating dtypes by their torch names (`models.DTYPES` maps them to torch dtypes)
DTYPE_NAMES = ("bfloat16", "float16", "float32")
ATTENTION_IMPLEMENTATIONS = ("auto", "sdpa", "flex_attention", "eager")
# the sdpa kernels a masked attention may use (`models.gqa_attention.MASKED_ATTENTION`)
MASKED_ATTENTION_KERNELS = ("auto", "efficient")
# the cross-scorer's attention (`diagnostics.attention`): "varlen" packs rows over shared prefixes
# (`models.prefix_attention`); the others are masked sdpa over gathered prefixes
SCORER_ATTENTION = ("varlen", *MASKED_ATTENTION_KERNELS)

# -- experiment trackers (`run.loggers`) --------------------------------------------------------------------
# the Lightning loggers `logging.loggers` may name; MLflow holds the run's record and is always among them
LOGGERS = ("mlflow", "tensorboard", "csv", "wandb")
WANDB_MODES = ("offline", "online")
