"""A run whose `fit` was killed says so in MLflow once a later `fit` of its name finds it.

A `fit` killed from outside (SIGKILL, the out-of-memory killer, a lost machine) cannot close its MLflow run, which then
reads RUNNING for good: the MLflow UI and `compare` would take it for a run still training. Before it resolves its own
run folder, `fit` looks at the runs of its name in its output folder: a run whose folder no process holds
(`run.lock`), whose run.json has no `finished` record and whose MLflow run, in the store this `fit` logs to, reads
RUNNING was killed. It is marked KILLED (MLflow's status for a run stopped from outside) with the tag
`run.loggers.STOPPED_TAG` saying when it was found and which checkpoint, if any, it left; its folder is left as it is,
and `trainer.resume=last` continues it if it has a checkpoint (a resume marks it RUNNING again). A store that cannot
be read or written here is left alone: `fit` checks its own store next and reports it in one line. A run is matched by
its store (run.json names the store itself, never the `logging.tracking_server` it wrote through), and marked through
the server this `fit` writes through, if it has one (a sweep's server is its store's one writer).
"""

from __future__ import annotations

import glob
import json
import sqlite3
import time
from pathlib import Path

from ragen_lit.config import LoggingConfig
from ragen_lit.errors import ConfigError
from ragen_lit.run.checkpoints import newest_checkpoint
from ragen_lit.run.folder import run_folder_pattern
from ragen_lit.run.lock import in_use
from ragen_lit.run.loggers import STOPPED_TAG
from ragen_lit.run.store import check_server, check_sqlite_store, sqlite_store, store_uri, tracking_uri


def mark_killed(logging: LoggingConfig, name: str) -> None:
    """Mark KILLED the killed runs named `name` in `logging.output_dir` (module docstring)."""
    root = Path(logging.output_dir).resolve()
    pattern = run_folder_pattern(name)
    unfinished = []
    for folder in sorted(root.glob(f"{glob.escape(name)}-*")):
        if not pattern.fullmatch(folder.name) or in_use(folder):
            continue
        try:
            info = json.loads((folder / "run.json").read_text())
        except (OSError, ValueError):  # a run stopped before its record was written has no MLflow run either
            continue
        if "finished" not in info and info.get("mlflow_run_id"):
            unfinished.append((folder, info))
    store = store_uri(logging) if unfinished else None
    unfinished = [(folder, info) for folder, info in unfinished if info.get("tracking_uri") == store]
    sqlite = sqlite_store(logging)
    if not unfinished or (sqlite is not None and not sqlite[0].is_file()):  # MLflow would make a store that is gone
        return
    try:
        if sqlite is not None:
            check_sqlite_store(*sqlite)  # MLflow's engine would retry an unreadable file for minutes
        if logging.tracking_server:  # and MLflow's client an absent server
            check_server(logging.tracking_server, f"logging.tracking_server={logging.tracking_server!r}")
    except ConfigError:
        return
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from sqlalchemy.exc import SQLAlchemyError

    client = MlflowClient(tracking_uri=tracking_uri(logging))
    found = f"found by a later fit at {time.strftime('%Y-%m-%d %H:%M:%S')}"
    for folder, info in unfinished:
        run_id = info["mlflow_run_id"]
        try:
            if client.get_run(run_id).info.status != "RUNNING":
                continue
            checkpoint = newest_checkpoint(folder)
            left = f"its newest checkpoint is {checkpoint}" if checkpoint else "before its first checkpoint"
            client.set_tag(run_id, STOPPED_TAG, f"killed: its process ended without closing the run, {left} ({found})")
            client.set_terminated(run_id, status="KILLED")
        except (MlflowException, SQLAlchemyError, sqlite3.Error, OSError):
            return
