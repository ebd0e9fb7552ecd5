"""`fit` on the webshop recipe (conf/webshop.yaml) with the tiny model: two iterations train, log the
rollout metrics and validate (the tiny model was not built on WebShop pages, so rewards are whatever
it stumbles into; this checks the wiring, not learning)."""

from pathlib import Path

import mlflow

from ragen_lit.cli import fit
from ragen_lit.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_fit_runs_two_iterations_on_webshop(tmp_path, tiny_model_dir):
    cfg = load_config(
        str(ROOT / "conf" / "webshop.yaml"),
        [
            f"model.path={tiny_model_dir}",
            f"logging.output_dir={tmp_path}",
            "rollout.groups=2",
            "rollout.group_size=4",
            "rollout.max_turns=3",
            "rollout.max_new_tokens=48",
            "validation.num_envs=2",
            "validation.every_n_iterations=1",
            "diagnostics.every_n_iterations=1",
            "diagnostics.num_samples=8",
            "optim.num_minibatches=2",
            "optim.micro_batch_size=4",
            "trainer.threads=1",
            "trainer.iterations=2",
        ],
    )
    assert cfg.env.name == "webshop"
    summary = fit(cfg)
    assert summary["iterations"] == 2
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = mlflow.search_runs(experiment_names=["ragen_lit"])
    assert len(runs) == 1 and runs.iloc[0]["params.env.name"] == "webshop"
    for key in ("rollout/success", "rollout/reward", "val/success"):
        assert f"metrics.{key}" in runs.columns, key
    assert next(tmp_path.glob("webshop-grpo-*")).is_dir()
