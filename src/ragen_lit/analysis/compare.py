"""`python -m ragen_lit compare`: one table of runs grouped by grid point, against a baseline, plus figures.

Per run, each column reduces one logged metric history to a number (a missing metric gives NaN, shown
"–"; `compare_columns`); per grid point the table shows mean ± sample std over its runs (seeds), and the difference of
final validation success against the baseline point with a 95% Welch interval (see `stats.welch_difference`). With a
factor's level as the baseline the table is one per block of the other factors' levels, each against its own point at
that level (`compare_blocks`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ragen_lit.analysis.collapse import read_run
from ragen_lit.analysis.collapse_report import collapse_markdown
from ragen_lit.analysis.compare_blocks import AUTO_LEVEL, Block, choose_blocks, collapse_by_block
from ragen_lit.analysis.compare_columns import COLUMNS, DIFF_COLUMN, Column, choose_columns
from ragen_lit.analysis.plots import write_figures
from ragen_lit.analysis.predictors import check_predictor_options, predictors_heading, predictors_report
from ragen_lit.analysis.runs import (
    RunRecord,
    find_stores,
    is_evaluation,
    label_runs,
    load_runs,
    select_runs,
    store_folder,
)
from ragen_lit.analysis.stats import Difference, Summary, summarize, welch_difference
from ragen_lit.analysis.tracking import log_comparison
from ragen_lit.errors import ConfigError
from ragen_lit.run.store import STORE_NAME, check_sqlite_database, sqlite_path

FORMATS = {"markdown": "md", "csv": "csv", "json": "json"}  # format: file suffix
CONFIDENCE = 0.95
BASELINE_HINT = "strategy=none"  # the unfiltered point is the natural reference of an RV-filter sweep
MISSING = "–"


@dataclass(frozen=True)
class Row:
    """One grid point: its runs (of which `unfinished` did not finish: killed, failed or still running), each
    column's per-run values and their summary, and per difference column its difference to the baseline (empty
    on the baseline row itself)."""

    label: str
    runs: tuple[RunRecord, ...]
    values: dict[str, list[float]]
    cells: dict[str, Summary]
    differences: dict[str, Difference]
    unfinished: int = 0


@dataclass(frozen=True)
class Table:
    """`baseline`: the point every row is differenced against; with `blocks`, the factor's level (`KEY=VALUE`) of
    each block's own baseline point, `automatic` when it was chosen by default (`compare_blocks.choose_blocks`). The
    rows are in block order."""

    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    baseline: str
    differences: tuple[Column, ...] = (DIFF_COLUMN,)
    blocks: tuple[Block, ...] = ()
    automatic: bool = False


def group_runs(runs: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    """Runs by label, labels in the order they first appear."""
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


def choose_baseline(labels: Sequence[str], baseline: str | None) -> str:
    """`baseline` when given (it must be a label); else the first label containing 'strategy=none', else
    the first label."""
    if baseline is not None:
        if baseline not in labels:
            raise ConfigError(f"unknown baseline '{baseline}': the points are {', '.join(map(repr, labels))}")
        return baseline
    return next((label for label in labels if BASELINE_HINT in label), labels[0])


def build_table(
    runs: Sequence[RunRecord],
    baseline: str | None = None,
    columns: tuple[Column, ...] = COLUMNS,
    differences: tuple[Column, ...] = (DIFF_COLUMN,),
) -> Table:
    """One row per label (grid point): each column's mean ± sample std over the label's runs, with n the
    runs that logged the metric, and for each of `differences` (default: final validation success) the difference
    to the baseline (`choose_baseline`), or to its block's baseline (`compare_blocks.choose_blocks`: `baseline` a
    factor's level), with its Welch interval.

    The default columns, per run, from the run's history of each metric in step order (missing: NaN):

      final val success  = last `val/success` (the end-of-run validation)
      best val success   = max `val/success` over every validation, step 0 (before any update) included
      train success      = mean of the last 3 `rollout/success` (training rollouts, less noisy than one)
      MI retrieval acc   = last `collapse/first_turn/retrieval_acc`; chance = last `.../retrieval_chance`
      MI estimate        = last `collapse/first_turn/mi_est` (nats)
      token entropy      = last `actor/entropy`
      kept ratio         = mean `filter/kept_ratio` over iterations (share of groups the RV filter kept)
      Std(RV)/Mean(RV)   = mean `filter/rv_cv` over iterations
      step time          = mean `time/iteration_s` over iterations (seconds)
      eval success       = `eval/success` of an evaluation run (`python -m ragen_lit evaluate`), when there is one

    Per cell x̄ = Σx/n and s = sqrt(Σ(x - x̄)²/(n - 1)); Δ = x̄_point - x̄_baseline ± t_{0.975,ν}·se with
    se and ν from `stats.welch_difference`.
    """
    groups = group_runs(runs)
    if not groups:
        raise ConfigError("no runs found to compare")
    blocks, automatic = choose_blocks(list(groups), baseline)
    if blocks:
        reference = {label: block.baseline for block in blocks for label in block.labels}
        level = AUTO_LEVEL if baseline is None else baseline
    else:
        level = choose_baseline(list(groups), baseline)
        reference = dict.fromkeys(groups, level)
    rows = []
    for label in reference:
        members = groups[label]
        values = {c.key: [c.value(r) for r in members] for c in columns}
        deltas = {}
        if label != reference[label]:
            for column in differences:
                point, base = ([column.value(r) for r in runs] for runs in (members, groups[reference[label]]))
                deltas[column.key] = welch_difference(point, base, CONFIDENCE)
        unfinished = sum(r.status != "FINISHED" for r in members)
        cells = {k: summarize(v) for k, v in values.items()}
        rows.append(Row(label, tuple(members), values, cells, deltas, unfinished))
    return Table(columns, tuple(rows), level, differences, blocks, automatic)


def _num(x: float) -> str:
    return MISSING if math.isnan(x) else f"{x:.3g}"


def _cell(summary: Summary, n_runs: int) -> str:
    if summary.n == 0:
        return MISSING
    text = _num(summary.mean) if summary.n < 2 else f"{_num(summary.mean)} ± {_num(summary.std)}"
    return text if summary.n == n_runs else f"{text} (n={summary.n})"


def _difference_cell(difference: Difference | None) -> str:
    if difference is None:  # the baseline row
        return "baseline"
    if math.isnan(difference.delta):
        return MISSING
    if math.isnan(difference.low):
        return f"{difference.delta:+.3g} (no interval: n < 2)"
    return f"{difference.delta:+.3g} [{difference.low:+.3g}, {difference.high:+.3g}]"


def _runs_cell(row: Row) -> str:
    """The number of runs, and how many of them did not finish (their values are their last logged ones)."""
    return f"{len(row.runs)} ({row.unfinished} unfinished)" if row.unfinished else str(len(row.runs))


def _markdown_rows(table: Table, rows: Sequence[Row]) -> list[str]:
    head = ["point", "n"] + [c.title for c in table.columns]
    head += [f"Δ {c.title} vs baseline [{CONFIDENCE:.0%} CI]" for c in table.differences]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.label.replace("|", "\\|"), _runs_cell(row)]
        cells += [_cell(row.cells[c.key], len(row.runs)) for c in table.columns]
        cells += [_difference_cell(row.differences.get(c.key)) for c in table.differences]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def to_markdown(table: Table) -> str:
    """A GitHub table: one row per point, `mean ± std` per column (n shown where fewer runs had the metric), a Δ
    column per difference column; a point with unfinished runs says how many in its n. With blocks, one such table
    per block under a line naming it (`algo.name=grpo:`)."""
    if not table.blocks:
        lines = [*_markdown_rows(table, table.rows), ""]
        baseline = table.baseline
    else:
        rows = {row.label: row for row in table.rows}
        lines = []
        for block in table.blocks:
            lines += [f"{block.name}:", "", *_markdown_rows(table, [rows[label] for label in block.labels]), ""]
        chosen = " (by default: every block has exactly one)" if table.automatic else ""
        baseline = f"the point with {table.baseline} in each block{chosen}"
    lines.append(
        f"mean ± sample std over seeds; baseline: {baseline}; Δ = mean difference with a Welch "
        f"{CONFIDENCE:.0%} interval; {MISSING}: not logged"
    )
    return "\n".join(lines) + "\n"


def _block_names(table: Table) -> dict[str, str]:
    """Each point's block (none without blocks)."""
    return {label: block.name for block in table.blocks for label in block.labels}


