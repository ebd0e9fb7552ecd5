"""A fault of the machine during a run, told in one line that claims nothing it has not seen written.

A folder made read-only, a full disk or an MLflow store that refuses writes stop a run with exit code 1 (the checkpoint
writer raises `RunError` at once, see `run.checkpoint_writer`; the other writes raise `OSError` or MLflow's and the
database's errors; a logger's refused write is named with its logger). The MLflow run keeps what happened in its tag
`run.loggers.STOPPED_TAG`. The line names what could not be written and why, where the run stopped, the checkpoint
`trainer.resume=last` would take (the newest complete one on disk, or none), and the status the MLflow run holds now:
FAILED, or, where the store itself refuses the write that says so, that it could not be marked (it then still reads
RUNNING). MLflow's FINISHED is set only after every end-of-run record is written (`RunLogger.close`), so a run that
stops with exit code 1 is never recorded as finished.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ragen_lit.errors import RunError, error_chain
from ragen_lit.run.checkpoints import newest_checkpoint


def machine_fault(err: BaseException, store: str, logger_folders: dict[str, Path]) -> str | None:
    """What could not be written and why, for a fault of the file system or of the MLflow store (`store`: its URI);
    None for any other error (a bug or a user mistake keeps its own report). A write refused in a logger's folder
    (`logger_folders`: each folder by its logger's name) names the logger, from wherever in the chain of errors it
    was raised (Lightning's TensorBoard logger rewords it as a value it cannot log)."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(err, RunError):
        return str(err)
    for inner in error_chain(err):
        if isinstance(inner, OSError) and inner.filename is not None:
            path = Path(os.fsdecode(inner.filename)).resolve()
            for name, folder in logger_folders.items():
                if path.is_relative_to(folder.resolve()):
                    return f"the {name} logger could not write {path} ({inner.strerror or inner})"
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.filename}: {err.strerror or err}"
    if isinstance(err, (MlflowException, SQLAlchemyError, sqlite3.Error)):
        return f"the MLflow store {store} could not be written ({database_error(err)})"
    return None


def database_error(err: BaseException) -> str:
    """The first line of the innermost error behind `err` (MLflow wraps the database's own, e.g. sqlite3's
    "attempt to write a readonly database", in lines of SQL and advice)."""
    innermost = error_chain(err)[-1]
    text = str(innermost).strip()
    return text.splitlines()[0] if text else type(innermost).__name__


def stopped_message(fault: str, run_dir: Path, where: str, mlflow_status: str) -> str:
    """The one line of a run stopped by `fault`: `where` it stopped ("in iteration 3"), `mlflow_status` what the
    MLflow run says (`mlflow_status`)."""
    newest = newest_checkpoint(run_dir)
    if newest is None:
        resume = "no checkpoint was written; fix it and run the same command again"
    else:
        resume = f"its newest checkpoint is {newest}; fix it and continue with trainer.resume=last"
    return f"{fault}; the run stopped {where}; {mlflow_status}; {resume}"


def mlflow_status(status: str, refused: str | None) -> str:
    """What the MLflow run says after `RunLogger.close(status)` returned `refused`."""
    if refused is None:
        return f"its MLflow run is marked {status}"
    return f"its MLflow run could not be marked {status} ({refused}) and reads RUNNING"


def where_stopped(trainer) -> str:
    """Where a run's `trainer` (None: not made yet) stopped, in the words of `stopped_message`."""
    from lightning.pytorch.trainer.states import TrainerStatus

    if trainer is None:
        return "before its first iteration"
    if trainer.state.status == TrainerStatus.FINISHED:
        return "after its last iteration, writing its end-of-run records"
    return f"in iteration {trainer.current_epoch + 1}"
