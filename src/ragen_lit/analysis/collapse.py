"""Which runs collapsed, into which regime, and who saw it when: the reading of `compare --collapse`.

RAGEN-2 places reasoning on two axes, its input dependence I(X;Z) and its within-input diversity H(Z|X), and names
four regimes (ragen2.md §1): diverse and input-grounded (high MI, high H), **template collapse** (low MI, high H:
fluent, varied, input-agnostic), compressed but input-grounded (high MI, low H) and low-entropy collapse (low MI,
low H). From a run's logged diagnostics (`collapse/<scope>/...`, one point per diagnostics iteration, both scopes):

- MI is *low* at a point when retrieval accuracy is at most `CHANCE_FACTOR` x its chance level (the cross-scorer can
  barely tell which prompt a reasoning came from);
- H(Z|X) is *low* when it fell below `ENTROPY_FLOOR` x its value at the run's first diagnostics.

A run **collapsed** (template collapse) at the first point where, in either scope, MI is low while H(Z|X) is not;
`regime` names the quadrant of a point. Beside it: the first iteration the run's own collapse alarm fired
(`collapse/alarm`, or a replay of `metrics.alarm.CollapseAlarm` with other settings on the logged stream), the first
iteration an entropy monitor alone would have flagged (token entropy or H(Z|X) below `ENTROPY_FLOOR` x its start:
what watching entropy catches), and the iteration where training success stopped improving (the peak of its
moving average over `PLATEAU_WINDOW` iterations).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ragen_lit.analysis.runs import History, RunRecord
from ragen_lit.analysis.stats import proportion_difference

SCOPES = ("first_turn", "trajectory")
CHANCE_FACTOR = 2.0
ENTROPY_FLOOR = 0.8
PLATEAU_WINDOW = 5
REGIMES = {
    (False, False): "diverse, input-grounded",
    (True, False): "template collapse",
    (False, True): "compressed, input-grounded",
    (True, True): "low-entropy collapse",
}
"""(MI low, H(Z|X) low) -> regime"""


@dataclass(frozen=True)
class Point:
    """One diagnostics iteration of one scope: retrieval accuracy, its chance level and H(Z|X) (nats)."""

    step: int
    retrieval: float
    chance: float
    cond_entropy: float


def scope_points(run: RunRecord, scope: str) -> list[Point]:
    """The run's diagnostics points of `scope` in step order, those with all three values finite."""
    series = {
        name: dict(run.metrics.get(f"collapse/{scope}/{name}", []))
        for name in ("retrieval_acc", "retrieval_chance", "cond_entropy")
    }
    points = []
    for step in sorted(series["retrieval_acc"]):
        values = [series[name].get(step, math.nan) for name in series]
        if all(math.isfinite(v) for v in values):
            points.append(Point(step, *values))
    return points


def mi_low(point: Point, chance_factor: float = CHANCE_FACTOR) -> bool:
    return point.retrieval <= chance_factor * point.chance


def entropy_low(point: Point, first: Point, floor: float = ENTROPY_FLOOR) -> bool:
    """H(Z|X) below `floor` of the first diagnostics' (entropies here are positive nats)."""
    return point.cond_entropy < floor * first.cond_entropy


def regime(point: Point, first: Point) -> str:
    return REGIMES[(mi_low(point), entropy_low(point, first))]


def collapse_onset(points: Sequence[Point]) -> int | None:
    """The first step of template collapse in one scope (MI low, H(Z|X) not low), None if it never came."""
    return next((p.step for p in points if mi_low(p) and not entropy_low(p, points[0])), None)


def first_step(history: History, predicate) -> int | None:
    return next((step for step, value in history if predicate(value)), None)


def entropy_flag(run: RunRecord, floor: float = ENTROPY_FLOOR) -> int | None:
    """The first step an entropy monitor alone flags: token entropy (`actor/entropy`) or either scope's H(Z|X) below
    `floor` x its first value; None if neither fell that far."""
    steps = []
    keys = ["actor/entropy", *(f"collapse/{scope}/cond_entropy" for scope in SCOPES)]
    for history in (run.metrics.get(key, []) for key in keys):
        finite = [(s, v) for s, v in history if math.isfinite(v)]
        if finite:
            start = finite[0][1]
            steps.append(first_step(finite, lambda v, start=start: v < floor * start))
    return min((s for s in steps if s is not None), default=None)


def success_plateau(run: RunRecord, window: int = PLATEAU_WINDOW) -> int | None:
    """The step at which training success (`rollout/success`, every iteration) stopped improving: the last step of
    the first window whose mean is the highest of the run's moving averages; None for a run shorter than `window`."""
    history = run.metrics.get("rollout/success", [])
    if len(history) < window:
        return None
    means = [sum(v for _, v in history[i : i + window]) / window for i in range(len(history) - window + 1)]
    best = max(range(len(means)), key=lambda i: (means[i], -i))
    return history[best + window - 1][0]


def alarm_onset(run: RunRecord) -> int | None:
    """The first step the run's collapse alarm was on (`collapse/alarm` = 1), None if it never fired or was off."""
    return first_step(run.metrics.get("collapse/alarm", []), lambda v: v > 0.5)


def replay_alarm(run: RunRecord, **settings) -> int | None:
    """The first step `CollapseAlarm(**settings)` fires on the run's logged metrics, fed one iteration at a time as
    `fit` feeds it: how an alarm of other settings would have read the same run."""
    from ragen_lit.metrics.alarm import CollapseAlarm

    alarm = CollapseAlarm(**settings)
    steps = sorted({step for history in run.metrics.values() for step, _ in history})
    by_step: dict[int, dict[str, float]] = {step: {} for step in steps}
    for key, history in run.metrics.items():
        for step, value in history:
            by_step[step][key] = value
    return next((step for step in steps if alarm.update(by_step[step])), None)


