"""scripts/reasoning_samples.py: what a run's first-turn reasonings say at an iteration, and how often."""

from __future__ import annotations

import json

import mlflow
import pytest

import reasoning_samples


@pytest.fixture
def run_folder(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    mlflow.set_tracking_uri(store)
    with mlflow.start_run() as active:
        mlflow.log_metric("rollout/format_ok_rate", 0.75, step=1)
        mlflow.log_metric("rollout/format_ok_rate", 0.5, step=2)
    mlflow.set_tracking_uri(None)
    run = tmp_path / "sokoban-grpo-20261128-000000"
    (run / "rollouts").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"mlflow_run_id": active.info.run_id}))
    rows = [("Player at (1, 2). I try Up.", 1)] * 3 + [("Player at (3, 4). I try Up.", 1), ("later turn", 2)]
    (run / "rollouts" / "iter_00000.jsonl").write_text(
        "".join(json.dumps({"prompt": "p", "reasoning": text, "turn": turn}) + "\n" for text, turn in rows)
    )
    return tmp_path, run


def test_first_turn_counts_skeletons_and_the_format_rate_of_that_step(run_folder):
    point, run = run_folder
    text = reasoning_samples.describe(run, 0, top=1, label="point")
    # 4 first turns (the turn-2 row left out), 2 distinct = 0.50; both share the skeleton "Player at (#, #). I try
    # Up." = 1.00; format rate of step 1 (rollout file 0), not step 2
    assert text.splitlines()[0] == (
        "point, iteration 1: 4 first-turn reasonings, 0.50 distinct, top skeleton 1.00, 27 characters, "
        "valid format 0.75"
    )
    assert text.splitlines()[1:] == ['     3 x "Player at (1, 2). I try Up."']
    assert reasoning_samples.run_folder(point) == run  # a sweep point holding one run


def test_a_missing_iteration_names_the_saved_ones(run_folder):
    _, run = run_folder
    with pytest.raises(SystemExit, match=r"iter_00048.jsonl does not exist \(saved iterations: \['iter_00000.jsonl'\]"):
        reasoning_samples.describe(run, 48, top=1, label="run")
