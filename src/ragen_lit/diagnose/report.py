"""The printed report of `diagnose`: the row and column counts, then each metric beside its chance level and upper
bound."""

from __future__ import annotations

from ragen_lit.diagnose.scoring import DiagnoseResult

# (metric, chance, upper bound): chance/upper bound are a value or a key of the computed values;
# "no prompt information" is 0 for the MI estimates and z-scores.
_TABLE = (
    ("retrieval_acc", "retrieval_chance", 1.0),
    ("recall@2", "recall@2_chance", 1.0),
    ("recall@4", "recall@4_chance", 1.0),
    ("recall@8", "recall@8_chance", 1.0),
    ("mi_est", 0.0, "mi_upper_bound"),
    ("mi_seq_est", 0.0, "mi_upper_bound"),
    ("mi_zscore", 0.0, None),
    ("mi_zscore_ema", 0.0, None),
    ("mi_zscore_seq", 0.0, None),
    ("mi_zscore_ema_seq", 0.0, None),
    ("cond_entropy", None, None),
    ("reasoning_entropy", None, None),
    ("cond_entropy_seq", None, None),
    ("reasoning_entropy_seq", None, None),
    ("matched_logprob", None, None),
    ("marginal_logprob", None, None),
    ("marginal_std", None, None),
    ("matched_logprob_seq", None, None),
    ("marginal_logprob_seq", None, None),
    ("marginal_std_seq", None, None),
)
# shown as their own columns (or in the header) rather than as rows
_NOT_ROWS_SUFFIXES = ("_chance", "_above_chance")
_HEADER_KEYS = ("mi_upper_bound", "num_rows", "num_columns")


def table_rows(values: dict[str, float]) -> list[tuple[str, float, float | None, float | None, float | None]]:
    """(metric, value, chance, above chance, upper bound) for every metric in `values`: the known ones in
    `_TABLE` order, then any others the metric family gained, without chance or bound."""

    def lookup(spec):
        return values.get(spec) if isinstance(spec, str) else spec

    out = []
    for name, chance_spec, bound_spec in _TABLE:
        if name in values:
            chance = lookup(chance_spec)
            out.append(
                (name, values[name], chance, None if chance is None else values[name] - chance, lookup(bound_spec))
            )
    known = {name for name, _, _ in _TABLE}
    for name, value in values.items():
        if name not in known and name not in _HEADER_KEYS and not name.endswith(_NOT_ROWS_SUFFIXES):
            out.append((name, value, None, None, None))
    return out


def format_report(result: DiagnoseResult, model: str, rollouts: str) -> str:
    """The printed report: counts, then the aligned metric table."""
    values = result.values
    skipped = result.skipped.total()
    lines = [
        "MI collapse diagnostics (docs/METHOD.md §3)",
        f"model      {model}",
        f"rollouts   {rollouts}",
        f"rows       {result.rows_used} used, {skipped} skipped, of {result.rows_read} read",
        *(f"  skipped {line}" for line in result.skipped.describe()),
    ]
    if result.subsampled_from is not None:
        lines.append(f"           (a seeded subsample of {result.rows_used} of {result.subsampled_from} usable rows)")
    lines += [
        f"columns    {result.num_columns} groups, {result.num_distinct_prompts} distinct prompts;"
        f" MI upper bound log N = {values['mi_upper_bound']:.4f}",
        "",
    ]
    header = ("metric", "value", "chance", "above chance", "upper bound")
    cells = [header] + [
        (name, _number(value), _number(chance), _number(above, signed=True), _number(bound))
        for name, value, chance, above, bound in table_rows(values)
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        lines.append(
            "  ".join([row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:]))]).rstrip()
        )
    return "\n".join(lines)


def _number(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.4f}" if signed else f"{value:.4f}"
