"""`fit` on the recipes of the coding, search_qa and webshop environments with the tiny model:
two iterations of multi-turn rollouts, an update each, validation, MLflow metrics and the rollouts file. The
tiny model was not built on these envs, so the rewards are whatever it stumbles into: this checks the wiring,
not learning."""

import json
from pathlib import Path

import mlflow
import pytest

from ragen_lit.cli import fit
from ragen_lit.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _fit_two_iterations(env: str, tmp_path: Path, model: Path, *extra: str):
    overrides = [
        f"model.path={model}",
        f"logging.output_dir={tmp_path}",
        "rollout.groups=2",
        "rollout.group_size=4",
        "validation.num_envs=2",
        "validation.every_n_iterations=1",
        "diagnostics.every_n_iterations=1",
        "diagnostics.num_samples=4",
        "optim.num_minibatches=2",
        "optim.micro_batch_size=4",
        "trainer.threads=1",
        "trainer.iterations=2",
        "logging.save_rollouts=true",
        *extra,
    ]
    cfg = load_config(str(ROOT / "conf" / f"{env}.yaml"), overrides)
    assert cfg.env.name == env
    assert fit(cfg)["iterations"] == 2
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = mlflow.search_runs(experiment_names=["ragen_lit"])
    assert len(runs) == 1 and runs.iloc[0]["params.env.name"] == env
    for key in ("rollout/success", "rollout/reward", "val/success"):
        assert f"metrics.{key}" in runs.columns, key
    rollouts = sorted(next(tmp_path.glob(f"{env}-*")).glob("rollouts/*.jsonl"))
    assert len(rollouts) == 2
    return runs.iloc[0], json.loads(rollouts[0].read_text().splitlines()[0])


@pytest.mark.slow
def test_coding(tmp_path, tiny_model_dir):
    # every program the policy writes goes through the sandbox; bad answers get the format penalty
    row, first = _fit_two_iterations("coding", tmp_path, tiny_model_dir, "rollout.max_new_tokens=64")
    assert -0.2 - 1e-9 <= row["metrics.rollout/reward"] <= 1.0
    assert "def " in first["prompt"] or "function" in first["prompt"].lower()


@pytest.mark.slow
def test_search_qa(tmp_path, tiny_model_dir):
    _, first = _fit_two_iterations("search_qa", tmp_path, tiny_model_dir, "rollout.max_new_tokens=48")
    assert "Question: " in first["prompt"] and "Searches left: 3" in first["prompt"]


def test_webshop(tmp_path, tiny_model_dir):
    _, first = _fit_two_iterations(
        "webshop", tmp_path, tiny_model_dir, "rollout.max_turns=3", "rollout.max_new_tokens=48"
    )
    assert "search[" in first["prompt"]
