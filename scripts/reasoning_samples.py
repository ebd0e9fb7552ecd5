"""What a run's policy writes in its first-turn reasonings, at chosen iterations: fluent input-agnostic templates,
near-uniform tokens, or reasonings that differ with the input.

    python scripts/reasoning_samples.py RUN [RUN ...] --iterations 0 48 [--top 3] [--summary]

RUN is a run folder (the one holding `run.json` and `rollouts/`, written with `logging.save_rollouts=true`) or a
folder with exactly one such run inside (a sweep point). For each run and iteration it reads the first turn of every
episode from `rollouts/iter_<k>.jsonl` (the rollouts of logged step k + 1) and prints: their number, the share of
distinct reasonings, the share of reasonings that repeat a digit-masked skeleton most often (`(#, #)` for cells), the
mean length in characters, the share of turns with a valid answer format (`rollout/format_ok_rate` of that step in the
run's MLflow store), the early-vocabulary share, the share shared across boards, and the `--top` most frequent
reasonings with their counts. `--summary` prints instead one markdown table with a row per run and iteration.

A reasoning that no longer depends on its input comes in two kinds, which the distinct share alone does not tell
apart: a *fluent template*, made of the model's ordinary words but the same whatever the board, and *token salad*,
fragments that no longer make sentences. Two statistics separate them:

- early-vocabulary share: of all word occurrences in the iteration's first-turn reasonings, the share whose word
  also occurs in the same run's first-turn reasonings at iteration 1 (`rollouts/iter_00000.jsonl`, written before
  any update: the model's early vocabulary). Words are the runs of letters of the lower-cased text (`[a-z]+`), so
  digits and punctuation, cell coordinates among them, are not words. Every occurrence counts (token-weighted); a set
  of reasonings without any word has none (NaN, printed "–"), nor has a run that kept no rollouts of iteration 1.
  It is 1.00 at iteration 1 by construction.
- shared across boards: the share of the iteration's first-turn reasonings whose exact text occurs for two or more
  different boards (distinct `seed` values, the environment seed; `group` where a row has no `seed`). The same text
  repeated for one board is not shared: a group's samples all see one board.

A fluent template keeps the early-vocabulary share high and writes one text for many boards (shared across boards
high); salad has a low early-vocabulary share; reasonings that follow the board keep a high early-vocabulary share
and a low share across boards.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

WORD = re.compile(r"[a-z]+")
FIRST_ITERATION = 0  # the rollout file written before any update, whose words are the early vocabulary


def run_folder(path: Path) -> Path:
    if (path / "run.json").is_file():
        return path
    found = [child for child in sorted(path.iterdir()) if (child / "run.json").is_file()] if path.is_dir() else []
    if len(found) != 1:
        raise SystemExit(f"reasoning_samples: {path} holds {len(found)} run folders (a run.json); name one of them")
    return found[0]


def format_ok_rate(run: Path, step: int) -> float | None:
    """`rollout/format_ok_rate` at `step` from the run's store (None where it was not logged): the sqlite file its
    run.json names (a sweep's runs share their sweep's), or, for a run folder moved since it ran (the archives of
    docs/results), the store beside it or beside its sweep point's folder."""
    from mlflow.tracking import MlflowClient

    info = json.loads((run / "run.json").read_text())
    uri, prefix = info.get("tracking_uri", ""), "sqlite:///"
    named = [Path(uri[len(prefix) :])] if uri.startswith(prefix) else []
    store = next((p for p in [*named, run.parent / "mlruns.db", run.parent.parent / "mlruns.db"] if p.is_file()), None)
    if store is None:
        return None
    history = MlflowClient(tracking_uri=f"sqlite:///{store}").get_metric_history(
        info["mlflow_run_id"], "rollout/format_ok_rate"
    )
    return next((m.value for m in history if m.step == step), None)


def words(text: str) -> list[str]:
    """The runs of letters of the lower-cased `text`, in order; digits and punctuation separate words."""
    return WORD.findall(text.lower())


def early_vocabulary_share(texts: Iterable[str], vocabulary: set[str]) -> float:
    """Share of the word occurrences in `texts` whose word is in `vocabulary`, every occurrence counted.

    NaN when `texts` hold no word at all.
    """
    found = [word for text in texts for word in words(text)]
    if not found:
        return math.nan
    return sum(word in vocabulary for word in found) / len(found)


def board(row: Mapping) -> object:
    """The board a rollout row was written for: its `seed`, or its `group` where it has no `seed`."""
    if "seed" in row:
        return row["seed"]
    if "group" in row:
        return row["group"]
    raise ValueError("a rollout row has neither `seed` nor `group`")


def shared_across_boards(rows: Iterable[Mapping]) -> float:
    """Share of `rows` whose exact `reasoning` text occurs, among `rows`, for two or more different boards.

    A board is a row's `seed` (its `group` where it has no `seed`, see `board`); a text repeated for one board only is
    not shared. NaN for no rows.
    """
    rows = list(rows)
    if not rows:
        return math.nan
    boards: dict[str, set] = collections.defaultdict(set)
    for row in rows:
        boards[row["reasoning"]].add(board(row))
    return sum(len(boards[row["reasoning"]]) >= 2 for row in rows) / len(rows)


