"""The algorithm core as pure tensor functions (no Lightning): advantages, losses, reward shaping, the learning-rate
schedule. The presets and the names each function accepts live in `ragen_lit.choices` (torch-free, for the config)
and are re-exported here."""

from ragen_lit.algos.advantages import (
    KEEP_RATE_SCALINGS,
    anchored_step_fraction,
    bilevel_gae,
    broadcast_to_tokens,
    estimate_advantages,
    gae,
    gigpo_advantages,
    group_normalized_advantages,
    rloo_advantages,
    scale_by_keep_rate,
    whiten,
)
from ragen_lit.algos.losses import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    actor_loss,
    aggregate_loss,
    kl_penalty,
    policy_loss,
    value_loss,
)
from ragen_lit.algos.reward_shaping import overlong_penalty
from ragen_lit.algos.schedule import LR_DECAYS, lr_factor
from ragen_lit.choices import ADVANTAGE_ESTIMATORS, PRESETS, uses_critic

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KEEP_RATE_SCALINGS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "LR_DECAYS",
    "PRESETS",
    "actor_loss",
    "anchored_step_fraction",
    "aggregate_loss",
    "bilevel_gae",
    "broadcast_to_tokens",
    "estimate_advantages",
    "gae",
    "gigpo_advantages",
    "group_normalized_advantages",
    "kl_penalty",
    "lr_factor",
    "overlong_penalty",
    "policy_loss",
    "rloo_advantages",
    "scale_by_keep_rate",
    "uses_critic",
    "value_loss",
    "whiten",
]
