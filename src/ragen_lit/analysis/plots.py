"""Which figures a comparison draws, from which metrics: runs grouped by point in, PNG files out.

The drawing itself lives in `ragen_lit.figures` (shared with the single-run figures of `fit`); a figure
whose metrics no run logged is not written. The two template-collapse figures read the runs the way
`analysis.collapse` does (starts, levels, regimes, monitors): `collapse_curves.png`, the first-turn retrieval
accuracy over its chance level and H(Z|X) and token entropy over their starts along training, with the monitors'
firings; `mi_vs_entropy.png`, each run's end on the MI-entropy plane among the regimes' regions (runs too short for
a level get their raw (entropy, retrieval) paths instead).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ragen_lit import figures
from ragen_lit.analysis import collapse
from ragen_lit.analysis.runs import History, RunRecord
from ragen_lit.figures import collapse as collapse_figures

ENTROPY = "collapse/first_turn/cond_entropy"
RETRIEVAL = "collapse/first_turn/retrieval_acc"
MI_ESTIMATE = "collapse/first_turn/mi_est"
GRAD_KEY = re.compile(r"grad/(task|reg)_norm/q(\d+)$")

Groups = Mapping[str, Sequence[RunRecord]]


def curves(groups: Groups, key: str) -> dict[str, list[History]]:
    """Per label, the histories of `key` of the runs that logged it."""
    return {label: [r.metrics[key] for r in runs if r.metrics.get(key)] for label, runs in groups.items()}


def _has_data(by_label: Mapping[str, Sequence]) -> bool:
    return any(by_label.values())


def trajectories(groups: Groups, y_key: str) -> dict[str, list[tuple[list[float], list[float]]]]:
    """Per label, each run's (entropy, y) path over the steps at which both were logged."""
    paths = {}
    for label, runs in groups.items():
        paths[label] = []
        for run in runs:
            ys = dict(run.metrics.get(y_key, []))
            steps = [s for s, _ in run.metrics.get(ENTROPY, []) if s in ys]
            if steps:
                xs = dict(run.metrics[ENTROPY])
                paths[label].append(([xs[s] for s in steps], [ys[s] for s in steps]))
    return paths


def bucket_means(groups: Groups, kind: str) -> dict[str, list[float]]:
    """Per label and RV bucket q1..qK, the mean over runs of each run's mean over iterations of
    `grad/<kind>_norm/q<k>` (each seed weighs the same); NaN where no run logged the bucket."""
    buckets = sorted(
        {
            int(m.group(2))
            for runs in groups.values()
            for r in runs
            for key in r.metrics
            if (m := GRAD_KEY.match(key)) and m.group(1) == kind
        }
    )
    means = {}
    for label, runs in groups.items():
        means[label] = []
        for q in buckets:
            per_run = [sum(v for _, v in h) / len(h) for r in runs if (h := r.metrics.get(f"grad/{kind}_norm/q{q}"))]
            means[label].append(sum(per_run) / len(per_run) if per_run else math.nan)
    return means


CURVE_PANELS = ("retrieval", "cond_entropy", "token_entropy")
CURVE_TITLES = (
    "first-turn retrieval accuracy\n/ its chance level",
    "first-turn H(Z|X)\n/ its start",
    "token entropy\n/ its start",
)


def over_start(history: History) -> History:
    """A stream over its start (`collapse.start_and_levels`: the mean of its first finite values); empty when the
    start is not defined or not positive."""
    finite = [(step, v) for step, v in history if math.isfinite(v)]
    start, _ = collapse.start_and_levels([v for _, v in finite])
    if not start > 0:
        return []
    return [(step, v / start) for step, v in finite]


