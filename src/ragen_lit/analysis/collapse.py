"""Which runs lost their reasoning's input dependence, in which regime, and which monitor saw it when: the reading
of `compare --collapse`.

RAGEN-2 places reasoning on two axes, its input dependence I(X;Z) and its within-input diversity H(Z|X). *Template
collapse* is the regime where the first falls **while entropy looks healthy**: the reasoning stays fluent and varied
but no longer depends on the input, which is why an entropy monitor misses it. Reasoning can also lose its input
dependence while entropy explodes (token salad: any entropy monitor that watches rises sees it) or while entropy
falls (a near-deterministic policy: one that watches falls sees it). This module separates the three.

**Streams and levels.** Every stream is read at the diagnostics iterations (the steps `collapse/<scope>/...` was
logged at): per scope its retrieval accuracy, the chance level of retrieval and H(Z|X); the first-turn MI z-score;
token entropy (`actor/entropy`, logged every iteration, read at the same steps). A stream's *start* is the mean of
its first `BASELINE` points, its *level* at a point the mean of the last `WINDOW` points, defined once `WINDOW`
points after the start's have been logged: the structure of the run's own alarm (`metrics.alarm`, shipped as
`diagnostics.collapse_baseline=3`, `collapse_window=3`), so that every rule here smooths as it does. One
diagnostics point scores at most `diagnostics.num_samples` reasonings and moves by several points between
iterations of a healthy run; a rule on single points would cut through that noise.

**MI loss** at a point, in one scope: the level of retrieval accuracy is at most `CHANCE_FACTOR` x the level of its
chance (the cross-scorer can barely tell which prompt a reasoning came from). A second clause, reported beside it
and not pooled with it: the level of the first-turn MI z-score at most `ZSCORE_FRACTION` x its start.

**Regimes**, at a point with MI loss, from the levels of that scope's H(Z|X) and of token entropy, each against
its start: *template collapse* when both lie within `ENTROPY_BAND` (entropy looks healthy), *entropy blow-up* when
either is above the band, *low-entropy collapse* when either is below it and neither above. A run's **outcome** is
the regime of its first point with MI loss (its *onset*; the first-turn scope's when both scopes lose MI at one
point), or `NO_LOSS`.

**Monitors**, each the first step it fires at: the run's own alarm (`collapse/alarm`, or a replay of
`metrics.alarm.CollapseAlarm` with other settings on the logged stream); an entropy monitor that watches falls (the
level of token entropy or of either scope's H(Z|X) below the band); and a two-sided one (below or above it). Beside
them the step where training success stopped improving: the last step of the first `PLATEAU_WINDOW`-iteration
window with the highest mean `rollout/success`.

**Runs that learn**: the mean of a run's last `LEARN_WINDOW` validations (`val/success`) is at least `LEARN_MARGIN`
above its first (the validation before training). A monitor that fires on such a run without MI loss raised an alarm
on a run that was doing well: the false-alarm rate a negative control measures.

Template collapse at three layers, one module each: `metrics.collapse` computes the diagnostics during a run,
`analysis.collapse` reads their logged streams for `compare --collapse`, `figures.collapse` draws that reading.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragen_lit.analysis.runs import History, RunRecord

SCOPES = ("first_turn", "trajectory")
TOKEN_ENTROPY = "actor/entropy"
ZSCORE = "collapse/first_turn/mi_zscore"
BASELINE = 3
WINDOW = 3
CHANCE_FACTOR = 2.0
ENTROPY_BAND = (0.8, 2.0)
ZSCORE_FRACTION = 0.25
PLATEAU_WINDOW = 10
LEARN_WINDOW = 3
LEARN_MARGIN = 0.05

TEMPLATE = "template collapse"
BLOW_UP = "entropy blow-up"
LOW_ENTROPY = "low-entropy collapse"
NO_LOSS = "no MI loss"
OUTCOMES = (TEMPLATE, BLOW_UP, LOW_ENTROPY, NO_LOSS)


def start_and_levels(values: Sequence[float], baseline: int = BASELINE, window: int = WINDOW):
    """(start, levels) of one stream: start = mean of the first `baseline` values; levels[i] = mean of values
    i-window+1..i for i >= baseline+window-1, None before (NaN start when there are fewer values)."""
    if len(values) < baseline:
        return math.nan, [None] * len(values)
    start = sum(values[:baseline]) / baseline
    levels = [
        sum(values[i - window + 1 : i + 1]) / window if i >= baseline + window - 1 else None for i in range(len(values))
    ]
    return start, levels


def at_steps(history: History, steps: Sequence[int]) -> list[float]:
    """The history's values at `steps` (NaN where it has none)."""
    values = dict(history)
    return [values.get(step, math.nan) for step in steps]


