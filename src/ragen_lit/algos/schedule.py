"""The learning-rate schedule: a multiplier of the base rate per optimizer step (warm-up, then decay)."""

from __future__ import annotations

import math

from ragen_lit.choices import LR_DECAYS


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, decay: str, min_ratio: float) -> float:
    """Multiplier of the base learning rate for optimizer step `step` (0-based).

    Linear warm-up to 1 over the first `warmup_steps` steps (step s uses (s+1)/warmup_steps), then
    `decay` over the remaining planned steps, with progress t = (s - warmup_steps) / (total_steps -
    warmup_steps) clamped to [0, 1]: `constant` 1, `linear` 1 - (1 - m) t, `cosine`
    m + (1 - m)(1 + cos(pi t)) / 2, where m = `min_ratio` (the multiplier reached at the end).
    """
    if decay not in LR_DECAYS:
        raise ValueError(f"decay must be one of {LR_DECAYS}, got {decay!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant" or total_steps <= warmup_steps:
        return 1.0
    t = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    if decay == "linear":
        return 1.0 - (1.0 - min_ratio) * t
    return min_ratio + (1.0 - min_ratio) * (1.0 + math.cos(math.pi * t)) / 2