def collapse_series(run: RunRecord) -> dict[str, History]:
    """The run's three diagnostics streams at its first-turn diagnostics steps: retrieval accuracy over its chance
    level, and H(Z|X) and token entropy over their starts (per panel name of `CURVE_PANELS`)."""
    prefix = "collapse/first_turn/"
    steps = [step for step, _ in run.metrics.get(prefix + "retrieval_acc", [])]
    acc, chance, cond, token = (
        collapse.at_steps(run.metrics.get(key, []), steps)
        for key in (
            prefix + "retrieval_acc",
            prefix + "retrieval_chance",
            prefix + "cond_entropy",
            collapse.TOKEN_ENTROPY,
        )
    )
    retrieval = [(s, a / c) for s, a, c in zip(steps, acc, chance) if math.isfinite(a) and math.isfinite(c) and c > 0]
    return {
        "retrieval": retrieval,
        "cond_entropy": over_start(list(zip(steps, cond))),
        "token_entropy": over_start(list(zip(steps, token))),
    }


def entropy_streams(run: RunRecord, two_sided: bool) -> dict[str, int | None]:
    """Per stream an entropy monitor watches (`collapse.entropy_flag`), the first step that stream alone would
    fire it: which of them fired the monitor."""
    scopes = collapse.SCOPES
    steps = sorted({step for scope in scopes for step, _ in run.metrics.get(f"collapse/{scope}/retrieval_acc", [])})
    low, high = collapse.ENTROPY_BAND

    def fires(ratio: float) -> bool:
        return ratio < low or (two_sided and ratio > high)

    keys = [collapse.TOKEN_ENTROPY, *(f"collapse/{scope}/cond_entropy" for scope in scopes)]
    return {key: collapse.stream_flag(run.metrics.get(key, []), steps, fires) for key in keys}


def firings(reading: collapse.CollapseReading) -> dict[str, list[tuple[str, int]]]:
    """Per panel of `CURVE_PANELS`, the (monitor, step) firings of one run to mark on it: the alarm on retrieval; an
    entropy monitor on the panel of the stream that fired it (H(Z|X) of either scope, or token entropy)."""
    marks: dict[str, list[tuple[str, int]]] = {panel: [] for panel in CURVE_PANELS}
    if reading.alarm is not None:
        marks["retrieval"].append(("alarm", reading.alarm))
    for monitor, two_sided in (("entropy falls", False), ("entropy two-sided", True)):
        step = reading.monitor(monitor)
        if step is None:
            continue
        streams = entropy_streams(reading.run, two_sided)
        panels = {
            "token_entropy" if key == collapse.TOKEN_ENTROPY else "cond_entropy"
            for key, s in streams.items()
            if s == step
        }
        for panel in sorted(panels):
            marks[panel].append((monitor, step))
    return marks


def collapse_figure(groups: Groups):
    """The `collapse_curves` figure of the runs, None when no run logged H(Z|X) at enough diagnostics steps for a
    start."""
    labels = list(groups)
    series = {label: [collapse_series(run) for run in runs] for label, runs in groups.items()}
    if not any(s["cond_entropy"] for per_run in series.values() for s in per_run):
        return None
    marks: dict[str, list[collapse_figures.Firing]] = {panel: [] for panel in CURVE_PANELS}
    counts = {monitor: 0 for monitor in collapse.MONITORS}
    total = 0
    for label, runs in groups.items():
        for run, s in zip(runs, series[label]):
            if not s["retrieval"]:
                continue
            total += 1
            reading = collapse.read_run(run)
            for monitor in collapse.MONITORS:
                counts[monitor] += reading.monitor(monitor) is not None
            for panel, fired in firings(reading).items():
                marks[panel].extend((monitor, label, step) for monitor, step in fired)
    panels = [
        (title, {label: [s[panel] for s in series[label] if s[panel]] for label in labels}, marks[panel])
        for panel, title in zip(CURVE_PANELS, CURVE_TITLES)
    ]
    return collapse_figures.collapse_curves(
        panels, labels, collapse.CHANCE_FACTOR, collapse.ENTROPY_BAND, {m: (c, total) for m, c in counts.items()}
    )