@dataclass(frozen=True)
class CollapseReading:
    """One run's reading: where (if anywhere) each scope collapsed, the regime of its last diagnostics (the first
    scope's, else the trajectory's), and when the alarm, an entropy monitor and the success plateau came."""

    run: RunRecord
    onset: dict[str, int | None]
    regime_end: str | None
    alarm: int | None
    entropy: int | None
    plateau: int | None

    @property
    def collapsed(self) -> int | None:
        """The first step either scope collapsed, None for a run that did not."""
        return min((s for s in self.onset.values() if s is not None), default=None)


def read_run(run: RunRecord, alarm_settings: dict | None = None) -> CollapseReading:
    """`alarm_settings`: replay `CollapseAlarm` with them instead of reading the logged `collapse/alarm`."""
    points = {scope: scope_points(run, scope) for scope in SCOPES}
    onset = {scope: collapse_onset(p) if p else None for scope, p in points.items()}
    last = next((p for p in points.values() if p), None)
    return CollapseReading(
        run,
        onset,
        regime(last[-1], last[0]) if last else None,
        replay_alarm(run, **alarm_settings) if alarm_settings is not None else alarm_onset(run),
        entropy_flag(run),
        success_plateau(run),
    )


@dataclass(frozen=True)
class AlarmRates:
    """How the alarm and an entropy monitor read a set of runs: hits among collapsed runs, false alarms among the
    others, the alarm's step minus the collapse step of each hit (negative: it fired before the criterion was met)
    and minus the success plateau's step (positive: it fired after success stopped improving)."""

    collapsed: int
    hits: int
    healthy: int
    false_alarms: int
    leads: tuple[int, ...]
    entropy_hits: int
    entropy_false_alarms: int
    after_plateau: tuple[int, ...]


def alarm_rates(readings: Sequence[CollapseReading]) -> AlarmRates:
    collapsed = [r for r in readings if r.collapsed is not None]
    healthy = [r for r in readings if r.collapsed is None]
    hits = [r for r in collapsed if r.alarm is not None]
    return AlarmRates(
        len(collapsed),
        len(hits),
        len(healthy),
        sum(r.alarm is not None for r in healthy),
        tuple(r.alarm - r.collapsed for r in hits),
        sum(r.entropy is not None for r in collapsed),
        sum(r.entropy is not None for r in healthy),
        tuple(r.alarm - r.plateau for r in hits if r.plateau is not None),
    )


def _step(step: int | None) -> str:
    return "–" if step is None else str(step)


def _text(text: str) -> str:
    """A table cell's text, its pipes escaped."""
    return text.replace("|", "\\|")


def _steps(steps: Sequence[int]) -> str:
    return ", ".join(f"{step:+d}" for step in steps) or "–"


def collapse_markdown(readings: Sequence[CollapseReading], baseline: str | None = None) -> str:
    """A row per run (point, seed, each scope's collapse step, the regime at its end, the alarm's, the entropy
    monitor's and the success plateau's steps, its final validation success), then per point: the runs that
    collapsed, the difference of that share to the `baseline` point's with Newcombe's 95% interval
    (`stats.proportion_difference`), the alarm's and the entropy monitor's hits and false alarms, and the alarm's
    steps after the collapse and after the success plateau."""
    lines = [
        "| point | seed | collapsed (first turn) | collapsed (trajectory) | regime at the end | alarm | "
        "entropy monitor | success plateau | final val success |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in readings:
        final = r.run.metrics.get("val/success", [])
        lines.append(
            f"| {_text(r.run.label)} | {r.run.seed or r.run.name} | {_step(r.onset['first_turn'])}"
            f" | {_step(r.onset['trajectory'])} | {r.regime_end or '–'} | {_step(r.alarm)} | {_step(r.entropy)} | "
            f"{_step(r.plateau)} | {f'{final[-1][1]:.3f}' if final else '–'} |"
        )
    lines += [
        "",
        "| point | runs | collapsed | Δ collapsed share vs baseline [95% CI] | alarm on collapsed runs | "
        "alarm on the others | alarm − collapse (steps) | alarm − success plateau (steps) | "
        "entropy monitor on collapsed runs | entropy monitor on the others |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    points: dict[str, list[CollapseReading]] = {}
    for r in readings:
        points.setdefault(r.run.label, []).append(r)
    reference = alarm_rates(points[baseline]) if baseline in points else None
    for label, members in [*points.items(), ("all", list(readings))]:
        rates = alarm_rates(members)
        if reference is None or label == "all":
            share = "–"
        elif label == baseline:
            share = "baseline"
        else:
            d = proportion_difference(
                rates.collapsed, len(members), reference.collapsed, reference.collapsed + reference.healthy
            )
            share = f"{d.delta:+.3g} [{d.low:+.3g}, {d.high:+.3g}]"
        lines.append(
            f"| {_text(label)} | {len(members)} | {rates.collapsed} | {share} | {rates.hits}/{rates.collapsed}"
            f" | {rates.false_alarms}/{rates.healthy} | {_steps(rates.leads)} | {_steps(rates.after_plateau)}"
            f" | {rates.entropy_hits}/{rates.collapsed} | {rates.entropy_false_alarms}/{rates.healthy} |"
        )
    return "\n".join(lines) + "\n"
