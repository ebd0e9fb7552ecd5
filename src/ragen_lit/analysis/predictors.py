"""Which early metric predicts a run's final success (RAGEN-2 Fig. 8): Spearman's rank correlation, across runs,
of each metric's value at one iteration with the run's last validation success.

The paper reports the MI family positively correlated with final success and the entropy family negatively; its
Fig. 8 metric is the trajectory-scope MI z-score. `python -m ragen_lit compare RUNS --predictors-at STEP` prints
this table for any set of runs (pool several sweeps by passing their folders), `--predictors-at all` one block per
iteration any predictor was logged at (token entropy is logged every iteration, the MI family at the diagnostics'
iterations), so that a correlation at one iteration is read beside the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import spearmanr

from ragen_lit.analysis.runs import History, RunRecord
from ragen_lit.errors import ConfigError

TARGET = "val/success"
PREDICTORS: tuple[tuple[str, str], ...] = (
    ("MI retrieval acc", "collapse/first_turn/retrieval_acc"),
    ("MI estimate", "collapse/first_turn/mi_est"),
    ("MI z-score", "collapse/first_turn/mi_zscore"),
    ("conditional entropy H(Z|X)", "collapse/first_turn/cond_entropy"),
    ("MI retrieval acc (trajectory)", "collapse/trajectory/retrieval_acc"),
    ("MI z-score (trajectory)", "collapse/trajectory/mi_zscore"),
    ("H(Z|X) (trajectory)", "collapse/trajectory/cond_entropy"),
    ("token entropy", "actor/entropy"),
)
EVERY_STEP = "all"
"""`--predictors-at all`: a block for every iteration the predictors were logged at"""


@dataclass(frozen=True)
class Correlation:
    """Spearman's ρ of `key` at the chosen step with the final success, its two-sided p and the runs it used."""

    label: str
    key: str
    rho: float
    p: float
    n: int


def value_at(history: History, step: int) -> float:
    """The value logged at exactly `step` (NaN when the run has none there)."""
    return next((v for s, v in history if s == step), math.nan)


def final_value(history: History) -> float:
    return history[-1][1] if history else math.nan


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, int]:
    """ρ = Pearson correlation of the ranks (ties take their mean rank), with the p-value of the t-test of
    ρ = 0 on n - 2 degrees of freedom, over the pairs where both values are finite; NaN below 3 pairs or
    when either side is constant."""
    pairs = [(a, b) for a, b in zip(x, y) if math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 3 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
        return math.nan, math.nan, len(pairs)
    result = spearmanr([a for a, _ in pairs], [b for _, b in pairs])
    return float(result.statistic), float(result.pvalue), len(pairs)


def logged_steps(runs: Sequence[RunRecord], predictors: Sequence[tuple[str, str]] = PREDICTORS) -> list[int]:
    """The iterations at which at least one run logged at least one predictor (the diagnostics' iterations)."""
    return sorted({step for r in runs for _, key in predictors for step, _ in r.metrics.get(key, [])})


def check_step(runs: Sequence[RunRecord], step: int, predictors: Sequence[tuple[str, str]] = PREDICTORS) -> None:
    """`--predictors-at step` must be an iteration some run logged the predictors at; else one line naming the
    iterations there are (an empty table of 0 runs would say nothing)."""
    steps = logged_steps(runs, predictors)
    if not steps:
        raise ConfigError(
            f"--predictors-at {step}: none of the runs logged the MI or entropy metrics (diagnostics off?)"
        )
    if step not in steps:
        shown = ", ".join(map(str, steps[:8])) + (", ..." if len(steps) > 8 else "")
        raise ConfigError(f"--predictors-at {step}: no run logged the predictors there; they were logged at {shown}")


def predictor_table(
    runs: Sequence[RunRecord], step: int, predictors: Sequence[tuple[str, str]] = PREDICTORS
) -> list[Correlation]:
    """One `Correlation` per predictor: its value at `step` in each run against that run's last `val/success`."""
    target = [final_value(r.metrics.get(TARGET, [])) for r in runs]
    rows = []
    for label, key in predictors:
        values = [value_at(r.metrics.get(key, []), step) for r in runs]
        rho, p, n = spearman(values, target)
        rows.append(Correlation(label, key, rho, p, n))
    return rows


def predictors_markdown(blocks: Sequence[tuple[int, Sequence[Correlation]]]) -> str:
    """One table: per (iteration, its correlations) block a row per predictor; a metric none of the runs logged at
    an iteration (a scope that diagnostics did not compute) is left out of that block."""
    lines = ["| iteration | metric | Spearman ρ with final val success | p | runs |", "|---|---|---|---|---|"]
    for step, rows in blocks:
        for r in rows:
            if r.n == 0:
                continue
            rho = "–" if math.isnan(r.rho) else f"{r.rho:+.2f}"
            p = "–" if math.isnan(r.p) else f"{r.p:.3f}"
            lines.append(f"| {step} | {r.label} | {rho} | {p} | {r.n} |")
    return "\n".join(lines) + "\n"


def predictor_steps(runs: Sequence[RunRecord], at: str) -> list[int]:
    """The iterations `--predictors-at` names: one (checked by `check_step`) or, for `all`, every one the
    predictors were logged at. Anything else is one line naming what is allowed."""
    if at == EVERY_STEP:
        steps = logged_steps(runs)
        if not steps:
            raise ConfigError(
                "--predictors-at all: none of the runs logged the MI or entropy metrics (diagnostics off?)"
            )
        return steps
    if not at.isdigit():
        raise ConfigError(f"--predictors-at {at}: give an iteration (a whole number) or '{EVERY_STEP}'")
    check_step(runs, int(at))
    return [int(at)]