def level_path(run: RunRecord) -> list[tuple[int, float, float, float]]:
    """The run's first-turn (step, H(Z|X) level / its start, retrieval level / chance's level, token entropy level /
    its start) at each diagnostics step where the levels are defined (`collapse.scope_points`)."""
    return [
        (p.step, p.cond_entropy_ratio, collapse.CHANCE_FACTOR * p.closeness, p.token_entropy_ratio)
        for p in collapse.scope_points(run, "first_turn")
    ]


def end_points(groups: Groups) -> dict[str, list[tuple[float, float, float]]]:
    """Per label, each run's last (H(Z|X) level / start, retrieval level / chance, token entropy level / start):
    its place on the regime plane and its marker; runs without a defined level are left out."""
    return {label: [path[-1][1:] for run in runs if (path := level_path(run))] for label, runs in groups.items()}


def median_paths(groups: Groups) -> dict[str, tuple[list[float], list[float]]]:
    """Per label with levels, its median path: per step, the medians over its runs of the two coordinates."""
    paths = {}
    for label, runs in groups.items():
        levels = [path for run in runs if (path := level_path(run))]
        if not levels:
            continue
        _, _, xs, _ = collapse_figures.seed_quantiles([[(s, x) for s, x, _, _ in path] for path in levels])
        _, _, ys, _ = collapse_figures.seed_quantiles([[(s, y) for s, _, y, _ in path] for path in levels])
        paths[label] = (xs.tolist(), ys.tolist())
    return paths


def regime_figure(groups: Groups):
    """The `regime_plane` of the runs' end points, None when no run has a level."""
    ends = end_points(groups)
    if not _has_data(ends):
        return None
    names = (collapse.TEMPLATE, collapse.BLOW_UP, collapse.LOW_ENTROPY, collapse.NO_LOSS)
    note = (
        f"level: the mean of the last {collapse.WINDOW} diagnostics points; start: the mean of the first "
        f"{collapse.BASELINE}. Regions from H(Z|X) alone; under MI loss, the run-by-run\nreading "
        "(compare --collapse) names token entropy above the band a blow-up and below it low-entropy collapse."
    )
    return collapse_figures.regime_plane(
        ends, median_paths(groups), collapse.CHANCE_FACTOR, collapse.ENTROPY_BAND, names, note=note
    )


def write_figures(groups: Groups, out: Path) -> list[Path]:
    """Draw every figure the logged metrics allow into `out`; returns the files written."""
    written = []
    success = curves(groups, "val/success")
    if _has_data(success):
        fig = figures.curves_figure(success, "validation success", "validation success (mean ± std over seeds)")
        written.append(figures.save_png(fig, out / "val_success.png"))
    # the regime plane of the runs' end levels; runs too short for a level (or without retrieval accuracy) get
    # their raw paths through (entropy, MI) instead
    plane = regime_figure(groups)
    if plane is None:
        # retrieval accuracy is the paper's MI axis; the raw estimate stands in when it was not logged
        y_key, y_label = RETRIEVAL, "MI retrieval accuracy"
        paths = trajectories(groups, y_key)
        if not _has_data(paths):
            y_key, y_label = MI_ESTIMATE, "MI estimate (nats)"
            paths = trajectories(groups, y_key)
        if _has_data(paths):
            plane = figures.mi_entropy_plane(paths, ylabel=y_label)
    if plane is not None:
        written.append(figures.save_png(plane, out / "mi_vs_entropy.png"))
    curves_fig = collapse_figure(groups)
    if curves_fig is not None:
        written.append(figures.save_png(curves_fig, out / "collapse_curves.png"))
    kept, rv_cv = curves(groups, "filter/kept_ratio"), curves(groups, "filter/rv_cv")
    if _has_data(kept) or _has_data(rv_cv):
        written.append(figures.save_png(figures.filter_curves(kept, rv_cv), out / "kept_ratio_rv.png"))
    task, reg = bucket_means(groups, "task"), bucket_means(groups, "reg")
    if any(task.values()) or any(reg.values()):
        written.append(figures.save_png(figures.gradient_buckets(task, reg), out / "gradient_buckets.png"))
    return written
