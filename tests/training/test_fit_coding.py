"""`fit` on the coding env (conf/coding.yaml) for two iterations with the tiny model: every program the
policy writes goes through the sandbox, bad answers get the format penalty, and training goes on."""

from pathlib import Path

import mlflow

from ragen_lit.cli import fit
from ragen_lit.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_fit_runs_two_iterations_on_coding(tmp_path, tiny_model_dir):
    cfg = load_config(
        str(ROOT / "conf" / "coding.yaml"),
        [
            f"model.path={tiny_model_dir}",
            f"logging.output_dir={tmp_path}",
            "rollout.groups=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=64",
            "validation.num_envs=2",
            "validation.every_n_iterations=1",
            "diagnostics.every_n_iterations=0",
            "optim.num_minibatches=2",
            "optim.micro_batch_size=4",
            "trainer.threads=1",
            "trainer.iterations=2",
        ],
    )
    assert fit(cfg)["iterations"] == 2
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    row = mlflow.search_runs(experiment_names=["ragen_lit"]).iloc[0]
    assert row["params.env.name"] == "coding"
    assert -0.2 - 1e-9 <= row["metrics.rollout/reward"] <= 1.0
