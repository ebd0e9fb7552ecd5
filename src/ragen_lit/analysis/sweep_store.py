"""A sweep's MLflow store: the sweep's runs in one sqlite file, `<sweep>/mlruns.db`, side by side in one experiment.

The runs that run while `sweep` waits for them (its own pool, `joblib`, `submitit_local`) write this store through
the MLflow server the sweep starts for them (`sweep_server`): sqlite takes one writer at a time, and a tracking
server, the one process that writes the database, is MLflow's answer to many runs logging to one place. A run's
`config.yaml` names the store itself (`logging.tracking_uri`), and the server's address is given to each attempt on
its command line (`logging.tracking_server`), so that the config, the run's `run.json` and everything that reads them
once the sweep has ended (`compare`, `evaluate`, a resume under a new server) name the file, never a dead address.
Each run's params are its resolved config (the grid's factors among them) and its tags `sweep`, `point` and `seed`;
the artifacts go to `<sweep>/artifacts`, written by the runs themselves.

Runs that go to other machines (`--print-commands`, `submitit_slurm`) cannot reach that server, and several nodes
writing one sqlite file on a shared file system is not safe (its locks do not hold there): a new run of theirs keeps
its own store in its folder, as every sweep's runs did before they shared one. A run that has begun keeps the store
it began in (its own, or the sweep's), so a sweep folder of either kind resumes as it was started.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from ragen_lit.analysis.runs import ROLE_TAG
from ragen_lit.errors import RunError
from ragen_lit.run.store import STORE_NAME, check_sqlite_store, sqlite_uri

ARTIFACTS = "artifacts"
SEARCH_PAGE = 1000
"""runs per page of MLflow's search"""


def store_path(sweep: Path) -> Path:
    return sweep / STORE_NAME


def store_uri(sweep: Path) -> str:
    return sqlite_uri(store_path(sweep))


def run_store(folder: Path, began: bool, shared: bool) -> str | None:
    """The `logging.tracking_uri` of the run in `folder` (`<sweep>/<point>-seed<k>`): the sweep's store, or None for
    the run's own store in its folder. `began`: the run has a checkpoint to resume from; `shared`: the sweep's runs
    write through its server."""
    if began:
        return None if (folder / STORE_NAME).exists() else store_uri(folder.parent)
    return store_uri(folder.parent) if shared else None


def check_store(sweep: Path) -> None:
    """The sweep's store can be written and, where it exists, reads as a database: one line naming the file, before
    a server starts on it (the server would retry a broken file for minutes)."""
    path = store_path(sweep)
    check_sqlite_store(path, f"the sweep's MLflow store {path}")


def prepare_store(server: str, sweep: Path, experiments: Iterable[str], fresh: Iterable[tuple[str, str]]) -> None:
    """Through the sweep's `server`, before any run starts: create each experiment of `experiments` that is missing,
    its artifacts in `<sweep>/artifacts` (no two runs then race to create one), and delete the MLflow runs of earlier
    attempts at the runs that start afresh (`fresh`: their (point, seed) tags; such an attempt ended before its first
    checkpoint), as such a start in a folder of its own deletes the run's store: each run of the sweep is one MLflow
    run. Deleted runs stay in the file until `mlflow gc` removes them; MLflow's UI and searches leave them out."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server)
    try:
        ids = []
        for name in sorted(set(experiments)):
            experiment = client.get_experiment_by_name(name)
            location = (sweep / ARTIFACTS).as_uri()
            ids.append(experiment.experiment_id if experiment else client.create_experiment(name, location))
        restarted = set(fresh)
        for run in _all_runs(client, ids) if restarted else ():
            tags = run.data.tags
            if ROLE_TAG not in tags and (tags.get("point"), tags.get("seed")) in restarted:
                client.delete_run(run.info.run_id)
    except MlflowException as err:
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise RunError(f"the sweep's MLflow store {store_path(sweep)} refused the sweep: {first_line}") from None


def _all_runs(client, experiment_ids: list[str]) -> Iterator:
    """Every active run of the experiments, page by page."""
    token = None
    while True:
        page = client.search_runs(experiment_ids, max_results=SEARCH_PAGE, page_token=token)
        yield from page
        token = page.token
        if not token:
            return
