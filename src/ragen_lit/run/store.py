"""A run's MLflow store: where it is, the checks before a run starts, and opening it with the run's experiment.

The store is `logging.tracking_uri`, or the sqlite file `STORE_NAME` in `logging.output_dir` (`store_uri`: what a
run's record names); a process writes it through `logging.tracking_server` where one is given (`tracking_uri`). The
default store keeps its artifacts under `logging.output_dir` too (`artifact_location`).

Before a run starts, the output folder can be written, the MLflow store opens and the server in front of it answers
(`open_store`). Checked ahead of any model load, run folder or MLflow run, so a bad folder or a broken store ends with
one line naming the path and the fault, and nothing is written. The sqlite file is read with the `sqlite3` module
first: handed a file that is not a database, MLflow's engine retries with back-off for about two minutes before it
fails; a `logging.tracking_server` is asked its `/health` once, for the same reason (MLflow's client retries an
absent server for minutes).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path

from ragen_lit.config import ConfigError, LoggingConfig

STORE_NAME = "mlruns.db"
"""The default MLflow store: an sqlite file in `logging.output_dir`."""
_SQLITE_PREFIX = "sqlite:///"
SERVER_TIMEOUT_S = 10
"""how long a tracking server may take to answer its health check"""


def sqlite_uri(path: Path) -> str:
    """The tracking URI of the sqlite store in the file `path` (made absolute)."""
    return f"{_SQLITE_PREFIX}{path.resolve()}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of an sqlite store's `uri`; None for any other kind of store (a tracking server)."""
    path = uri[len(_SQLITE_PREFIX) :].split("?")[0] if uri.startswith(_SQLITE_PREFIX) else ""
    return Path(path) if path else None


def default_store(logging: LoggingConfig) -> Path:
    """The sqlite file a run without `logging.tracking_uri` writes: `STORE_NAME` in `logging.output_dir`."""
    return Path(logging.output_dir).resolve() / STORE_NAME


def store_uri(logging: LoggingConfig) -> str:
    """The store that holds the run: `logging.tracking_uri`, or the sqlite file in `logging.output_dir` (its folder
    made)."""
    if logging.tracking_uri:
        return logging.tracking_uri
    store = default_store(logging)
    store.parent.mkdir(parents=True, exist_ok=True)
    return sqlite_uri(store)


def tracking_uri(logging: LoggingConfig) -> str:
    """Where this process writes the run: `logging.tracking_server` in front of the store, else the store."""
    return logging.tracking_server or store_uri(logging)


def artifact_location(logging: LoggingConfig) -> str | None:
    """Where the experiment keeps its artifacts: `<output_dir>/artifacts` for the default sqlite store, so a
    run writes nothing outside `logging.output_dir` (MLflow's default is `./mlruns` of the current directory);
    None, i.e. MLflow's own default, under a user-given tracking URI."""
    if logging.tracking_uri:
        return None
    return (Path(logging.output_dir).resolve() / "artifacts").as_uri()


def ensure_experiment(logging: LoggingConfig) -> None:
    """Create the experiment with `artifact_location` unless it exists (an existing one keeps its location:
    MLflow cannot move it). Rank zero only: the other ranks start after it and must not race it."""
    location = artifact_location(logging)
    if location is None:
        return
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(logging))
    if client.get_experiment_by_name(logging.experiment) is not None:
        return
    try:
        client.create_experiment(logging.experiment, artifact_location=location)
    except MlflowException:
        # another run on the same store created it in between; any other failure still surfaces
        if client.get_experiment_by_name(logging.experiment) is None:
            raise


def check_folder(folder: Path, key: str) -> None:
    """`folder` is a folder, or can be made, and a file can be created in it; the probe file leaves no trace."""
    existing = folder
    while not existing.exists():  # also False for a path under a regular file: that file is the first to exist
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key}: {existing} is a file, not a folder, so {folder} cannot be made")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        raise ConfigError(f"{key}: cannot write in {existing} ({err.strerror})") from None


def check_sqlite_store(path: Path, key: str) -> None:
    """The store's folder can be written, and `path`, if it exists, is an sqlite database this process may write."""
    check_folder(path.parent, key)
    if path.is_dir():
        raise ConfigError(f"{key}: the MLflow store {path} is a folder, not an sqlite file; move it away")
    if not path.exists():
        return
    if not os.access(path, os.W_OK):
        raise ConfigError(f"{key}: the MLflow store {path} is read-only")
    # opened for writing (never created): a run killed mid-write leaves a hot journal, which sqlite rolls back
    # on this first read as MLflow would; a read-only connection cannot, and would call the store unreadable
    check_sqlite_database(path, key, "rw")


def check_sqlite_database(path: Path, key: str, mode: str = "ro") -> None:
    """`path` opens as an sqlite database (`mode`: ro, or rw to roll back a hot journal as MLflow would) and reads;
    MLflow's own engine would retry an unreadable file for minutes before it fails with a traceback."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode={mode}", uri=True, timeout=5)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as err:
        raise ConfigError(
            f"{key}: the MLflow store {path} is not a readable sqlite database ({err}); move it away"
        ) from None


def sqlite_store(logging: LoggingConfig) -> tuple[Path, str] | None:
    """(file, the key that names it) of an sqlite tracking store; None for any other kind of store."""
    if logging.tracking_uri is None:
        return default_store(logging), f"logging.output_dir={logging.output_dir!r}"
    path = sqlite_path(logging.tracking_uri)
    return (path, f"logging.tracking_uri={logging.tracking_uri!r}") if path else None


def check_server(url: str, key: str) -> None:
    """The MLflow server at `url` answers its health check (`key`: the setting that names it, for the error)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=SERVER_TIMEOUT_S):
            return
    except OSError as err:  # no server there, a refused connection, an HTTP error status, a timeout
        reason = getattr(err, "reason", None) or err
    raise ConfigError(
        f"{key}: the MLflow server does not answer ({reason}); start it, or give logging.tracking_server=null to write "
        "to logging.tracking_uri's store directly"
    )


def open_store(logging: LoggingConfig) -> None:
    """Check the output folder, the sqlite store and the server in front of it, then open the store and create the
    experiment in it."""
    check_folder(Path(logging.output_dir).resolve(), f"logging.output_dir={logging.output_dir!r}")
    store = sqlite_store(logging)
    if store is not None:
        check_sqlite_store(*store)
    if logging.tracking_server:
        check_server(logging.tracking_server, f"logging.tracking_server={logging.tracking_server!r}")
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        ensure_experiment(logging)
    except (MlflowException, SQLAlchemyError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"MLflow store {tracking_uri(logging)} cannot be opened: {first_line}") from None