def rollout_file(run: Path, iteration: int) -> Path:
    """Where `fit` writes the rollouts of (0-based) `iteration` (`logging.save_rollouts=true`)."""
    return run / "rollouts" / f"iter_{iteration:05d}.jsonl"


def rollout_path(run: Path, iteration: int) -> Path:
    """The rollout file of `iteration`, refused in one line naming the saved ones where it is missing."""
    path = rollout_file(run, iteration)
    if not path.is_file():
        raise SystemExit(
            f"reasoning_samples: {path} does not exist (saved iterations: "
            f"{sorted(p.name for p in (run / 'rollouts').glob('iter_*.jsonl'))})"
        )
    return path


def first_turn_rows(path: Path) -> list[dict]:
    """The first-turn rows of a rollout file; each must name its board (`seed`, or else `group`)."""
    rows = []
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            row = json.loads(line)
            if row.get("turn") != 1:
                continue
            if "seed" not in row and "group" not in row:
                raise SystemExit(
                    f"reasoning_samples: {path} line {number} has neither `seed` nor `group` "
                    "(the board its reasoning was written for)"
                )
            rows.append(row)
    return rows


def early_vocabulary(run: Path) -> set[str] | None:
    """The words of the run's first-turn reasonings at iteration 1, before any update; None where the run kept no
    rollouts of iteration 1 (a run resumed on a machine that lacked them), whose early-vocabulary share prints "–"."""
    path = rollout_file(run, FIRST_ITERATION)
    if not path.is_file():
        return None
    return {word for row in first_turn_rows(path) for word in words(row["reasoning"])}


@dataclasses.dataclass(frozen=True)
class Statistics:
    """What one iteration's first-turn reasonings look like."""

    counts: collections.Counter  # each distinct reasoning with its count
    reasonings: int
    distinct: float
    top_skeleton: float
    characters: float
    format_ok: float | None
    early_vocabulary: float | None  # None: no rollouts of iteration 1 to compare with
    shared_across_boards: float


def statistics(run: Path, iteration: int, vocabulary: set[str] | None = None) -> Statistics:
    """The statistics of `run`'s first-turn reasonings at (0-based) `iteration`; `vocabulary` is the run's early
    vocabulary, read from its first rollout file when not given (and no share where that file is absent)."""
    path = rollout_path(run, iteration)
    rows = first_turn_rows(path)
    if not rows:
        raise SystemExit(f"reasoning_samples: {path} holds no first turn")
    if vocabulary is None:
        vocabulary = early_vocabulary(run)
    texts = [row["reasoning"] for row in rows]
    counts = collections.Counter(texts)
    skeletons = collections.Counter(re.sub(r"\d", "#", text) for text in texts)
    return Statistics(
        counts=counts,
        reasonings=len(texts),
        distinct=len(counts) / len(texts),
        top_skeleton=skeletons.most_common(1)[0][1] / len(texts),
        characters=sum(map(len, texts)) / len(texts),
        format_ok=format_ok_rate(run, iteration + 1),
        early_vocabulary=None if vocabulary is None else early_vocabulary_share(texts, vocabulary),
        shared_across_boards=shared_across_boards(rows),
    )


def share(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.2f}"


def describe(run: Path, iteration: int, top: int, label: str, vocabulary: set[str] | None = None) -> str:
    stats = statistics(run, iteration, vocabulary)
    lines = [
        f"{label}, iteration {iteration + 1}: {stats.reasonings} first-turn reasonings, "
        f"{stats.distinct:.2f} distinct, top skeleton {stats.top_skeleton:.2f}, "
        f"{stats.characters:.0f} characters, valid format {share(stats.format_ok)}, "
        f"early vocabulary {share(stats.early_vocabulary)}, shared across boards {share(stats.shared_across_boards)}"
    ]
    for text, count in stats.counts.most_common(top):
        shown = text if len(text) <= 110 else text[:107] + "..."
        lines.append(f"  {count:4d} x {json.dumps(shown, ensure_ascii=False)}")
    return "\n".join(lines)


SUMMARY_HEADER = (
    "| run | iteration | first-turn reasonings | distinct | early vocabulary | shared across boards | characters "
    "| valid format |\n|---|---:|---:|---:|---:|---:|---:|---:|"
)


def summary_row(label: str, iteration: int, stats: Statistics) -> str:
    cells = [
        label,
        str(iteration + 1),
        str(stats.reasonings),
        share(stats.distinct),
        share(stats.early_vocabulary),
        share(stats.shared_across_boards),
        f"{stats.characters:.0f}",
        share(stats.format_ok),
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (or sweep points holding one run)")
    parser.add_argument("--iterations", nargs="+", type=int, required=True, help="rollout files' iterations (0-based)")
    parser.add_argument("--top", type=int, default=3, help="most frequent reasonings shown per iteration")
    parser.add_argument(
        "--summary", action="store_true", help="one markdown table, a row per run and iteration, no reasonings"
    )
    args = parser.parse_args(argv)
    if args.summary:
        print(SUMMARY_HEADER)
    for path in args.runs:
        run = run_folder(path)
        vocabulary = early_vocabulary(run)
        for iteration in args.iterations:
            if args.summary:
                print(summary_row(str(path), iteration, statistics(run, iteration, vocabulary)))
            else:
                print(describe(run, iteration, args.top, str(path), vocabulary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
