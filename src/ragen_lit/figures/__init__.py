"""Drawing the run curves: pure functions from numbers to a matplotlib `Figure`, and `save_png`.

A bottom module (numpy and matplotlib only) so both `compare` (many runs, grouped by grid point) and the
training callbacks (one run at the end of `fit`) draw the same pictures. Figures are built with
`matplotlib.figure.Figure` and saved through the Agg canvas, never pyplot: no global state, no display.

A curve is one run's [(step, value), ...]; a group is a label's list of curves (its seeds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Curve = Sequence[tuple[float, float]]
Groups = Mapping[str, Sequence[Curve]]
Trajectory = tuple[Sequence[float], Sequence[float]]

# the paper's four regimes, by (high MI?, high entropy?), at the axes' corners
REGIMES = {
    (True, True): "diverse and input-grounded",
    (True, False): "compressed but grounded",
    (False, True): "template collapse",
    (False, False): "low-entropy collapse",
}


def colour(index: int):
    """The same colour for a label's index in every figure of one comparison."""
    import matplotlib

    return matplotlib.colormaps["tab10"](index % 10)


def seed_band(curves: Sequence[Curve]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, std) over the curves that logged each step; std (ddof=1) is NaN where only one did,
    so the band simply has a gap there."""
    steps = np.array(sorted({step for curve in curves for step, _ in curve}), dtype=float)
    by_step: dict[float, list[float]] = {s: [] for s in steps}
    for curve in curves:
        for step, value in curve:
            by_step[float(step)].append(value)
    means = np.array([np.mean(by_step[s]) for s in steps])
    stds = np.array([np.std(by_step[s], ddof=1) if len(by_step[s]) > 1 else np.nan for s in steps])
    return steps, means, stds


def draw_groups(ax, groups: Groups, ylabel: str) -> None:
    """One mean line per label with a ±std band across its curves."""
    for i, (label, curves) in enumerate(groups.items()):
        if not any(curves):
            continue
        steps, means, stds = seed_band(curves)
        ax.plot(steps, means, marker="o", markersize=3, color=colour(i), label=f"{label} (n={len(curves)})")
        ax.fill_between(steps, means - stds, means + stds, color=colour(i), alpha=0.2, linewidth=0)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    _legend(ax)


def _legend(ax, **kwargs) -> None:
    # a legend without entries only adds a warning
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", **kwargs)


def curves_figure(groups: Groups, ylabel: str, title: str) -> Figure:
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    draw_groups(ax, groups, ylabel)
    ax.set_title(title)
    return fig


def success_curves(runs: Mapping[str, Curve], title: str = "validation success") -> Figure:
    """Validation success over iterations, one line per run (the single-run form of `curves_figure`)."""
    return curves_figure({label: [curve] for label, curve in runs.items()}, "validation success", title)


def filter_curves(kept_ratio: Groups, rv_cv: Groups) -> Figure:
    """Two panels: the share of groups the RV filter kept, and Std(RV)/Mean(RV) of the reward variances."""
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    draw_groups(left, kept_ratio, "kept ratio")
    left.set_title("groups kept by the reward-variance filter")
    draw_groups(right, rv_cv, "Std(RV) / Mean(RV)")
    right.set_title("spread of within-group reward variance")
    return fig


def mi_entropy_plane(
    trajectories: Mapping[str, Sequence[Trajectory]],
    xlabel: str = "conditional entropy H(Z|X) (nats)",
    ylabel: str = "MI retrieval accuracy",
) -> Figure:
    """Each run's path through the (entropy, MI) plane over iterations: a line from a circle (first
    iteration) to a star (last), coloured by label. Dashed lines split the plane at the medians of all
    plotted points; the corners name the four regimes (high/low MI × high/low entropy)."""
    fig = Figure(figsize=(7.5, 6), layout="constrained")
    ax = fig.add_subplot()
    xs_all, ys_all = [], []
    for i, (label, runs) in enumerate(trajectories.items()):
        for j, (xs, ys) in enumerate(runs):
            if len(xs) == 0:
                continue
            ax.plot(xs, ys, color=colour(i), alpha=0.7, label=label if j == 0 else None)
            ax.plot(xs[0], ys[0], "o", color=colour(i))
            ax.plot(xs[-1], ys[-1], "*", color=colour(i), markersize=12)
            xs_all.extend(xs)
            ys_all.extend(ys)
    if xs_all:
        ax.axvline(float(np.median(xs_all)), color="grey", linestyle="--", linewidth=1)
        ax.axhline(float(np.median(ys_all)), color="grey", linestyle="--", linewidth=1)
    for (high_mi, high_entropy), name in REGIMES.items():
        ax.text(
            0.98 if high_entropy else 0.02,
            0.98 if high_mi else 0.02,
            name,
            transform=ax.transAxes,
            ha="right" if high_entropy else "left",
            va="top" if high_mi else "bottom",
            color="dimgrey",
            fontsize="small",
            style="italic",
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("MI vs entropy (o: first iteration, *: last)")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def gradient_buckets(
    task: Mapping[str, Sequence[float]], reg: Mapping[str, Sequence[float]], rv: Sequence[float] | None = None
) -> Figure:
    """Two panels of grouped bars: per RV bucket (q1 lowest reward variance .. qK highest), the task and
    the regulariser gradient norms of each label (NaN bars are left out); `rv`, each bucket's mean reward
    variance (`grad/rv/q{k}`), labels the x-axis under the bucket names when given."""
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    panels = fig.subplots(1, 2)
    for ax, norms, title in ((panels[0], task, "task gradient norm"), (panels[1], reg, "regulariser gradient norm")):
        buckets = max((len(v) for v in norms.values()), default=0)
        # a label without any value gets no slot, but keeps its index so its colour matches the other figures
        shown = [
            (i, label, np.asarray(v, dtype=float))
            for i, (label, v) in enumerate(norms.items())
            if not np.all(np.isnan(np.asarray(v, dtype=float)))
        ]
        width = 0.8 / max(len(shown), 1)
        for slot, (i, label, values) in enumerate(shown):
            positions = np.arange(len(values)) + (slot - (len(shown) - 1) / 2) * width
            ax.bar(positions, values, width, color=colour(i), label=label)
        names = [f"q{k + 1}" for k in range(buckets)]
        if rv is not None:
            names = [f"{name}\n{value:.3g}" for name, value in zip(names, rv, strict=True)]
        ax.set_xticks(np.arange(buckets), names)
        ax.set_xlabel("reward-variance bucket (q1: lowest)" + ("; its mean RV below" if rv is not None else ""))
        ax.set_ylabel("mean gradient norm")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
        _legend(ax)
    return fig


def save_png(fig: Figure, path: Path) -> Path:
    """Write `fig` as a PNG through the Agg canvas (creating the folder) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attach the Agg canvas: no pyplot backend is ever chosen
    fig.savefig(path, format="png", dpi=120)
    return path
