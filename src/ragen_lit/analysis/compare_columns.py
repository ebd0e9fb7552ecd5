"""The columns of `python -m ragen_lit compare`'s table: each reduces one logged metric history of a run to a number
(a missing metric gives NaN), by name (`val_success_final`) or as `metric:reducer` (`rollout/reward:mean`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragen_lit.analysis.predictors import value_at
from ragen_lit.analysis.runs import RunRecord
from ragen_lit.errors import ConfigError


def _last(values: list[float]) -> float:
    return values[-1]


def _mean_last3(values: list[float]) -> float:
    return sum(values[-3:]) / len(values[-3:])


def _mean_after_first(values: list[float]) -> float:
    """The steady-state mean: every value but the first (a run's first iteration pays its warm-up: CUDA graph
    capture, compilation), or the only value of a one-iteration run."""
    rest = values[1:] or values
    return sum(rest) / len(rest)


REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "last": _last,
    "first": lambda v: v[0],
    "max": max,
    "mean": lambda v: sum(v) / len(v),
    "mean_last3": _mean_last3,
    "mean_after_first": _mean_after_first,
}
AT_STEP = "at"
"""`at<N>`: the value logged at step N exactly (NaN for a run that logged none there), e.g. `val/success:at10`"""


def check_reducer(reduce: str) -> bool:
    """Whether `reduce` names a reducer: one of `REDUCERS` or `at<N>` for a step N >= 0."""
    return reduce in REDUCERS or (reduce.startswith(AT_STEP) and reduce[len(AT_STEP) :].isdigit())


@dataclass(frozen=True)
class Column:
    """A table column: `reduce` applied to the values (in step order) of the metric `metric`."""

    key: str
    title: str
    metric: str
    reduce: str

    def value(self, run: RunRecord) -> float:
        history = run.metrics.get(self.metric)
        if not history:
            return math.nan
        if self.reduce.startswith(AT_STEP) and self.reduce not in REDUCERS:
            return value_at(history, int(self.reduce[len(AT_STEP) :]))
        return REDUCERS[self.reduce]([v for _, v in history])


# the definitions of these values are in `build_table`'s docstring
COLUMNS = (
    Column("val_success_final", "final val success", "val/success", "last"),
    Column("val_success_best", "best val success", "val/success", "max"),
    Column("train_success", "train success (last 3)", "rollout/success", "mean_last3"),
    Column("mi_retrieval_acc", "MI retrieval acc", "collapse/first_turn/retrieval_acc", "last"),
    Column("mi_retrieval_chance", "MI chance", "collapse/first_turn/retrieval_chance", "last"),
    Column("mi_est", "MI estimate (nats)", "collapse/first_turn/mi_est", "last"),
    Column("token_entropy", "token entropy", "actor/entropy", "last"),
    Column("kept_ratio", "kept ratio", "filter/kept_ratio", "mean"),
    Column("rv_cv", "Std(RV)/Mean(RV)", "filter/rv_cv", "mean"),
    Column("step_time_s", "step time (s)", "time/iteration_s", "mean"),
)
DIFF_COLUMN = COLUMNS[0]
# shown by default when an evaluation (`python -m ragen_lit evaluate`) is among the runs
EVAL_COLUMNS = (Column("eval_success", "eval success", "eval/success", "last"),)
# columns known by name for --metrics and --differences, not shown by default
EXTRA_COLUMNS = (Column("val_success_mean", "mean val success", "val/success", "mean"),)


def choose_columns(names: Sequence[str] | None, runs: Sequence[RunRecord]) -> tuple[Column, ...]:
    """The default columns (with `eval success` when an evaluation is among `runs`), or the named ones: a column key
    (`val_success_final`) or any logged metric key with an optional reducer (`rollout/reward`, `rollout/reward:mean`;
    default: last)."""
    if not names:
        evaluated = any(column.metric in run.metrics for run in runs for column in EVAL_COLUMNS)
        return (*COLUMNS, *EVAL_COLUMNS) if evaluated else COLUMNS
    known = {c.key: c for c in (*COLUMNS, *EVAL_COLUMNS, *EXTRA_COLUMNS)}
    logged = {key for run in runs for key in run.metrics}
    chosen = []
    for name in names:
        metric, _, reduce = name.partition(":")
        if name in known:
            chosen.append(known[name])
        elif metric in logged and check_reducer(reduce or "last"):
            chosen.append(Column(name, name, metric, reduce or "last"))
        else:
            raise ConfigError(
                f"unknown metric '{name}': use a column ({', '.join(known)}) or a logged metric key such as "
                f"'rollout/reward', optionally ':{'|'.join(REDUCERS)}|{AT_STEP}<step>'"
            )
    return tuple(chosen)