def to_csv(table: Table) -> str:
    """One row per point: its block (with blocks only), label, n_runs, n_unfinished, seeds, `<column>_mean/_std/_n`
    and per difference column `delta_<column>` with its `_low`, `_high` and `_df` (empty on the baseline row)."""
    out = io.StringIO()
    writer = csv.writer(out)
    blocks = _block_names(table)
    header = (["block"] if blocks else []) + ["point", "n_runs", "n_unfinished", "seeds"]
    header += [f"{c.key}_{part}" for c in table.columns for part in ("mean", "std", "n")]
    header += [f"delta_{c.key}{part}" for c in table.differences for part in ("", "_low", "_high", "_df")]
    writer.writerow(header)
    for row in table.rows:
        record = [blocks[row.label]] if blocks else []
        record += [row.label, len(row.runs), row.unfinished, " ".join(_seeds(row))]
        record += [x for c in table.columns for x in (row.cells[c.key].mean, row.cells[c.key].std, row.cells[c.key].n)]
        for column in table.differences:
            d = row.differences.get(column.key)
            # the baseline row has no difference: empty fields, not a misleading 0 ± 0
            record += ["", "", "", ""] if d is None else [d.delta, d.low, d.high, d.df]
        writer.writerow(record)
    return out.getvalue()


