"""The output folder or the run folder made read-only in the middle of a run: `fit` ends with exit code 1 and one
`error:` line (no traceback) that says what could not be written, where the run stopped, what MLflow holds for the
run (FAILED, or, where the store itself refuses writes, that it could not be marked and reads RUNNING) and the
checkpoint to continue from; MLflow says exactly that, and once the folder is writable again the same command with
`trainer.resume=last` finishes the run."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.cli import main
from ragen_lit.training.callbacks import IterationLogger

ARGS = ["fit", "--config", CONFIG, *SMALL, "trainer.iterations=3", "trainer.checkpoint_every=1"]


def _status(out: Path) -> str:
    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlruns.db'}")
    (status,) = mlflow.search_runs(experiment_names=["ragen_lit"])["status"]
    return status


def _one_error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and len(errors) == 1 and errors[0] == err.strip().splitlines()[-1], err
    return errors[0]


@pytest.mark.parametrize("folder", ["output", "run"])
def test_a_folder_made_read_only_mid_run_ends_in_one_line_that_mlflow_agrees_with(
    folder, tmp_path, monkeypatch, capsys, make_unwritable
):
    out = tmp_path / "runs"
    start_iteration = IterationLogger.on_train_epoch_start
    locked: list[Path] = []

    def lock_at_iteration_2(self, trainer, module):
        if trainer.current_epoch == 1 and not locked:
            locked.append(out if folder == "output" else Path(trainer.default_root_dir))
            make_unwritable(locked[0])
        start_iteration(self, trainer, module)

    monkeypatch.setattr(IterationLogger, "on_train_epoch_start", lock_at_iteration_2)
    code = main([*ARGS, f"logging.output_dir={out}"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 1
    (run,) = out.glob("frozenlake-*")
    newest = (
        f"its newest checkpoint is {run / 'checkpoints' / 'last.ckpt'}; fix it and continue with trainer.resume=last"
    )
    if folder == "output":  # the store's folder: sqlite cannot make its journal, so no write reaches the store
        store = f"sqlite:///{out / 'mlruns.db'}"
        assert line.startswith(f"error: the MLflow store {store} could not be written (attempt to write a readonly")
        assert "; the run stopped in iteration 2; its MLflow run could not be marked FAILED (" in line
        assert line.endswith(f") and reads RUNNING; {newest}")
        expected = "RUNNING"
    else:  # every iteration and checkpoint is written; run.json's `finished` record is not
        assert line == (
            f"error: {run / 'run.json.partial'}: Permission denied; the run stopped after its last iteration, writing "
            f"its end-of-run records; its MLflow run is marked FAILED; {newest}"
        )
        assert "finished" not in json.loads((run / "run.json").read_text())
        expected = "FAILED"
    locked[0].chmod(0o755)
    assert _status(out) == expected

    assert main([*ARGS, f"logging.output_dir={out}", "trainer.resume=last"]) == 0
    assert _status(out) == "FINISHED"
    assert json.loads((run / "run.json").read_text())["finished"]["iteration"] == 3
