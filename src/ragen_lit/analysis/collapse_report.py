"""The tables of `compare --collapse`: the reading of each run (`analysis.collapse`), then per grid point the
regimes' shares against the baseline point's and how each monitor read the runs of each regime."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ragen_lit.analysis.collapse import MONITORS, NO_LOSS, OUTCOMES, TEMPLATE, CollapseReading
from ragen_lit.analysis.stats import fisher_exact_p, proportion_difference, wilson_interval


def _step(step: int | None) -> str:
    return "–" if step is None else str(step)


def _text(text: str) -> str:
    """A table cell's text, its pipes escaped."""
    return text.replace("|", "\\|")


def _share(k: int, n: int) -> str:
    """k/n with Wilson's 95% interval."""
    if n == 0:
        return "0/0"
    low, high = wilson_interval(k, n)
    return f"{k}/{n} [{low:.2f}, {high:.2f}]"


def _offsets(offsets: Sequence[int]) -> str:
    """Median and range of signed step offsets, and how many there are."""
    if not offsets:
        return "–"
    median = statistics.median(offsets)
    return f"{median:+g} [{min(offsets):+d}, {max(offsets):+d}], n={len(offsets)}"


def _learns(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def _difference(k: int, n: int, k0: int, n0: int) -> str:
    d = proportion_difference(k, n, k0, n0)
    return f"{d.delta:+.3g} [{d.low:+.3g}, {d.high:+.3g}] | {fisher_exact_p(k, n, k0, n0):.3g}"


def run_rows(readings: Sequence[CollapseReading]) -> list[str]:
    lines = [
        "| point | seed | MI loss (first turn) | MI loss (trajectory) | outcome | template collapse | "
        "regime at the end | closest approach | z-score loss | alarm | entropy falls | entropy two-sided | "
        "success plateau | final val success | learns |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in readings:
        final = r.run.metrics.get("val/success", [])
        closest = "–" if r.closest is None else f"{r.closest[0]:.2f} at {r.closest[1]}"
        lines.append(
            f"| {_text(r.run.label)} | {r.run.seed or r.run.name} | {_step(r.onset['first_turn'])}"
            f" | {_step(r.onset['trajectory'])} | {r.outcome} | {_step(r.template)} | {r.regime_end or '–'}"
            f" | {closest} | {_step(r.zscore)} | {_step(r.alarm)} | {_step(r.entropy_falls)}"
            f" | {_step(r.entropy_two_sided)} | {_step(r.plateau)} | {f'{final[-1][1]:.3f}' if final else '–'}"
            f" | {_learns(r.learns)} |"
        )
    return lines


def outcome_rows(points: dict[str, list[CollapseReading]], baseline: str | None) -> list[str]:
    lines = [
        "| point | runs | template collapse | entropy blow-up | low-entropy collapse | no MI loss | "
        "Δ template collapse vs baseline [95% CI] | Fisher p | Δ any MI loss vs baseline [95% CI] | Fisher p |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    reference = points.get(baseline) if baseline else None
    for label, members in points.items():
        n = len(members)
        counts = {outcome: sum(r.outcome == outcome for r in members) for outcome in OUTCOMES}
        if reference is None or label == "all":
            delta = "– | – | – | –"
        elif label == baseline:
            delta = "baseline | – | baseline | –"
        else:
            n0 = len(reference)
            template0 = sum(r.outcome == TEMPLATE for r in reference)
            lost0 = sum(r.outcome != NO_LOSS for r in reference)
            delta = (
                f"{_difference(counts[TEMPLATE], n, template0, n0)} | {_difference(n - counts[NO_LOSS], n, lost0, n0)}"
            )
        cells = " | ".join(_share(counts[outcome], n) for outcome in OUTCOMES)
        lines.append(f"| {_text(label)} | {n} | {cells} | {delta} |")
    return lines


def monitor_rows(points: dict[str, list[CollapseReading]]) -> list[str]:
    lines = [
        "| point | monitor | on template collapse | on entropy blow-up | on low-entropy collapse | on any MI loss | "
        "false alarms (no MI loss) | false alarms (no MI loss, learns) | firing − MI loss (steps) | "
        "firing − success plateau (steps) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, members in points.items():
        for monitor in MONITORS:

            def fired(outcomes, members=members, monitor=monitor, learned=False) -> tuple[int, int]:
                runs = [r for r in members if r.outcome in outcomes and (r.learns or not learned)]
                return sum(r.monitor(monitor) is not None for r in runs), len(runs)

            lost = [r for r in members if r.mi_loss is not None and r.monitor(monitor) is not None]
            cells = [f"{k}/{n}" for k, n in (fired({outcome}) for outcome in OUTCOMES[:3])]
            cells += [_share(*fired(set(OUTCOMES[:3]))), _share(*fired({NO_LOSS}))]
            cells += [_share(*fired({NO_LOSS}, learned=True))]
            cells += [
                _offsets([r.monitor(monitor) - r.mi_loss for r in lost]),
                _offsets([r.monitor(monitor) - r.plateau for r in lost if r.plateau is not None]),
            ]
            lines.append(f"| {_text(label)} | {monitor} | " + " | ".join(cells) + " |")
    return lines


def collapse_markdown(readings: Sequence[CollapseReading], baseline: str | None = None) -> str:
    """Three tables: a row per run (each scope's first MI loss, the outcome, the first template collapse, the
    regime at the end, the closest approach to template collapse, the z-score clause, the three monitors, the
    success plateau, the final validation success, whether the run learns); per point (and all runs) the outcomes'
    shares with Wilson's 95% intervals and, against the `baseline` point, the differences of the template-collapse
    and the MI-loss shares with Newcombe's 95% intervals and Fisher's exact p; per point and monitor its hits on each
    regime, its false alarms on runs without MI loss and on those of them that learn (Wilson's intervals) and its
    steps after the MI loss and the success plateau (median [range], n)."""
    points: dict[str, list[CollapseReading]] = {}
    for r in readings:
        points.setdefault(r.run.label, []).append(r)
    points["all"] = list(readings)
    tables = [run_rows(readings), outcome_rows(points, baseline), monitor_rows(points)]
    return "\n\n".join("\n".join(table) for table in tables) + "\n"