def to_dict(table: Table) -> dict:
    """Every number of the table, NaN and inf as None (JSON has neither): per point each column's mean, std,
    n and per-run values (in run order, with the run ids), and per difference column the difference to the
    baseline (none on the baseline row). With blocks, each point's `block` and the `blocks` with their baselines."""

    def clean(x: float) -> float | None:
        return x if math.isfinite(x) else None

    blocks = _block_names(table)
    rows = []
    for row in table.rows:
        rows.append(
            {
                **({"block": blocks[row.label]} if blocks else {}),
                "label": row.label,
                "n_runs": len(row.runs),
                "n_unfinished": row.unfinished,
                "seeds": _seeds(row),
                "run_ids": [r.run_id for r in row.runs],
                "values": {
                    key: {
                        "mean": clean(s.mean),
                        "std": clean(s.std),
                        "n": s.n,
                        "runs": [clean(v) for v in row.values[key]],
                    }
                    for key, s in row.cells.items()
                },
                "differences": {
                    key: {"delta": clean(d.delta), "low": clean(d.low), "high": clean(d.high), "df": clean(d.df)}
                    for key, d in row.differences.items()
                },
            }
        )
    data = {
        "baseline": table.baseline,
        "confidence": CONFIDENCE,
        "columns": [c.__dict__ for c in table.columns],
        "differences": [c.__dict__ for c in table.differences],
        "rows": rows,
    }
    if table.blocks:
        data["automatic"] = table.automatic
        data["blocks"] = [{"block": b.name, "baseline": b.baseline, "points": list(b.labels)} for b in table.blocks]
    return data


def _seeds(row: Row) -> list[str]:
    return [r.seed for r in row.runs]


def render(table: Table, fmt: str) -> str:
    if fmt == "markdown":
        return to_markdown(table)
    if fmt == "csv":
        return to_csv(table)
    return json.dumps(to_dict(table), indent=2) + "\n"


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"unknown --format '{fmt}': use one of {', '.join(FORMATS)}")


def default_out(paths: Sequence[Path], tracking_uri: str | None) -> Path:
    """`<first PATH>/compare` (beside a store file given as PATH), else beside a sqlite `--tracking-uri`'s
    database, else `./compare`."""
    if paths:
        return (paths[0] if paths[0].is_dir() else paths[0].parent) / "compare"
    folder = store_folder(tracking_uri) if tracking_uri else None
    return (folder or Path.cwd()) / "compare"