def entropy_state(ratios: Sequence[float], band: tuple[float, float] = ENTROPY_BAND) -> str:
    """The regime that entropies at `ratios` x their starts name under MI loss: above the band wins over below."""
    if any(r > band[1] for r in ratios):
        return BLOW_UP
    if any(r < band[0] for r in ratios):
        return LOW_ENTROPY
    return TEMPLATE


@dataclass(frozen=True)
class ScopePoint:
    """One scope at one diagnostics step where its levels are defined: retrieval's level over twice chance's
    (`closeness`, at most 1 under MI loss) and the ratios of the levels of its H(Z|X) and of token entropy to
    their starts."""

    step: int
    closeness: float
    cond_entropy_ratio: float
    token_entropy_ratio: float

    @property
    def mi_lost(self) -> bool:
        return self.closeness <= 1.0

    @property
    def entropy(self) -> str:
        """The regime the entropies name (`TEMPLATE` when both are in the band)."""
        return entropy_state((self.cond_entropy_ratio, self.token_entropy_ratio))


def scope_points(run: RunRecord, scope: str) -> list[ScopePoint]:
    """The scope's points, in step order, at the steps where retrieval, chance, H(Z|X) and token entropy were all
    finite and the levels are defined."""
    prefix = f"collapse/{scope}/"
    steps = sorted(step for step, _ in run.metrics.get(prefix + "retrieval_acc", []))
    keys = [prefix + "retrieval_acc", prefix + "retrieval_chance", prefix + "cond_entropy", TOKEN_ENTROPY]
    columns = [at_steps(run.metrics.get(key, []), steps) for key in keys]
    rows = [(step, *values) for step, *values in zip(steps, *columns) if all(map(math.isfinite, values))]
    if not rows:
        return []
    steps, *columns = (list(c) for c in zip(*rows))
    (_, retrieval), (_, chance), (h_start, cond), (t_start, token) = map(start_and_levels, columns)
    return [
        ScopePoint(step, r / (CHANCE_FACTOR * c), h / h_start, t / t_start)
        for step, r, c, h, t in zip(steps, retrieval, chance, cond, token)
        if r is not None
    ]


def stream_flag(history: History, steps: Sequence[int], fires: Callable[[float], bool]) -> int | None:
    """The first of `steps` at which `fires(level / start)` holds for the stream `history` read at `steps`; None
    also for a stream whose start is not positive (a ratio to it means nothing)."""
    pairs = [(step, v) for step, v in zip(steps, at_steps(history, steps)) if math.isfinite(v)]
    if not pairs:
        return None
    start, levels = start_and_levels([v for _, v in pairs])
    if not start > 0:
        return None
    return next((step for (step, _), level in zip(pairs, levels) if level is not None and fires(level / start)), None)


def entropy_flag(run: RunRecord, two_sided: bool, band: tuple[float, float] = ENTROPY_BAND) -> int | None:
    """The first diagnostics step an entropy monitor fires: the level of token entropy or of either scope's H(Z|X)
    below `band[0]` x its start, or (`two_sided`) also above `band[1]` x it."""
    steps = sorted({step for scope in SCOPES for step, _ in run.metrics.get(f"collapse/{scope}/retrieval_acc", [])})

    def fires(ratio: float) -> bool:
        return ratio < band[0] or (two_sided and ratio > band[1])

    keys = [TOKEN_ENTROPY, *(f"collapse/{scope}/cond_entropy" for scope in SCOPES)]
    flags = [stream_flag(run.metrics.get(key, []), steps, fires) for key in keys]
    return min((s for s in flags if s is not None), default=None)


def zscore_loss(run: RunRecord, fraction: float = ZSCORE_FRACTION) -> int | None:
    """The first diagnostics step where the level of the first-turn MI z-score is at most `fraction` x its start
    (the second MI-loss clause)."""
    steps = [step for step, _ in run.metrics.get("collapse/first_turn/retrieval_acc", [])]
    return stream_flag(run.metrics.get(ZSCORE, []), steps, lambda ratio: ratio <= fraction)


