"""Which early metric predicts a run's later success (RAGEN-2 Fig. 8): Spearman's rank correlation, across runs,
of each metric's value at one iteration with the run's success.

The paper reports the MI family positively correlated with final success and the entropy family negatively; its
Fig. 8 metric is the trajectory-scope MI z-score. `python -m ragen_lit compare RUNS --predictors-at STEP` prints
this table for any set of runs (pool several sweeps by passing their folders), `--predictors-at all` one block per
iteration any predictor was logged at (token entropy is logged every iteration, the MI family at the diagnostics'
iterations), so that a correlation at one iteration is read beside the others.

Two options make the reading less noisy, both off by default (then the table is the one described above):

- `--predictors-target STEP`: the success is the run's mean `val/success` over its validations at steps >= STEP
  (`success_target`), not its last validation alone: "later success" as a mean of several validations, each of
  which scores only `val_groups` episodes;
- `--predictors-window N`: a predictor's value at an iteration is the mean of its last N logged points up to that
  iteration (`windowed_value`), as the collapse alarm smooths its stream: one diagnostics point scores only
  `diagnostics.num_samples` reasonings.

Whether the MI z-score predicts better than token entropy is the difference of their |ρ|; under each iteration's
table a line gives its bootstrap interval over runs and the share of resamples where it is <= 0
(`bootstrap_rho_difference`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata, spearmanr

from ragen_lit.analysis.runs import History, RunRecord
from ragen_lit.errors import ConfigError

TARGET = "val/success"
EXACT_PAIRS = 9
"""up to this many runs `spearman`'s p-value counts every pairing of the ranks (9! = 362,880); the t-test's
approximation is poor there: 3 runs in the same order give ρ = 1 and p = 0 by it, 1/3 exactly"""
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
CONTRASTED = (PREDICTORS[5], PREDICTORS[7])
"""The pair whose |ρ| difference is bootstrapped: Fig. 8's trajectory MI z-score against token entropy"""
BOOTSTRAP_MIN_RUNS = 4
"""The bootstrap line is printed when both contrasted predictors have values in at least this many runs"""
RESAMPLES = 10_000
SEED = 0
CONFIDENCE = 0.95
ROUNDING = 1e-9
"""A resampled difference within this of 0 counts as <= 0: two |ρ| of 1 can come out 2e-16 apart"""


@dataclass(frozen=True)
class Correlation:
    """Spearman's ρ of `key` at the chosen step with the success target, its two-sided p and the runs it used."""

    label: str
    key: str
    rho: float
    p: float
    n: int


@dataclass(frozen=True)
class RhoDifference:
    """|ρ(a, target)| − |ρ(b, target)| on the runs (`observed`), its percentile bootstrap interval [`low`, `high`],
    and `at_most_zero`, the share of the `used` resamples where the difference is <= 0 (a one-sided bootstrap p
    for "a predicts better than b"); `skipped` resamples had a ρ undefined and were left out; `runs` is how many
    runs were resampled."""

    observed: float
    low: float
    high: float
    at_most_zero: float
    used: int
    skipped: int
    runs: int
    confidence: float = CONFIDENCE
    seed: int = SEED


def value_at(history: History, step: int) -> float:
    """The value logged at exactly `step` (NaN when the run has none there)."""
    return next((v for s, v in history if s == step), math.nan)


def final_value(history: History) -> float:
    return history[-1][1] if history else math.nan


