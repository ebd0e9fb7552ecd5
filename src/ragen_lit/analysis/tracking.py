"""Record a comparison in MLflow: a run named `compare` holding the table and the figures as artifacts.

It goes to its own experiment whose artifacts live next to the store's database (`<store folder>/artifacts`),
not in an `mlruns/` folder of whatever directory `compare` was started from; its role tag keeps later
comparisons from reading it as a training run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ragen_lit.analysis.runs import COMPARE_ROLE, ROLE_TAG, store_folder

COMPARE_EXPERIMENT = "compare"


def log_comparison(uri: str, files: Sequence[Path], tags: dict[str, str]) -> str:
    """Create the `compare` run in the store at `uri`, attach `files`, and return its run id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(COMPARE_EXPERIMENT)
    if experiment is None:
        folder = store_folder(uri)
        location = (folder / "artifacts").as_uri() if folder else None  # a server keeps its own default
        experiment_id = client.create_experiment(COMPARE_EXPERIMENT, artifact_location=location)
    else:
        experiment_id = experiment.experiment_id
    run = client.create_run(experiment_id, run_name="compare", tags={ROLE_TAG: COMPARE_ROLE, **tags})
    try:
        for path in files:
            client.log_artifact(run.info.run_id, str(path))
    except BaseException:
        client.set_terminated(run.info.run_id, status="FAILED")
        raise
    client.set_terminated(run.info.run_id)
    return run.info.run_id