def success_plateau(run: RunRecord, window: int = PLATEAU_WINDOW) -> int | None:
    """The step at which training success (`rollout/success`, every iteration) stopped improving: the last step of
    the first window whose mean is the highest of the run's moving averages; None for a run shorter than `window`."""
    history = run.metrics.get("rollout/success", [])
    if len(history) < window:
        return None
    means = [sum(v for _, v in history[i : i + window]) / window for i in range(len(history) - window + 1)]
    best = max(range(len(means)), key=lambda i: (means[i], -i))
    return history[best + window - 1][0]


def learns(run: RunRecord, window: int = LEARN_WINDOW, margin: float = LEARN_MARGIN) -> bool | None:
    """Whether the mean of the run's last `window` validations is at least `margin` above its first; None for a
    run with fewer than `window` + 1 validations."""
    history = run.metrics.get("val/success", [])
    if len(history) < window + 1:
        return None
    return sum(v for _, v in history[-window:]) / window >= history[0][1] + margin


def alarm_onset(run: RunRecord) -> int | None:
    """The first step the run's collapse alarm was on (`collapse/alarm` = 1), None if it never fired or was off."""
    return next((step for step, value in run.metrics.get("collapse/alarm", []) if value > 0.5), None)


def replay_alarm(run: RunRecord, **settings) -> int | None:
    """The first step `CollapseAlarm(**settings)` fires on the run's logged metrics, fed one iteration at a time as
    `fit` feeds it: how an alarm of other settings would have read the same run."""
    from ragen_lit.metrics.alarm import CollapseAlarm

    alarm = CollapseAlarm(**settings)
    by_step: dict[int, dict[str, float]] = {}
    for key, history in run.metrics.items():
        for step, value in history:
            by_step.setdefault(step, {})[key] = value
    return next((step for step in sorted(by_step) if alarm.update(by_step[step])), None)


@dataclass(frozen=True)
class CollapseReading:
    """One run's reading. `onset`: each scope's first step with MI loss; `outcome`: the regime at the run's first
    MI loss (or `NO_LOSS`); `template`: the first step any scope was in template collapse; `regime_end`: the regime
    of the last point (`NO_LOSS` when MI held there); `closest`: the lowest retrieval level over twice chance's at
    a point whose entropies were in the band, and its step (at most 1: template collapse); `zscore`: the z-score
    clause's first step; the monitors' and the success plateau's steps; `learns`: whether validation success rose
    (`learns`)."""

    run: RunRecord
    onset: dict[str, int | None]
    outcome: str
    template: int | None
    regime_end: str | None
    closest: tuple[float, int] | None
    zscore: int | None
    alarm: int | None
    entropy_falls: int | None
    entropy_two_sided: int | None
    plateau: int | None
    learns: bool | None

    @property
    def mi_loss(self) -> int | None:
        """The first step either scope lost MI, None for a run that never did."""
        return min((s for s in self.onset.values() if s is not None), default=None)

    def monitor(self, name: str) -> int | None:
        return {"alarm": self.alarm, "entropy falls": self.entropy_falls, "entropy two-sided": self.entropy_two_sided}[
            name
        ]


MONITORS = ("alarm", "entropy falls", "entropy two-sided")


def read_run(run: RunRecord, alarm_settings: dict | None = None) -> CollapseReading:
    """`alarm_settings`: replay `CollapseAlarm` with them instead of reading the logged `collapse/alarm`."""
    points = {scope: scope_points(run, scope) for scope in SCOPES}
    onset = {scope: next((p.step for p in pts if p.mi_lost), None) for scope, pts in points.items()}
    lost = sorted((p.step, SCOPES.index(scope), p) for scope, pts in points.items() for p in pts if p.mi_lost)
    outcome = lost[0][2].entropy if lost else NO_LOSS
    template = next((step for step, _, p in lost if p.entropy == TEMPLATE), None)
    last = next((pts[-1] for pts in points.values() if pts), None)
    in_band = [(p.closeness, p.step) for pts in points.values() for p in pts if p.entropy == TEMPLATE]
    return CollapseReading(
        run,
        onset,
        outcome,
        template,
        None if last is None else (last.entropy if last.mi_lost else NO_LOSS),
        min(in_band, default=None),
        zscore_loss(run),
        replay_alarm(run, **alarm_settings) if alarm_settings is not None else alarm_onset(run),
        entropy_flag(run, two_sided=False),
        entropy_flag(run, two_sided=True),
        success_plateau(run),
        learns(run),
    )
