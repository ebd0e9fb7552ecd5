"""`compare`'s template-collapse figures: the diagnostics streams over training per grid point with the monitors'
firings (`collapse_curves`), and the MI-entropy plane with the regimes' regions and each run's end point
(`regime_plane`). Pure functions from numbers to a `Figure`, like the rest of `ragen_lit.figures`.

Template collapse at three layers, one module each: `metrics.collapse` computes the diagnostics during a run,
`analysis.collapse` reads their logged streams for `compare --collapse`, `figures.collapse` draws that reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib import patheffects
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from ragen_lit.figures import Curve, Groups, Trajectory, colour

Firing = tuple[str, str, float]
"""One monitor's firing on one run: (monitor, the label of the run's point, step)."""

MONITOR_MARKERS = {"alarm": "^", "entropy falls": "v", "entropy two-sided": "o"}
SPREAD = (0.25, 0.5, 0.75)
SPREAD_TEXT = "line: median over seeds, band: 25-75% of seeds"
REGION_NAMES = ("template collapse", "entropy blow-up", "low-entropy collapse", "no MI loss")
# an end point's marker by where its token entropy lies against the band (`_token_shape`)
TOKEN_SHAPES = {"o": "token entropy / start in {0:g}-{1:g}", "^": "... above {1:g}", "v": "... below {0:g}"}


def seed_quantiles(
    curves: Sequence[Curve], quantiles: tuple[float, float, float] = SPREAD
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(steps, low, middle, high): per step, the three `quantiles` (numpy's linear interpolation) of the values of
    the curves that logged it; NaN values are left out, and a step with no other value is NaN."""
    steps = sorted({float(step) for curve in curves for step, _ in curve})
    by_step: dict[float, list[float]] = {s: [] for s in steps}
    for curve in curves:
        for step, value in curve:
            if not np.isnan(value):
                by_step[float(step)].append(value)
    rows = np.array([np.quantile(by_step[s], quantiles) if by_step[s] else [np.nan] * 3 for s in steps])
    rows = rows.reshape(len(steps), 3)
    return np.array(steps), rows[:, 0], rows[:, 1], rows[:, 2]


def log_limits(values: Sequence[float], keep: Sequence[float], margin: float = 1.3) -> tuple[float, float]:
    """Limits of a log axis that hold every positive finite value and the levels `keep`, with `margin` x room."""
    positive = [v for v in (*values, *keep) if np.isfinite(v) and v > 0]
    return min(positive) / margin, max(positive) * margin


WIDE_LOG_SPAN = 1e3
"""an axis wider than this ratio gets ticks at the powers of ten only (1, 2 and 5 x them would crowd its labels)"""