def run_compare(
    targets: Sequence[str],
    tracking_uri: str | None = None,
    baseline: str | None = None,
    fmt: str = "markdown",
    out: str | None = None,
    metrics: Sequence[str] | None = None,
    predictors_at: str | None = None,
    finished_only: bool = False,
    differences: Sequence[str] | None = None,
    collapse: bool = False,
    predictors_target: int | None = None,
    predictors_window: int = 1,
) -> int:
    """Print the table of the runs under `targets` to stdout; write figures and the table into the output
    folder and log them as the `compare` run of `--tracking-uri` (else of the first store found).

    A target that exists is a folder (or store file) to search for `**/mlruns.db`; any other target picks
    runs by id, run name or point among the loaded ones. No target: the current directory. `differences`: the
    columns (names or `metric:reducer`, as `metrics`) whose difference to the baseline is shown, default final
    validation success; `predictors_at`: an iteration or `all` (`predictors.predictor_steps`), correlated with each
    run's last validation success or, with `predictors_target`, its mean validation success from that step on,
    each predictor the mean of its last `predictors_window` points (`predictors.predictors_report`); `collapse`: also
    the per-run reading of MI loss and its regime, the alarm and two entropy monitors (`analysis.collapse`, tables
    of `analysis.collapse_report`).
    """
    check_format(fmt)
    paths = [Path(t) for t in targets if Path(t).exists()]
    selectors = [t for t in targets if not Path(t).exists()]
    if selectors and not paths and not tracking_uri:
        raise ConfigError(f"'{selectors[0]}' is not a path (and no --tracking-uri to find it as a run id or name)")
    if not targets and not tracking_uri:
        paths = [Path.cwd()]
    uris = find_stores(paths) + ([tracking_uri] if tracking_uri else [])
    if not uris:
        raise ConfigError(f"no MLflow store ({STORE_NAME}) under {', '.join(map(str, paths))}")
    for path in filter(None, map(sqlite_path, uris)):
        if path.exists():  # a corrupt file: one line, not MLflow's minutes of retries and a traceback
            check_sqlite_database(path, "compare")
    runs = label_runs(select_runs(load_runs(uris), selectors))
    if not runs:
        raise ConfigError(f"no runs found in {', '.join(uris)}")
    unfinished = [r for r in runs if r.status != "FINISHED"]
    if finished_only:
        runs = [r for r in runs if r.status == "FINISHED"]
        if not runs:
            raise ConfigError("--finished-only: none of the runs finished")
    if unfinished:  # a run stopped midway has a "final" value that is only its last one
        names = ", ".join(f"{r.name} ({r.status})" for r in unfinished[:6]) + (" ..." if len(unfinished) > 6 else "")
        verb = "left out (--finished-only)" if finished_only else "in the table with their last logged values"
        print(f"warning: {len(unfinished)} run(s) did not finish, {verb}: {names}", file=sys.stderr)
    trained = [run for run in runs if not is_evaluation(run)]  # evaluations have no training curves to read
    steps = check_predictor_options(trained, predictors_at, predictors_target, predictors_window)
    compared = choose_columns(differences, runs) if differences else (DIFF_COLUMN,)
    table = build_table(runs, baseline, choose_columns(metrics, runs), compared)
    text = render(table, fmt)
    sys.stdout.write(text)
    extra = []
    if steps:
        predictors = predictors_report(trained, steps, predictors_target, predictors_window)
        if fmt == "markdown":
            sys.stdout.write(f"\n{predictors_heading(predictors_target, predictors_window)}\n\n" + predictors)
        extra.append(("predictors.md", predictors))
    if collapse:
        read = [read_run(run) for run in trained]
        readings = collapse_by_block(read, table.blocks) if table.blocks else collapse_markdown(read, table.baseline)
        if fmt == "markdown":
            sys.stdout.write("\nTemplate collapse, run by run (steps are iterations; –: never):\n\n" + readings)
        extra.append(("collapse.md", readings))

    folder = default_out(paths, tracking_uri) if out is None else Path(out)
    files = write_figures(group_runs(trained), folder)
    folder.mkdir(parents=True, exist_ok=True)
    tables = [folder / f"compare.{FORMATS[fmt]}"]
    tables[0].write_text(text)
    if fmt != "json":  # every number, whatever was printed
        tables.append(folder / "compare.json")
        tables[1].write_text(render(table, "json"))
    for name, content in extra:
        tables.append(folder / name)
        tables[-1].write_text(content)
    target = tracking_uri or uris[0]
    run_id = log_comparison(
        target,
        files + tables,
        {
            "baseline": table.baseline,
            "points": str(len(table.rows)),
            "runs": str(len(runs)),
            **({"blocks": str(len(table.blocks))} if table.blocks else {}),
        },
    )
    print(f"figures and table: {folder} ({', '.join(p.name for p in files + tables)})", file=sys.stderr)
    print(f"MLflow: {target} (run {run_id}, experiment 'compare')", file=sys.stderr)
    return 0
