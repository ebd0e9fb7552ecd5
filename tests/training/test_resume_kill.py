"""Real kills and resumes: `fit` is SIGKILLed at one moment of a 4-iteration run that checkpoints every 2 iterations
(during the rollouts, during the update, between an iteration's training and validation metrics, right after a
checkpoint, right after the last one, and at each point between an iteration's periodic checkpoint and its
`last.ckpt`), then resumed with `trainer.resume=last`. Killed between the two, the run resumes from the periodic
checkpoint, the newest complete one. The resumed MLflow run holds every
(key, step) row of an uninterrupted run of the same config and seed exactly once, with the same values (timings
aside): the MI EMA, whose state lives in the checkpoint, the validation points (none added by the resume) and
the end-of-run summary over all 4 iterations included."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
EMA = "collapse/first_turn/mi_zscore_ema"
ITERATIONS = 4


def _args(output_dir: Path, model_dir, *extra) -> list[str]:
    return [
        "fit",
        "--config",
        str(ROOT / "conf" / "frozenlake.yaml"),
        f"model.path={model_dir}",
        f"logging.output_dir={output_dir}",
        "rollout.groups=4",  # the first-turn MI needs valid reasonings from two prompts in every iteration
        "rollout.group_size=4",
        "rollout.max_turns=1",
        "rollout.max_new_tokens=32",
        "filter.strategy=none",  # every iteration updates
        "validation.num_envs=2",
        "validation.every_n_iterations=1",
        "diagnostics.every_n_iterations=1",
        "diagnostics.num_samples=8",
        "optim.num_minibatches=2",
        "optim.micro_batch_size=4",
        "trainer.threads=1",
        f"trainer.iterations={ITERATIONS}",
        "trainer.checkpoint_every=2",
        *extra,
    ]


def _run(command: list[str], log: Path) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=600).returncode


def _rows(output_dir: Path) -> list[tuple[str, int, float]]:
    """Every metric row of the one run in `output_dir`'s store: (key, step, value), duplicates included."""
    client = MlflowClient(tracking_uri=f"sqlite:///{output_dir / 'mlruns.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ragen_lit").experiment_id])
    return [(key, m.step, m.value) for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)]


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _timing(key: str) -> bool:
    return key.startswith("time/") or key == "summary/wall_time_s"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir) -> dict[tuple[str, int], float]:
    out = tmp_path_factory.mktemp("uninterrupted")
    code = _run([sys.executable, "-m", "ragen_lit", *_args(out, tiny_model_dir)], out / "fit.log")
    assert code == 0, (out / "fit.log").read_text()[-3000:]
    return {(key, step): value for key, step, value in _rows(out)}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "iteration"),
    [
        ("rollout", 4),
        ("update", 3),
        ("validation", 3),
        ("checkpoint", 2),
        ("checkpoint", 4),
        ("periodic", 2),
        ("last-partial", 2),
        ("periodic", 4),
    ],
)
def test_a_run_killed_anywhere_resumes_to_the_uninterrupted_runs_metrics(
    tmp_path, tiny_model_dir, uninterrupted, point, iteration
):
    out = tmp_path / "run"
    killer = [sys.executable, str(ROOT / "tests" / "training" / "kill_fit.py"), point, str(iteration)]
    killed = _run([*killer, *_args(out, tiny_model_dir)], tmp_path / "killed.log")
    assert killed == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-3000:]
    resume = [sys.executable, "-m", "ragen_lit", *_args(out, tiny_model_dir, "trainer.resume=last")]
    resumed = _run(resume, tmp_path / "resumed.log")
    assert resumed == 0, (tmp_path / "resumed.log").read_text()[-3000:]

    rows = _rows(out)
    doubled = [row for row, n in Counter((key, step) for key, step, _ in rows).items() if n > 1]
    assert not doubled, doubled
    logged = {(key, step): value for key, step, value in rows}
    assert logged.keys() == uninterrupted.keys()  # nothing missing, no extra validation point
    assert sorted(step for key, step in logged if key == "val/success") == list(range(ITERATIONS + 1))
    differ = {
        row: (value, uninterrupted[row])
        for row, value in logged.items()
        if not _timing(row[0]) and not _same(value, uninterrupted[row])
    }
    assert not differ, differ
    assert all(math.isfinite(logged[(EMA, step)]) for step in range(1, ITERATIONS + 1))
    assert logged[("summary/iterations", ITERATIONS)] == ITERATIONS
    (run_json,) = out.glob("frozenlake-*/run.json")
    info = json.loads(run_json.read_text())
    assert info["finished"]["iteration"] == ITERATIONS
    (resumed_from,) = [Path(resume["checkpoint"]).name for resume in info["resumes"]]
    between = point in ("periodic", "last-partial")  # the periodic checkpoint is newer than last.ckpt
    assert resumed_from == (f"iter-{iteration:04d}.ckpt" if between else "last.ckpt")