def windowed_value(history: History, step: int, window: int = 1) -> float:
    """The mean of the last `window` points of `history` (sorted by step, one point per step) up to and including
    `step`. The window ends at `step`: a run that logged nothing there has NaN, as `value_at` (which is
    `window=1`); a run with fewer than `window` points up to `step` has NaN too, so that every run's value is a
    mean of the same number of points. A NaN among the points makes the mean NaN."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    end = bisect.bisect_right(history, step, key=lambda point: point[0])
    if end == 0 or history[end - 1][0] != step or end < window:
        return math.nan
    return sum(v for _, v in history[end - window : end]) / window


def success_target(history: History, target_from: int | None = None) -> float:
    """The success a predictor is correlated with: the last value of `history` (the run's final validation) when
    `target_from` is None, else the mean of its values at steps >= `target_from` (the later validations, less noisy
    than one); NaN when there is none."""
    if target_from is None:
        return final_value(history)
    later = [v for s, v in history if s >= target_from]
    return sum(later) / len(later) if later else math.nan


def success_targets(runs: Sequence[RunRecord], target_from: int | None = None) -> list[float]:
    """`success_target` of each run's `val/success`. With `target_from`, a run without a validation at or after it
    is refused in one line naming the option, how many runs lack one, the first three with their last validation
    step and the largest step every run reaches (such a run's mean would be over nothing, and leaving it out
    silently would change which runs the table speaks for)."""
    targets = [success_target(r.metrics.get(TARGET, []), target_from) for r in runs]
    if target_from is None:
        return targets
    lasts = [run.metrics[TARGET][-1][0] if run.metrics.get(TARGET) else None for run in runs]
    missing = [i for i, last in enumerate(lasts) if last is None or last < target_from]
    if missing:

        def named(run: RunRecord, last: int | None) -> str:
            seed = f" seed {run.seed}" if run.seed else ""
            return f"{run.name}{seed}: " + ("no validation" if last is None else f"last validation at step {last}")

        shown = [named(runs[i], lasts[i]) for i in missing]
        listed = "; ".join(shown[:3]) + (f"; and {len(shown) - 3} more" if len(shown) > 3 else "")
        reachable = "" if None in lasts else f"; give a step <= {min(lasts)}, the earliest last validation"
        raise ConfigError(
            f"--predictors-target {target_from}: {len(missing)} of the {len(runs)} runs have no validation at or "
            f"after step {target_from} ({listed}){reachable}"
        )
    return targets


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, int]:
    """ρ = Pearson correlation of the ranks (ties take their mean rank) over the pairs where both values are finite,
    with its two-sided p-value for ρ = 0: exact up to `EXACT_PAIRS` pairs (`exact_rank_p`), beyond that the t-test on
    n - 2 degrees of freedom; NaN below 3 pairs or when either side is constant."""
    pairs = [(a, b) for a, b in zip(x, y) if math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 3 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
        return math.nan, math.nan, len(pairs)
    a, b = [a for a, _ in pairs], [b for _, b in pairs]
    result = spearmanr(a, b)
    p = exact_rank_p(a, b) if len(pairs) <= EXACT_PAIRS else float(result.pvalue)
    return float(result.statistic), p, len(pairs)


def _rank_correlation(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pearson correlation of rank vectors along the last axis (Spearman's ρ of the values they rank)."""
    u = u - u.mean(axis=-1, keepdims=True)
    v = v - v.mean(axis=-1, keepdims=True)
    return (u * v).sum(axis=-1) / np.sqrt((u * u).sum(axis=-1) * (v * v).sum(axis=-1))


def exact_rank_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of Spearman's ρ = 0 from all n! pairings of the ranks: the share of pairings whose ρ is at
    least as far from 0 as the observed one, ties kept as mean ranks. Enumerated here with numpy in one array
    (9! x 9 ranks, 26 MB, 0.1 s): `scipy.stats.permutation_test` gives the same values but took 25 s for 7 pairs
    on a 2-core CPU (this, 0.01 s)."""
    rx, ry = rankdata(x), rankdata(y)
    n = len(ry)
    pairings = np.fromiter(itertools.chain.from_iterable(itertools.permutations(ry)), float, math.factorial(n) * n)
    rho = _rank_correlation(rx, pairings.reshape(-1, n))
    return float(np.mean(np.abs(rho) >= abs(_rank_correlation(rx, ry)) - 1e-12))


def _resampled_rho(x: np.ndarray, y: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Spearman's ρ of x with y in each resample (a row of `draws`, indices into x and y), as `spearman` computes it:
    over the drawn pairs where both are finite, Pearson correlation of their ranks (ties: mean rank); NaN below 3
    such pairs or when either side is constant. Non-finite values are set to +inf before ranking, so that they
    rank above every finite one and leave the finite ones their ranks among themselves."""
    xs, ys = x[draws], y[draws]
    ok = np.isfinite(xs) & np.isfinite(ys)
    rx = np.where(ok, rankdata(np.where(ok, xs, np.inf), axis=1), 0.0)
    ry = np.where(ok, rankdata(np.where(ok, ys, np.inf), axis=1), 0.0)
    m = ok.sum(axis=1)
    dx = np.where(ok, rx - (rx.sum(axis=1) / np.maximum(m, 1))[:, None], 0.0)
    dy = np.where(ok, ry - (ry.sum(axis=1) / np.maximum(m, 1))[:, None], 0.0)
    sxx, syy, sxy = (dx * dx).sum(axis=1), (dy * dy).sum(axis=1), (dx * dy).sum(axis=1)
    defined = (m >= 3) & (sxx > 1e-9) & (syy > 1e-9)  # ranks are multiples of 1/2: a spread is at least 1/4
    rho = np.full(len(draws), np.nan)
    rho[defined] = sxy[defined] / np.sqrt(sxx[defined] * syy[defined])
    return rho


def bootstrap_rho_difference(
    a: Sequence[float],
    b: Sequence[float],
    target: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> RhoDifference:
    """Does predictor `a` rank the runs' success better than `b`? The difference D = |ρ_a| − |ρ_b| of their
    Spearman correlations with `target` (one value per run in each sequence; each ρ over the runs where it and the
    target are finite, as `spearman`), with a percentile bootstrap over runs: `resamples` draws of the runs with
    replacement (`numpy.random.default_rng(seed).integers(0, n, (resamples, n))`, so the output is reproducible),
    D recomputed in each; the interval is the (1 − confidence)/2 and (1 + confidence)/2 quantiles of those D
    and `at_most_zero` the share of them <= 0 (up to `ROUNDING`). The runs resampled are those with a finite target
    and a value of `a` or `b`. A resample where either ρ is undefined (fewer than 3 pairs, or a side constant: a run
    drawn every time) is skipped and counted. |ρ|, not ρ: the paper's claim is on the strength of the relation, and the
    entropy family's ρ is negative.

    Refused (ValueError) when `a` or `b` has values in fewer than `BOOTSTRAP_MIN_RUNS` runs, when either observed
    ρ is undefined, or for no resamples or a confidence outside (0, 1)."""
    if not (len(a) == len(b) == len(target)):
        raise ValueError(f"one value per run: got {len(a)}, {len(b)} and {len(target)}")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"resamples must be >= 1 and confidence in (0, 1), got {resamples} and {confidence}")
    (rho_a, _, n_a), (rho_b, _, n_b) = spearman(a, target), spearman(b, target)
    if min(n_a, n_b) < BOOTSTRAP_MIN_RUNS:
        raise ValueError(f"needs both predictors in at least {BOOTSTRAP_MIN_RUNS} runs, got {n_a} and {n_b}")
    if math.isnan(rho_a) or math.isnan(rho_b):
        raise ValueError("a correlation is undefined on the runs themselves (a constant side)")
    x_a, x_b, y = (np.asarray(v, dtype=float) for v in (a, b, target))
    keep = np.isfinite(y) & (np.isfinite(x_a) | np.isfinite(x_b))
    x_a, x_b, y = x_a[keep], x_b[keep], y[keep]
    n = len(y)
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    differences = np.abs(_resampled_rho(x_a, y, draws)) - np.abs(_resampled_rho(x_b, y, draws))
    differences = differences[np.isfinite(differences)]
    if len(differences) == 0:
        low = high = share = math.nan
    else:
        low, high = np.percentile(differences, [50 * (1 - confidence), 50 * (1 + confidence)])
        share = float(np.mean(differences <= ROUNDING))
    return RhoDifference(
        abs(rho_a) - abs(rho_b),
        float(low),
        float(high),
        share,
        len(differences),
        resamples - len(differences),
        n,
        confidence,
        seed,
    )


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


def predictor_values(runs: Sequence[RunRecord], key: str, step: int, window: int = 1) -> list[float]:
    """`windowed_value` of metric `key` at `step` in each run (NaN where the run did not log it there)."""
    return [windowed_value(r.metrics.get(key, []), step, window) for r in runs]


def predictor_table(
    runs: Sequence[RunRecord],
    step: int,
    predictors: Sequence[tuple[str, str]] = PREDICTORS,
    target_from: int | None = None,
    window: int = 1,
    targets: Sequence[float] | None = None,
) -> list[Correlation]:
    """One `Correlation` per predictor: its value at `step` (the mean of its last `window` points up to `step`) in
    each run against that run's success (its last `val/success`, or with `target_from` its mean from that step on;
    `targets` when already computed by `success_targets`)."""
    target = success_targets(runs, target_from) if targets is None else targets
    rows = []
    for label, key in predictors:
        rho, p, n = spearman(predictor_values(runs, key, step, window), target)
        rows.append(Correlation(label, key, rho, p, n))
    return rows


def target_name(target_from: int | None = None) -> str:
    """What the predictors are correlated with, in words."""
    return "final val success" if target_from is None else f"mean val success from step {target_from}"


def predictors_markdown(
    blocks: Sequence[tuple[int, Sequence[Correlation]]],
    target_from: int | None = None,
) -> str:
    """One table: per (iteration, its correlations) block a row per predictor; a metric none of the runs logged at
    an iteration (a scope that diagnostics did not compute) is left out of that block."""
    lines = [
        f"| iteration | metric | Spearman ρ with {target_name(target_from)} | p | runs |",
        "|---|---|---|---|---|",
    ]
    for step, rows in blocks:
        for r in rows:
            if r.n == 0:
                continue
            rho = "–" if math.isnan(r.rho) else f"{r.rho:+.2f}"
            p = "–" if math.isnan(r.p) else f"{r.p:.3f}"
            lines.append(f"| {step} | {r.label} | {rho} | {p} | {r.n} |")
    return "\n".join(lines) + "\n"


def _signed(x: float) -> str:
    """x to two decimals with its sign, a rounding error around 0 shown as +0.00 (not -0.00)."""
    return f"{round(x, 2) + 0.0:+.2f}"


def bootstrap_markdown(differences: Sequence[tuple[int, RhoDifference]]) -> str:
    """One table, a row per iteration: D = |ρ(MI z-score (trajectory))| − |ρ(token entropy)|, its percentile
    bootstrap interval, the share of resamples with D <= 0 (a one-sided p for "MI predicts better"), the resamples
    used (those where a ρ was undefined, a constant side, are left out) and the runs resampled."""
    (a, _), (b, _) = CONTRASTED
    confidence = differences[0][1].confidence if differences else CONFIDENCE
    seed = differences[0][1].seed if differences else SEED
    lines = [
        f"| iteration | \\|ρ\\| of {a} − \\|ρ\\| of {b} | bootstrap {confidence:.0%} interval (runs resampled, "
        f"seed {seed}) | share of resamples <= 0 | resamples used | runs |",
        "|---|---|---|---|---|---|",
    ]
    for step, d in differences:
        interval = "–" if math.isnan(d.low) else f"[{_signed(d.low)}, {_signed(d.high)}]"
        share = "–" if math.isnan(d.at_most_zero) else f"{d.at_most_zero:.3f}"
        lines.append(
            f"| {step} | {_signed(d.observed)} | {interval} | {share} | {d.used:,} of {d.used + d.skipped:,} | "
            f"{d.runs} |"
        )
    return "\n".join(lines) + "\n"


def predictors_report(
    runs: Sequence[RunRecord], steps: Sequence[int], target_from: int | None = None, window: int = 1
) -> str:
    """The markdown of `compare --predictors-at`: the table of `predictor_table` over `steps` and, for the
    iterations where both `CONTRASTED` predictors have values in at least `BOOTSTRAP_MIN_RUNS` runs and a defined ρ,
    the table of `bootstrap_rho_difference` under it."""
    targets = success_targets(runs, target_from)
    blocks, differences = [], []
    (_, key_a), (_, key_b) = CONTRASTED
    for step in steps:
        rows = predictor_table(runs, step, target_from=target_from, window=window, targets=targets)
        blocks.append((step, rows))
        by_key = {r.key: r for r in rows}
        if all(by_key[k].n >= BOOTSTRAP_MIN_RUNS and math.isfinite(by_key[k].rho) for k in (key_a, key_b)):
            a, b = (predictor_values(runs, key, step, window) for key in (key_a, key_b))
            differences.append((step, bootstrap_rho_difference(a, b, targets)))
    text = predictors_markdown(blocks, target_from)
    return text + ("\n" + bootstrap_markdown(differences) if differences else "")


def predictors_heading(target_from: int | None = None, window: int = 1) -> str:
    """The line `compare` prints above the table: what is correlated with what."""
    target = "final success" if target_from is None else f"mean validation success from step {target_from}"
    smoothing = f"predictors: mean of their last {window} points up to the iteration; " if window > 1 else ""
    return f"Early metrics as predictors of {target} ({smoothing}across all runs above):"


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


def check_predictor_options(
    runs: Sequence[RunRecord], at: str | None, target_from: int | None = None, window: int = 1
) -> list[int]:
    """The iterations of `--predictors-at` (`predictor_steps`; none without it), after the refusals of its companion
    options, each one line: `--predictors-target` or `--predictors-window` without `--predictors-at`, a window
    below 1, a negative target step, a run without a validation from the target step on (`success_targets`)."""
    if at is None:
        if target_from is not None or window != 1:
            given = "--predictors-target" if target_from is not None else "--predictors-window"
            raise ConfigError(f"{given} changes the predictors table: give --predictors-at STEP|all with it")
        return []
    if window < 1:
        raise ConfigError(f"--predictors-window {window}: give a number of points >= 1")
    if target_from is not None and target_from < 0:
        raise ConfigError(f"--predictors-target {target_from}: give a step >= 0")
    steps = predictor_steps(runs, at)
    success_targets(runs, target_from)
    return steps
