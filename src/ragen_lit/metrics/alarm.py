"""The template-collapse alarm (RAGEN-2): the reasoning Z stops depending on the prompt X — the MI signal falls —
while the reasoning's conditional entropy H(Z|X) does not, so an entropy monitor alone does not see it.

Definition. The stream is one entry per diagnostics iteration (the metric dict `collapse.CollapseDiagnostics`
returns). The MI signal is first-turn retrieval accuracy above its chance level (`retrieval_acc − retrieval_chance`:
how much better than chance the cross-scorer tells which prompt a reasoning came from); H is the first-turn H(Z|X).
The first `baseline` entries set the run's levels: B = their mean signal, H₀ = their mean H. From then on, over the
last `window` entries after those, the alarm is on when both hold:

1. the window's mean signal is at most `mi_fraction` × B: the reasoning lost most of its input dependence;
2. the window's mean H is at least `entropy_floor` × H₀: it did not lose its diversity with it. If it did, the policy
   became low-entropy and deterministic, the other regime, which is not template collapse. (A rising entropy keeps
   the alarm armed: see "What it fires on".)

Means over a window, not single entries: one diagnostics iteration scores at most `diagnostics.num_samples`
reasonings, and its retrieval accuracy moves by several points between iterations of a healthy run. The defaults
(3, 3, 0.2, 0.8) were chosen on 99 logged tiny-model Sokoban runs. An entry without a finite signal or entropy
(diagnostics not due, or nothing to score) is no point of the stream.

What it fires on. Rule 2 bounds H(Z|X) from below only, so the alarm fires on any loss of input dependence that is
not a low-entropy collapse: template collapse, where the entropies stay in their healthy band, and an entropy
blow-up, where the reasoning dissolves into input-agnostic fragments as entropy rises, alike. An entropy monitor that
also watches rises sees the second one too. `compare --collapse` (`analysis.collapse`) tells the regimes apart and
sets a one-sided and a two-sided entropy monitor beside the alarm; docs/REPRODUCTION.md ("Template collapse at the
shipped defaults", "MI loss under an entropy blow-up") gives their hits, false alarms and lead times.

One alarm at two layers: this module is the detector (`CollapseAlarm`, plain Python on a stream of metric dicts, so
`compare --collapse` replays it on logged runs); `training.alarm` is its Lightning side in `fit` (the callback that
feeds it each iteration's diagnostics, logs `collapse/alarm` and acts on `diagnostics.on_collapse`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

PREFIX = "collapse/first_turn/"
RETRIEVAL, CHANCE = PREFIX + "retrieval_acc", PREFIX + "retrieval_chance"
COND_ENTROPY = PREFIX + "cond_entropy"


def point(metrics: Mapping[str, float]) -> tuple[float, float] | None:
    """(retrieval above chance, H(Z|X)) of one diagnostics entry, None when either is missing or not finite."""
    acc, chance, entropy = (metrics.get(key) for key in (RETRIEVAL, CHANCE, COND_ENTROPY))
    if acc is None or chance is None or entropy is None:
        return None
    values = (float(acc) - float(chance), float(entropy))
    return values if all(math.isfinite(v) for v in values) else None


def collapsed(
    signal: float, entropy: float, base_signal: float, base_entropy: float, mi_fraction: float, entropy_floor: float
) -> bool:
    """Rules 1-2 on a window's means against the run's baseline levels."""
    return signal <= mi_fraction * base_signal and entropy >= entropy_floor * base_entropy


class CollapseAlarm:
    """Feed it each iteration's metrics with `update`; it keeps the baseline entries, the last `window` entries after
    them and whether it is on. Its state is a plain dict (`state_dict`), for checkpoints."""

    def __init__(self, baseline: int = 3, window: int = 3, mi_fraction: float = 0.2, entropy_floor: float = 0.8):
        if baseline < 1 or window < 1:
            raise ValueError(f"baseline and window must be >= 1, got {baseline} and {window}")
        if not 0 < mi_fraction < 1 or not 0 <= entropy_floor <= 1:
            raise ValueError(
                f"mi_fraction must be in (0, 1) and entropy_floor in [0, 1], got {mi_fraction}, {entropy_floor}"
            )
        self.baseline, self.window = baseline, window
        self.mi_fraction, self.entropy_floor = mi_fraction, entropy_floor
        self.base: list[tuple[float, float]] = []  # the first `baseline` entries
        self.recent: list[tuple[float, float]] = []  # the last `window` entries after them
        self.on = False

    def levels(self) -> tuple[float, float, float, float] | None:
        """(window mean signal, window mean H, baseline signal, baseline H), None before the window has filled."""
        if len(self.base) < self.baseline or len(self.recent) < self.window:
            return None
        signal, entropy = (sum(values) / len(values) for values in zip(*self.recent))
        base_signal, base_entropy = (sum(values) / len(values) for values in zip(*self.base))
        return signal, entropy, base_signal, base_entropy

    def update(self, metrics: Mapping[str, float]) -> bool | None:
        """Add one entry; returns whether the alarm is on, or None (state unchanged) for an entry that is no point."""
        entry = point(metrics)
        if entry is None:
            return None
        if len(self.base) < self.baseline:
            self.base.append(entry)
        else:
            self.recent = [*self.recent, entry][-self.window :]
        levels = self.levels()
        self.on = levels is not None and collapsed(*levels, self.mi_fraction, self.entropy_floor)
        return self.on

    def state_dict(self) -> dict:
        return {"base": [list(e) for e in self.base], "recent": [list(e) for e in self.recent], "on": self.on}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a saved state; a checkpoint written before this rule (no `base`) starts the stream afresh."""
        self.base = [tuple(e) for e in state.get("base", [])]
        self.recent = [tuple(e) for e in state.get("recent", [])]
        self.on = bool(state.get("on", False)) if "base" in state else False