def _plain_log_ticks(axis) -> None:
    """Ticks of a log axis at 1, 2 and 5 x the powers of ten (the powers alone on an axis wider than
    `WIDE_LOG_SPAN`, as set by its limits so far), written as plain numbers (0.5, 2, 10)."""
    low, high = sorted(axis.get_view_interval())
    subs = (1.0,) if low > 0 and high / low > WIDE_LOG_SPAN else (1.0, 2.0, 5.0)
    axis.set_major_locator(LogLocator(subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _firing_rows(ax, firings: Sequence[Firing], rows: Sequence[str], colours: Mapping[str, object]) -> None:
    """Each firing as its monitor's marker in its point's colour, in one row per point (`rows`, top down) along the
    bottom of the axes, at its step; the y-limits are widened downward so that the rows lie below the curves. Several
    runs of one point firing at one step are one marker with their count beside it."""
    if not rows:
        return
    low, high = ax.get_ylim()
    strip = 0.05 + 0.065 * len(rows)  # the rows' share of the axes' height
    ax.set_ylim(np.exp(np.log(low) - strip / (1 - strip) * (np.log(high) - np.log(low))), high)
    counts: dict[Firing, int] = {}
    for firing in firings:
        counts[firing] = counts.get(firing, 0) + 1
    where = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for (monitor, label, step), count in counts.items():
        if label not in rows:
            continue
        y = 0.035 + 0.065 * (len(rows) - 1 - rows.index(label))
        marker = MONITOR_MARKERS.get(monitor, "s")
        hollow = marker == "o"
        ax.plot(
            step,
            y,
            marker=marker,
            markersize=9 if hollow else 6.5,
            color=colours[label],
            markerfacecolor="none" if hollow else colours[label],
            markeredgewidth=1.4 if hollow else 0.5,
            linestyle="none",
            transform=where,
            clip_on=False,
        )
        if count > 1:
            ax.annotate(
                str(count),
                (step, y),
                xycoords=where,
                xytext=(7, 1),
                textcoords="offset points",
                fontsize=7,
                color=colours[label],
            )


def _reference(ax, first: bool, mi_line: float, band: tuple[float, float]) -> tuple[float, ...]:
    """The first panel's MI-loss line, or the others' entropy band; returns the levels the limits must hold."""
    where = ax.get_yaxis_transform()  # x in axes fraction, y in data
    if first:
        ax.axhline(mi_line, color="black", linestyle="--", linewidth=1)
        ax.annotate(
            f"{mi_line:g}x chance: MI loss at or below",
            (1, mi_line),
            xycoords=where,
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize="small",
        )
        return (mi_line,)
    ax.axhspan(*band, color="grey", alpha=0.12, linewidth=0)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.annotate(
        f"band {band[0]:g}-{band[1]:g}x start: entropy looks healthy",
        (1, band[1]),
        xycoords=where,
        xytext=(-4, -3),
        textcoords="offset points",
        ha="right",
        va="top",
        fontsize="small",
        color="dimgrey",
    )
    return band


def collapse_curves(
    panels: Sequence[tuple[str, Groups, Sequence[Firing]]],
    labels: Sequence[str],
    mi_line: float = 2.0,
    band: tuple[float, float] = (0.8, 2.0),
    monitor_counts: Mapping[str, tuple[int, int]] | None = None,
) -> Figure:
    """Panels stacked over one iteration axis, each (y-label, curves per label, firings), on log y-axes: per label
    the median over its curves (seeds) as a line and their 25-75% quantiles as a band. The first panel (retrieval
    over its chance level) gets a line at `mi_line`, the others (entropies over their starts) the shaded `band`.
    Firings are markers in one row per label along each panel's bottom (`_firing_rows`); `monitor_counts`, per
    monitor (runs it fired in, runs read), goes into the legend. A label's colour is its index in `labels` (as in
    the other figures); a label without any curve gets no row and no legend entry."""
    sizes = {label: max((len(groups.get(label, ())) for _, groups, _ in panels), default=0) for label in labels}
    shown = [label for label in labels if sizes[label]]
    colours = {label: colour(i) for i, label in enumerate(labels)}
    fig = Figure(figsize=(9, 3.0 * len(panels) + 1.3), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for k, (ax, (ylabel, groups, firings)) in enumerate(zip(axes, panels)):
        ax.set_yscale("log")
        bands = {label: seed_quantiles(curves) for label, curves in groups.items() if any(curves)}
        drawn = [v for _, low, _, high in bands.values() for v in (*low, *high)]
        keep = _reference(ax, k == 0, mi_line, band)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", color="dimgrey")
        limits = log_limits(drawn, keep)
        ax.set_ylim(*limits)
        for label, (steps, low, middle, high) in bands.items():
            # a value that is not positive has no place on a log axis: it sits on the data's lower edge
            low, middle, high = (np.maximum(v, limits[0]) for v in (low, middle, high))
            ax.fill_between(steps, low, high, color=colours[label], alpha=0.2, linewidth=0)
            ax.plot(steps, middle, color=colours[label], linewidth=1.8)
        _firing_rows(ax, firings, shown, colours)
        _plain_log_ticks(ax.yaxis)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="major")
    axes[-1].set_xlabel("iteration")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))

    points = [Line2D([], [], color=colours[lab], linewidth=2.5, label=f"{lab} (n={sizes[lab]})") for lab in shown]
    one_row = sum(len(h.get_label()) for h in points) < 110
    fig.legend(
        handles=points,
        loc="outside upper center",
        ncol=max(len(points) if one_row else 2, 1),
        fontsize="small",
        frameon=False,
        title=f"MI and entropy diagnostics over training, per grid point ({SPREAD_TEXT})",
        title_fontsize="medium",
    )
    monitors = []
    for monitor, marker in MONITOR_MARKERS.items():
        hollow = marker == "o"
        fired = (
            f" ({monitor_counts[monitor][0]}/{monitor_counts[monitor][1]} runs)"
            if monitor in (monitor_counts or {})
            else ""
        )
        monitors.append(
            Line2D(
                [],
                [],
                marker=marker,
                color="dimgrey",
                markerfacecolor="none" if hollow else "dimgrey",
                markersize=8 if hollow else 6.5,
                linestyle="none",
                label=f"{monitor} fired{fired}",
            )
        )
    fig.legend(
        handles=monitors,
        loc="outside lower center",
        ncol=len(monitors),
        fontsize="small",
        frameon=False,
        title="first step each monitor fired, per run (one row per grid point; a number: that many runs at that step)",
        title_fontsize="small",
    )
    return fig


