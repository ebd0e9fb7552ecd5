"""A checkpoint that cannot be written stops the run at once: the checkpoint folder refuses
writes from iteration 2 on; `fit` ends with exit code 1 and one line naming the file and the OS error, no traceback,
the MLflow run is FAILED with iterations 1 and 2 logged, and iteration 1's checkpoints are intact."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import torch

from ragen_lit.cli import main
from ragen_lit.training.callbacks import IterationLogger

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_an_unwritable_checkpoint_folder_stops_the_run_and_keeps_the_logs(
    tmp_path, tiny_model_dir, monkeypatch, capsys, make_unwritable
):
    start_iteration = IterationLogger.on_train_epoch_start
    locked: list[Path] = []

    def lock_after_the_first_iteration(self, trainer, module):
        if trainer.current_epoch == 1:
            locked.append(Path(trainer.checkpoint_callback.dirpath))
            make_unwritable(locked[0])
        start_iteration(self, trainer, module)

    monkeypatch.setattr(IterationLogger, "on_train_epoch_start", lock_after_the_first_iteration)
    code = main(
        [
            "fit",
            "--config",
            str(ROOT / "conf" / "frozenlake.yaml"),
            f"model.path={tiny_model_dir}",
            f"logging.output_dir={tmp_path}",
            "rollout.groups=2",
            "rollout.group_size=4",
            "rollout.max_turns=1",
            "rollout.max_new_tokens=48",
            "validation.num_envs=4",
            "diagnostics.num_samples=8",
            "optim.num_minibatches=2",
            "optim.micro_batch_size=4",
            "trainer.threads=1",
            "trainer.iterations=3",
            "trainer.checkpoint_every=1",
        ]
    )
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1, err
    assert "Traceback" not in err
    (checkpoints,) = locked
    assert len(errors) == 1 and errors[0] == err.strip().splitlines()[-1], err
    assert f"checkpoint {checkpoints / 'iter-0002.ckpt'} could not be written (Permission denied)" in errors[0]
    assert "the run stopped in iteration 2; its MLflow run is marked FAILED" in errors[0]
    newest = checkpoints / "last.ckpt"
    assert f"its newest checkpoint is {newest}; fix it and continue with trainer.resume=last" in errors[0]

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    (run,) = mlflow.search_runs(experiment_names=["ragen_lit"]).itertuples()
    assert run.status == "FAILED"
    history = mlflow.tracking.MlflowClient().get_metric_history(run.run_id, "rollout/success")
    assert sorted(m.step for m in history) == [1, 2]  # iteration 2 was logged before its save failed; 3 never ran

    assert sorted(p.name for p in checkpoints.iterdir()) == ["iter-0001.ckpt", "last.ckpt"]
    assert torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)["epoch"] == 0
