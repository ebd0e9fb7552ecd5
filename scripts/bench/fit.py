"""Where the time of a whole `fit` goes, run as a user runs it: one `python -m ragen_lit fit`
process, timed from the outside, and the phase clocks it logs to MLflow (`time/*`).

Phases: generation, diagnostics, prepare and update are the iterations' own clocks (`time/generation_s` ...
summed over iterations); validation is `time/validation_s` summed over the validation points; start-up and
teardown is the rest of the process's wall time (interpreter and imports, config checks, model load, MLflow
set-up, the end-of-run figures and summary).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import cpu_name, utc_now

PHASES = ("generation", "diagnostics", "prepare", "update", "validation")


def phase_seconds(store: Path) -> tuple[dict[str, float], int]:
    """{phase: seconds summed over the run} and the number of iterations, read from the run's MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    totals = {p: sum(m.value for m in client.get_metric_history(run.info.run_id, f"time/{p}_s")) for p in PHASES}
    iterations = len(client.get_metric_history(run.info.run_id, "time/iteration_s"))
    return totals, iterations


def format_table(wall: float, totals: dict[str, float], iterations: int, command: list[str]) -> str:
    other = wall - sum(totals.values())
    rows = [*((p, totals[p]) for p in PHASES), ("start-up and teardown", other)]
    lines = [
        f"machine: {cpu_name()}, {os.cpu_count()} cores",
        f"date: {utc_now()}",
        f"command: {' '.join(command)}",
        "",
        "| phase | seconds | share | per iteration (s) |",
        "|---|---:|---:|---:|",
    ]
    for name, seconds in rows:
        per = f"{seconds / iterations:.2f}" if name in PHASES[:4] and iterations else "–"
        lines.append(f"| {name} | {seconds:.1f} | {seconds / wall:.0%} | {per} |")
    lines.append(f"| **whole command** | **{wall:.1f}** | 100% | {iterations} iterations |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).resolve().parents[2] / "conf" / "frozenlake.yaml"))
    parser.add_argument("--smoke", action="store_true", help="2 small iterations: checks that the script runs")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the fit")
    args = parser.parse_args(argv)
    smoke = ["trainer.iterations=2", "rollout.groups=2", "rollout.group_size=4", "validation.num_envs=8"]
    with tempfile.TemporaryDirectory(prefix="bench_fit.") as out:
        command = [sys.executable, "-m", "ragen_lit", "fit", "--config", args.config]
        command += [*(smoke if args.smoke else []), *args.overrides, f"logging.output_dir={out}"]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            return done.returncode
        totals, iterations = phase_seconds(Path(out) / "mlruns.db")
    shown = [Path(command[0]).name, *command[1:-1]]  # the temporary output folder is not part of the recipe
    print(format_table(wall, totals, iterations, shown))
    return 0
