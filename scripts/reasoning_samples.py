"""What a run's policy writes in its first-turn reasonings, at chosen iterations: fluent input-agnostic templates,
near-uniform tokens, or reasonings that differ with the input.

    python scripts/reasoning_samples.py RUN [RUN ...] --iterations 0 48 [--top 3]

RUN is a run folder (the one holding `run.json` and `rollouts/`, written with `logging.save_rollouts=true`) or a
folder with exactly one such run inside (a sweep point). For each run and iteration it reads the first turn of every
episode from `rollouts/iter_<k>.jsonl` (the rollouts of logged step k + 1) and prints: their number, the share of
distinct reasonings, the share of reasonings that repeat a digit-masked skeleton most often (`(#, #)` for cells), the
mean length in characters, the share of turns with a valid answer format (`rollout/format_ok_rate` of that step in the
run's MLflow store) and the `--top` most frequent reasonings with their counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path


def run_folder(path: Path) -> Path:
    if (path / "run.json").is_file():
        return path
    found = [child for child in sorted(path.iterdir()) if (child / "run.json").is_file()] if path.is_dir() else []
    if len(found) != 1:
        raise SystemExit(f"reasoning_samples: {path} holds {len(found)} run folders (a run.json); name one of them")
    return found[0]


def format_ok_rate(run: Path, step: int) -> float | None:
    """`rollout/format_ok_rate` at `step` from the run's own store (None where it was not logged)."""
    from mlflow.tracking import MlflowClient

    info = json.loads((run / "run.json").read_text())
    store = run.parent / "mlruns.db"
    if not store.is_file():
        return None
    history = MlflowClient(tracking_uri=f"sqlite:///{store}").get_metric_history(
        info["mlflow_run_id"], "rollout/format_ok_rate"
    )
    return next((m.value for m in history if m.step == step), None)


def first_turn_reasonings(path: Path) -> list[str]:
    with path.open() as lines:
        return [row["reasoning"] for row in map(json.loads, lines) if row.get("turn") == 1]


def describe(run: Path, iteration: int, top: int, label: str) -> str:
    path = run / "rollouts" / f"iter_{iteration:05d}.jsonl"
    if not path.is_file():
        raise SystemExit(
            f"reasoning_samples: {path} does not exist (saved iterations: "
            f"{sorted(p.name for p in (run / 'rollouts').glob('iter_*.jsonl'))})"
        )
    texts = first_turn_reasonings(path)
    if not texts:
        raise SystemExit(f"reasoning_samples: {path} holds no first turn")
    counts = collections.Counter(texts)
    skeletons = collections.Counter(re.sub(r"\d", "#", text) for text in texts)
    rate = format_ok_rate(run, iteration + 1)
    lines = [
        f"{label}, iteration {iteration + 1}: {len(texts)} first-turn reasonings, "
        f"{len(counts) / len(texts):.2f} distinct, top skeleton {skeletons.most_common(1)[0][1] / len(texts):.2f}, "
        f"{sum(map(len, texts)) / len(texts):.0f} characters, valid format " + ("–" if rate is None else f"{rate:.2f}")
    ]
    for text, count in counts.most_common(top):
        shown = text if len(text) <= 110 else text[:107] + "..."
        lines.append(f"  {count:4d} x {json.dumps(shown, ensure_ascii=False)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (or sweep points holding one run)")
    parser.add_argument("--iterations", nargs="+", type=int, required=True, help="rollout files' iterations (0-based)")
    parser.add_argument("--top", type=int, default=3, help="most frequent reasonings shown per iteration")
    args = parser.parse_args(argv)
    for path in args.runs:
        run = run_folder(path)
        for iteration in args.iterations:
            print(describe(run, iteration, args.top, str(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
