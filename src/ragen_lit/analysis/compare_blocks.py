"""Baselines within blocks for `python -m ragen_lit compare`: `--baseline KEY=VALUE` names one factor's level rather
than a whole point. The points are then split into blocks, one per combination of the other factors' levels (and per
sweep, when the runs come from several), and each point is differenced against its block's point at that level: the
filter's effect within each algorithm of an `algo.name=grpo,ppo filter.strategy=none,top_p` grid, say.

A point's label is `key=value,...` (`sweep.point_label`), prefixed `<sweep>: ` when the runs come from several sweeps
(`runs.label_runs`); a label of any other form (a plain `fit` run's name) has no factors and is a block of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragen_lit.analysis.collapse import CollapseReading
from ragen_lit.analysis.collapse_report import monitor_rows, outcome_rows, run_rows
from ragen_lit.errors import ConfigError

AUTO_LEVEL = "filter.strategy=none"  # the within-block baseline of a multi-factor grid without --baseline
NO_OTHER_FACTOR = "no other factor"  # the name of the block of the points that have only the baseline's factor


@dataclass(frozen=True)
class Block:
    """One combination of the other factors' levels: its name (`algo.name=grpo`), its point at the baseline level
    and all its points, in the order they first appear."""

    name: str
    baseline: str
    labels: tuple[str, ...]


def factors(label: str) -> tuple[str, dict[str, str]]:
    """(the label's sweep prefix, {key: value} of its factors); a label that is not `key=value,...` is all prefix
    and has no factors. A piece without `=` continues the value before it (a value such as `[1,2]`)."""
    prefix, colon, rest = label.partition(": ")
    if not colon or "=" in prefix:
        prefix, rest = "", label
    items: dict[str, str] = {}
    key = None
    for piece in rest.split(","):
        if "=" in piece:
            key, value = piece.split("=", 1)
            items[key] = value
        elif key is None:
            return label, {}
        else:
            items[key] += "," + piece
    return prefix, items


def levels(labels: Sequence[str]) -> dict[str, list[str]]:
    """Each factor of the points and its levels, in the order they first appear."""
    found: dict[str, list[str]] = {}
    for label in labels:
        for key, value in factors(label)[1].items():
            if value not in found.setdefault(key, []):
                found[key].append(value)
    return found


def _group(labels: Sequence[str], key: str, value: str) -> list[tuple[str, list[str], list[str]]]:
    """Per block (by the other factors' levels and the sweep), in the order they first appear: its name, its points
    and those of its points whose `key` is `value`."""
    grouped: dict[tuple[str, tuple[tuple[str, str], ...]], list[str]] = {}
    for label in labels:
        prefix, items = factors(label)
        grouped.setdefault((prefix, tuple((k, v) for k, v in items.items() if k != key)), []).append(label)
    blocks = []
    for (prefix, others), members in grouped.items():
        other = ",".join(f"{k}={v}" for k, v in others)
        name = f"{prefix}: {other}" if prefix and other else prefix or other or NO_OTHER_FACTOR
        blocks.append((name, members, [m for m in members if factors(m)[1].get(key) == value]))
    return blocks


def _automatic(labels: Sequence[str]) -> tuple[Block, ...]:
    """`AUTO_LEVEL`'s blocks when the points have two factors or more, and it splits them into two blocks or more that
    each have exactly one point at it; else none (one table against one baseline point)."""
    key, value = AUTO_LEVEL.split("=", 1)
    if len(levels(labels)) < 2:
        return ()
    blocks = _group(labels, key, value)
    if len(blocks) < 2 or any(len(at) != 1 for _, _, at in blocks):
        return ()
    return tuple(Block(name, at[0], tuple(members)) for name, members, at in blocks)


def choose_blocks(labels: Sequence[str], baseline: str | None) -> tuple[tuple[Block, ...], bool]:
    """The blocks of a comparison and whether their level was chosen by default; no blocks: one table against one
    baseline point (`compare.choose_baseline`).

    `baseline` a point's label (or not `KEY=VALUE`): no blocks. `KEY=VALUE` a level of a factor of the points: a block
    per combination of the other factors' levels, a block without a point at that level refused. `KEY=VALUE` that is
    no factor's level: refused, with the factors and levels there are. None: `AUTO_LEVEL` (see `_automatic`)."""
    if baseline is None:
        blocks = _automatic(labels)
        return blocks, bool(blocks)
    prefix, level = factors(baseline)
    present = levels(labels)
    if baseline in labels or prefix or len(level) != 1 or not present:
        return (), False
    ((key, value),) = level.items()
    if value not in present.get(key, []):
        known = "; ".join(f"{k}: {', '.join(v)}" for k, v in present.items())
        raise ConfigError(f"unknown baseline '{baseline}': neither a point nor a factor's level (the levels: {known})")
    blocks = []
    for name, members, at in _group(labels, key, value):
        if not at:
            there = [factors(m)[1][key] for m in members if key in factors(m)[1]]
            have = f"its {key} levels: {', '.join(there)}" if there else f"no {key} in its points"
            raise ConfigError(f"baseline '{baseline}': the block '{name}' has no point at that level ({have})")
        blocks.append(Block(name, at[0], tuple(members)))
    return tuple(blocks), False


def collapse_by_block(readings: Sequence[CollapseReading], blocks: Sequence[Block]) -> str:
    """`collapse_report.collapse_markdown`'s three tables with each point's shares differenced against its block's
    baseline point; the points in block order, then all runs."""
    by_label: dict[str, list[CollapseReading]] = {}
    for reading in readings:
        by_label.setdefault(reading.run.label, []).append(reading)
    outcomes = outcome_rows({}, None)  # the header
    points: dict[str, list[CollapseReading]] = {}
    for block in blocks:
        within = {label: by_label[label] for label in block.labels if label in by_label}
        outcomes += outcome_rows(within, block.baseline)[2:]
        points.update(within)
    points["all"] = list(readings)
    outcomes += outcome_rows({"all": points["all"]}, None)[2:]
    tables = [run_rows(readings), outcomes, monitor_rows(points)]
    return "\n\n".join("\n".join(table) for table in tables) + "\n"