def _token_shape(end: Sequence[float], band: tuple[float, float]) -> str:
    """The marker of an end point (x, y[, token entropy level / start]): where its token entropy lies against
    `band` (a circle without one)."""
    token = end[2] if len(end) > 2 else np.nan
    if token > band[1]:
        return "^"
    if token < band[0]:
        return "v"
    return "o"


NARROW_REGION = 0.2
"""a region narrower than this share of the plane's (log) width has its name written upwards"""


def _regions(ax, limits, mi_line: float, band: tuple[float, float], names: Sequence[str]) -> None:
    """Shade and name the plane's four regions (`names`: template collapse, entropy blow-up, low-entropy collapse,
    no MI loss); the collapse regions' names sit along the bottom edge, where runs seldom are (retrieval rarely
    falls far below chance), no MI loss's just above the line at the left."""
    (xlo, xhi), (ylo, yhi) = limits
    template, blow_up, low, held = names
    below = (
        (band[0], band[1], "#d62728", template),
        (band[1], xhi, "#ff7f0e", blow_up),
        (xlo, band[0], "#1f77b4", low),
    )
    span = np.log(xhi / xlo)
    for x0, x1, tint, name in below:
        ax.fill_between([x0, x1], ylo, mi_line, color=tint, alpha=0.08, linewidth=0, zorder=0)
        narrow = np.log(x1 / x0) < NARROW_REGION * span  # its name, written across, would run into its neighbours'
        ax.text(
            np.sqrt(x0 * x1),
            ylo * 1.08,
            name if narrow else name.replace(" ", "\n", 1),
            ha="center",
            va="bottom",
            rotation=90 if narrow else 0,
            fontsize="small" if narrow else None,
            color=tint,
            style="italic",
            zorder=1,
        )
    ax.fill_between([xlo, xhi], mi_line, yhi, color="#2ca02c", alpha=0.08, linewidth=0, zorder=0)
    ax.text(xlo * 1.06, mi_line * 1.06, held, ha="left", va="bottom", color="#2ca02c", style="italic", zorder=1)
    ax.axhline(mi_line, color="black", linestyle="--", linewidth=1, zorder=1)
    for x in band:
        ax.plot([x, x], [ylo, mi_line], color="grey", linestyle=":", linewidth=1, zorder=1)
        ax.plot([x, x], [mi_line, yhi], color="grey", linestyle=":", linewidth=0.6, alpha=0.5, zorder=1)


