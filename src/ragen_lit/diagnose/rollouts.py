"""The rollouts file `diagnose` reads: JSONL rows of {prompt, reasoning, group}, and the rows it skips, counted by
reason with their first line numbers."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ragen_lit.errors import ConfigError

_LINES_SHOWN = 3  # line numbers quoted per skip reason


@dataclass
class RolloutRow:
    """One usable line of the rollouts file (1-based `line`)."""

    line: int
    prompt: str
    reasoning: str
    group: int | str


@dataclass
class SkippedRows:
    """Rows left out, counted per reason, with the first few line numbers of each reason."""

    counts: Counter = field(default_factory=Counter)
    lines: dict[str, list[int]] = field(default_factory=dict)

    def add(self, reason: str, line: int) -> None:
        self.counts[reason] += 1
        shown = self.lines.setdefault(reason, [])
        if len(shown) < _LINES_SHOWN:
            shown.append(line)

    def total(self) -> int:
        return sum(self.counts.values())

    def describe(self) -> list[str]:
        """One line per reason: `<count>: <reason> (lines 3, 7, …)`, most frequent first."""
        out = []
        for reason, count in self.counts.most_common():
            shown = ", ".join(str(n) for n in self.lines[reason]) + (", …" if count > len(self.lines[reason]) else "")
            out.append(f"{count}: {reason} (line{'s' if count > 1 else ''} {shown})")
        return out


def read_rollouts(path: str | os.PathLike) -> tuple[list[RolloutRow], SkippedRows, int]:
    """Parse the JSONL file: (usable rows, skipped rows, number of non-blank lines read).

    Raises `ConfigError` if the file cannot be read as UTF-8 text."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--rollouts {str(path)!r}: no such file" + (" (it is a directory)" if path.is_dir() else ""))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--rollouts {str(path)!r}: cannot read it as UTF-8 text ({err})") from None
    rows, skipped, read = [], SkippedRows(), 0
    # split on "\n" only: str.splitlines would also cut at U+2028 etc., which JSON strings may hold raw
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        read += 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            skipped.add("not valid JSON", number)
            continue
        if not isinstance(record, dict):
            skipped.add("not a JSON object", number)
            continue
        problem = _field_problem(record)
        if problem:
            skipped.add(problem, number)
            continue
        rows.append(RolloutRow(number, record["prompt"], record["reasoning"], record["group"]))
    return rows, skipped, read


def _field_problem(record: dict) -> str | None:
    """Why a parsed object is not a usable row, or None."""
    for name in ("prompt", "reasoning", "group"):
        if name not in record:
            return f"missing field {name!r}"
    for name in ("prompt", "reasoning"):
        if not isinstance(record[name], str):
            return f"field {name!r} is not a string"
    group = record["group"]
    # bool is an int and 1.0 == 1 as a dict key: both would merge groups silently
    if isinstance(group, bool) or not isinstance(group, (int, str)):
        return "field 'group' is not an int or string"
    if not record["prompt"]:
        return "empty prompt"
    if not record["reasoning"]:
        return "empty reasoning"
    return None


def skip_summary(skipped: SkippedRows, rows_read: int) -> str:
    if not rows_read:
        return "the file has no non-blank lines"
    reasons = "; ".join(
        f"{count} {reason} (first at line {skipped.lines[reason][0]})" for reason, count in skipped.counts.most_common()
    )
    return f"{rows_read} lines read, all skipped: {reasons}"
