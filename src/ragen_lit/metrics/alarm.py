"""The template-collapse alarm (RAGEN-2): the reasoning Z stops depending on the prompt X — the MI signal falls —
while the reasoning's conditional entropy H(Z|X) stays high, so an entropy monitor alone does not see it.

Definition. Over the stream of diagnostics (one entry per diagnostics iteration, the metric dict that
`collapse.CollapseDiagnostics` returns), the alarm is on at an entry when all three hold:

1. the MI signal fell at each of the last `patience` = k entries: the last k+1 values are strictly decreasing;
2. its total drop over those k+1 values (first minus last) exceeds `min_drop` (so noise does not fire it) and
   is at least `min_relative_drop` of the first of them (a healthy run whose MI z-score wobbles from 6.2 down
   to 5.1 keeps its reasoning input-grounded; template collapse takes the MI towards zero);
3. the conditional entropy of the current entry is at least (1 − `entropy_tolerance`) × its value at the first
   diagnostics of the run: the entropy did not fall with the MI. If it did, the policy has become
   low-entropy and deterministic, the other regime, which is not template collapse. (A rising entropy
   keeps the alarm armed: reasoning that is both random and input-independent is template collapse.)

The MI signal is the first-turn MI-ZScore-EMA (`collapse/first_turn/mi_zscore_ema`, in z-units, compared with
`min_drop`); when an entry lacks it, retrieval accuracy above chance (`retrieval_acc − retrieval_chance`, a
fraction, compared with `min_drop_retrieval`). The two are not comparable, so a change of signal restarts the
window. An entry without a finite MI signal (diagnostics not due, or nothing to score) is no point of the stream;
an entry without a finite entropy cannot satisfy rule 3, so the alarm is off there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

PREFIX = "collapse/first_turn/"
ZSCORE = PREFIX + "mi_zscore_ema"
RETRIEVAL, CHANCE = PREFIX + "retrieval_acc", PREFIX + "retrieval_chance"
COND_ENTROPY = PREFIX + "cond_entropy"


def mi_signal(metrics: Mapping[str, float]) -> tuple[str, float] | None:
    """(signal name, value) of one diagnostics entry: the MI z-score, else retrieval above chance, else None."""
    zscore = metrics.get(ZSCORE)
    if zscore is not None and math.isfinite(zscore):
        return "mi_zscore_ema", float(zscore)
    acc, chance = metrics.get(RETRIEVAL), metrics.get(CHANCE)
    if acc is not None and chance is not None and math.isfinite(acc - chance):
        return "retrieval_above_chance", float(acc - chance)
    return None


def falling_for(values: list[float], patience: int, min_drop: float, min_relative_drop: float = 0.0) -> bool:
    """Rules 1-2: the last patience+1 values strictly decrease, their first minus last exceeds min_drop and is at
    least min_relative_drop x |first|."""
    window = values[-(patience + 1) :]
    return (
        len(window) == patience + 1
        and all(a > b for a, b in zip(window, window[1:]))
        and window[0] - window[-1] > min_drop
        and window[0] - window[-1] >= min_relative_drop * abs(window[0])
    )


def entropy_held(entropy: float, first: float, tolerance: float) -> bool:
    """Rule 3: entropy >= (1 − tolerance) · first, i.e. it fell by at most `tolerance` of its first value."""
    return entropy >= first - tolerance * abs(first)


class CollapseAlarm:
    """Feed it each iteration's metrics with `update`; it keeps the last patience+1 MI values, the first
    diagnostics' entropy and whether it is on. Its state is a plain dict (`state_dict`), for checkpoints."""

    def __init__(
        self,
        patience: int = 3,
        entropy_tolerance: float = 0.25,
        min_drop: float = 0.5,
        min_drop_retrieval: float = 0.1,
        min_relative_drop: float = 0.25,
    ):
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.patience, self.entropy_tolerance = patience, entropy_tolerance
        self.min_relative_drop = min_relative_drop
        self.min_drops = {"mi_zscore_ema": min_drop, "retrieval_above_chance": min_drop_retrieval}
        self.signal: str | None = None
        self.values: list[float] = []
        self.first_entropy: float | None = None
        self.on = False

    def update(self, metrics: Mapping[str, float]) -> bool | None:
        """Add one entry; returns whether the alarm is on, or None (state unchanged) for an entry with no MI signal."""
        point = mi_signal(metrics)
        if point is None:
            return None
        signal, value = point
        if signal != self.signal:
            self.signal, self.values = signal, []
        self.values = [*self.values, value][-(self.patience + 1) :]
        entropy = metrics.get(COND_ENTROPY)
        entropy = float(entropy) if entropy is not None and math.isfinite(entropy) else None
        if self.first_entropy is None:
            self.first_entropy = entropy
        self.on = (
            entropy is not None
            and self.first_entropy is not None
            and falling_for(self.values, self.patience, self.min_drops[signal], self.min_relative_drop)
            and entropy_held(entropy, self.first_entropy, self.entropy_tolerance)
        )
        return self.on

    def state_dict(self) -> dict:
        return {"signal": self.signal, "values": list(self.values), "first_entropy": self.first_entropy, "on": self.on}

    def load_state_dict(self, state: Mapping) -> None:
        self.signal, self.values = state.get("signal"), list(state.get("values", []))
        self.first_entropy, self.on = state.get("first_entropy"), bool(state.get("on", False))
