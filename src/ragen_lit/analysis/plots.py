"""Which figures a comparison draws, from which metrics: runs grouped by point in, PNG files out.

The drawing itself lives in `ragen_lit.figures` (shared with the single-run figures of `fit`); a figure
whose metrics no run logged is not written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ragen_lit import figures
from ragen_lit.analysis.runs import History, RunRecord

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


def write_figures(groups: Groups, out: Path) -> list[Path]:
    """Draw every figure the logged metrics allow into `out`; returns the files written."""
    written = []
    success = curves(groups, "val/success")
    if _has_data(success):
        fig = figures.curves_figure(success, "validation success", "validation success (mean ± std over seeds)")
        written.append(figures.save_png(fig, out / "val_success.png"))
    # retrieval accuracy is the paper's MI axis; the raw estimate stands in when it was not logged
    y_key, y_label = RETRIEVAL, "MI retrieval accuracy"
    paths = trajectories(groups, y_key)
    if not _has_data(paths):
        y_key, y_label = MI_ESTIMATE, "MI estimate (nats)"
        paths = trajectories(groups, y_key)
    if _has_data(paths):
        written.append(figures.save_png(figures.mi_entropy_plane(paths, ylabel=y_label), out / "mi_vs_entropy.png"))
    kept, rv_cv = curves(groups, "filter/kept_ratio"), curves(groups, "filter/rv_cv")
    if _has_data(kept) or _has_data(rv_cv):
        written.append(figures.save_png(figures.filter_curves(kept, rv_cv), out / "kept_ratio_rv.png"))
    task, reg = bucket_means(groups, "task"), bucket_means(groups, "reg")
    if any(task.values()) or any(reg.values()):
        written.append(figures.save_png(figures.gradient_buckets(task, reg), out / "gradient_buckets.png"))
    return written