def regime_plane(
    ends: Mapping[str, Sequence[Sequence[float]]],
    paths: Mapping[str, Trajectory] | None = None,
    mi_line: float = 2.0,
    band: tuple[float, float] = (0.8, 2.0),
    names: Sequence[str] = REGION_NAMES,
    note: str = "",
    xlabel: str = "first-turn H(Z|X), level / its start",
    ylabel: str = "first-turn retrieval accuracy, level / chance level",
) -> Figure:
    """The MI-entropy plane on log axes, split at y = `mi_line` and, below it, at x = `band` into the four regimes'
    regions (`_regions`): per label, each run's end point (x, y[, token entropy level / start]) as one marker in the
    label's colour, its shape by where token entropy lies against the band; with them (beneath a few runs' markers,
    over many), the label's `paths` (xs, ys) from its first point (a dot) to its last (a diamond). The limits hold
    every point and path (a value that is not positive sits on the lower edge); `note` goes under the axes."""
    fig = Figure(figsize=(8, 6.2), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    paths = paths or {}
    xs_all = [end[0] for runs in ends.values() for end in runs] + [x for xs, _ in paths.values() for x in xs]
    ys_all = [end[1] for runs in ends.values() for end in runs] + [y for _, ys in paths.values() for y in ys]
    # the regions stay in sight: the limits reach at least 2.5x beyond the band and 4x beyond the MI line
    limits = (
        log_limits(xs_all, (band[0] / 2.5, band[1] * 2.5), margin=1.15),
        log_limits(ys_all, (mi_line / 4, mi_line * 4), margin=1.15),
    )
    _regions(ax, limits, mi_line, band, names)
    (xlo, _), (ylo, _) = limits
    handles, shapes = [], set()
    # few runs: the points' paths pass beneath their markers; many: smaller, lighter markers and the paths over them
    count = sum(map(len, ends.values()))
    few = count <= 24
    size, alpha = (55, 0.85) if few else (max(16, 55 * np.sqrt(24 / count)), 0.65)
    outline = [] if few else [patheffects.Stroke(linewidth=3.5, foreground="white", alpha=0.8), patheffects.Normal()]
    for i, (label, runs) in enumerate(ends.items()):
        if label in paths and len(paths[label][0]):
            xs, ys = np.maximum(paths[label][0], xlo), np.maximum(paths[label][1], ylo)
            line = (
                {"alpha": 0.5, "linewidth": 1.3, "zorder": 2} if few else {"alpha": 0.9, "linewidth": 1.6, "zorder": 4}
            )
            ax.plot(xs, ys, color=colour(i), path_effects=outline, **line)
            ax.plot(xs[0], ys[0], "o", color=colour(i), markersize=5, markeredgecolor="white", zorder=4)
            ax.plot(xs[-1], ys[-1], "D", color=colour(i), markersize=9, markeredgecolor="white", zorder=4)
        if not runs:
            continue
        for shape in TOKEN_SHAPES:
            kept = [end for end in runs if _token_shape(end, band) == shape]
            if kept:
                shapes.add(shape)
                x = np.maximum([end[0] for end in kept], xlo)
                y = np.maximum([end[1] for end in kept], ylo)
                ax.scatter(
                    x,
                    y,
                    s=size,
                    marker=shape,
                    color=colour(i),
                    edgecolors="black",
                    linewidths=0.5,
                    alpha=alpha,
                    zorder=3,
                )
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                markersize=8,
                color=colour(i),
                markeredgecolor="black",
                markeredgewidth=0.6,
                linestyle="none",
                label=f"{label} (n={len(runs)})",
            )
        )
    if shapes - {"o"}:
        handles.extend(
            Line2D(
                [],
                [],
                marker=shape,
                markersize=8,
                color="lightgrey",
                markeredgecolor="black",
                markeredgewidth=0.6,
                linestyle="none",
                label=text.format(*band),
            )
            for shape, text in TOKEN_SHAPES.items()
        )
    ax.set_xlim(*limits[0])
    ax.set_ylim(*limits[1])
    _plain_log_ticks(ax.xaxis)
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel(f"{xlabel} (band {band[0]:g}-{band[1]:g} dotted)")
    ax.set_ylabel(f"{ylabel} ({mi_line:g}x dashed)")
    title = "MI vs entropy at the end of training: one marker per run, at its last level"
    if paths:
        title += "\nline: each point's median over its seeds (dot: first level, diamond: last)"
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.25, which="major")
    if note:
        fig.supxlabel(note, fontsize="small", color="dimgrey")
    if handles:
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0,
            frameon=False,
            fontsize="small",
        )
    return fig
