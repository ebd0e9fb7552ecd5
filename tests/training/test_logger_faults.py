"""A logger's folder that becomes unwritable in the middle of a run (`run.faults`): `fit` ends with exit code 1 and
one `error:` line naming the logger and the file it could not write (not the tracebacks of TensorBoard's writer
thread and of Lightning's rewording of the error), its MLflow run reads FAILED with that reason, every checkpoint and
everything logged so far is kept, and once the folder is writable again `trainer.resume=last` finishes the run."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.cli import main
from ragen_lit.run.loggers import STOPPED_TAG
from ragen_lit.training.callbacks import IterationLogger

ARGS = ["fit", "--config", CONFIG, *SMALL, "trainer.iterations=3", "trainer.checkpoint_every=1"]


def _run(out: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ragen_lit").experiment_id])
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "rollout/success"))
    return run, steps


@pytest.mark.parametrize(
    ("logger", "folder", "stopped"),
    [
        # TensorBoard keeps its event file open: the write it cannot make is the next file's, the summary's
        ("tensorboard", "tensorboard", "after its last iteration, writing its end-of-run records"),
        ("csv", "csv/version_0", "in iteration 2"),  # CSV writes its metrics.csv at every iteration
    ],
)
def test_a_logger_folder_made_unwritable_mid_run_is_one_line_naming_the_logger_and_the_run_fails_with_it(
    logger, folder, stopped, tmp_path, monkeypatch, capsys, make_unwritable
):
    out = tmp_path / "runs"
    start_iteration = IterationLogger.on_train_epoch_start
    locked: list[Path] = []

    def lock_at_iteration_2(self, trainer, module):
        if trainer.current_epoch == 1 and not locked:
            locked.append(Path(trainer.default_root_dir) / folder)
            for written in locked[0].iterdir():  # what is written there already, and the folder
                written.chmod(0o444)
            make_unwritable(locked[0])
        start_iteration(self, trainer, module)

    monkeypatch.setattr(IterationLogger, "on_train_epoch_start", lock_at_iteration_2)
    args = [*ARGS, f"logging.output_dir={out}", f"logging.loggers=[mlflow,{logger}]"]
    assert main(args) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and "Warning" not in err and errors == [err.strip().splitlines()[-1]], err
    (run_dir,) = out.glob("frozenlake-*")
    last = run_dir / "checkpoints" / "last.ckpt"
    line = errors[0]
    assert line.startswith(f"error: the {logger} logger could not write {run_dir / folder}/")
    assert line.endswith(
        f" (Permission denied); the run stopped {stopped}; its MLflow run is marked FAILED; its newest checkpoint is "
        f"{last}; fix it and continue with trainer.resume=last"
    )
    run, steps = _run(out)
    assert run.info.status == "FAILED"
    assert run.data.tags[STOPPED_TAG] == line.removeprefix("error: ").split("; its MLflow run")[0]
    # nothing lost: the iterations logged and checkpointed before the fault, the logger's own records
    assert steps == list(range(1, 4 if logger == "tensorboard" else 3)) and last.is_file()
    if logger == "tensorboard":
        events = EventAccumulator(str(run_dir / folder))
        events.Reload()
        assert [event.step for event in events.Scalars("rollout/success")] == [1, 2, 3]
    else:  # iteration 1's row (iteration 2's was the write refused)
        with (run_dir / folder / "metrics.csv").open() as file:
            assert [row["step"] for row in csv.DictReader(file) if row["rollout/success"]] == ["1"]

    locked[0].chmod(0o755)
    assert main([*args, "trainer.resume=last"]) == 0
    run, steps = _run(out)
    assert run.info.status == "FINISHED" and STOPPED_TAG not in run.data.tags and steps == [1, 2, 3]
