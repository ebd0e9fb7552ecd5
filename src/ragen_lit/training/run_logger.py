"""`RunLogger`: Lightning's MLflow logger that writes each (key, step) of its run at most once, and marks the run
FINISHED only when `fit` says every end-of-run record is written.

A resumed run starts again from its last checkpoint, so it recomputes and logs again the iterations the killed
process had logged after that checkpoint (and, killed mid-iteration, part of one). MLflow cannot delete a metric
row, so the rule is the other way round: a (key, step) the run already holds is not written again. Resuming is
then idempotent whatever the moment of the kill: no step is missing (everything after the checkpoint is redone)
and none is doubled. The value kept is the first process's; a resume recomputes it bit for bit where the
computation is deterministic (CPU, fixed seeds), which `tests/training/test_resume_kill.py` checks.

Lightning closes the run as FINISHED when training ends, before `fit` writes the summary and run.json's `finished`
record; a fault there would leave a FINISHED run that exits with an error. Here a successful end waits for `close`,
which `fit` calls once those records are written (a failure is closed at once, as Lightning asks); a run that failed
says why in its tag `STOPPED_TAG`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only

from ragen_lit.config import Config
from ragen_lit.run.folder import default_run_name
from ragen_lit.run.store import ensure_experiment, tracking_uri

STOPPED_TAG = "ragen_lit.stopped"
"""the MLflow tag that says why a run stopped before its end: the line of the fault or error on a FAILED run
(`close`), the kill on a KILLED one (`killed_runs`); a resume takes it away (`make_logger`)"""


class RunLogger(MLFlowLogger):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._written: set[tuple[str, int | None]] | None = None  # read from the run at the first write
        self._closing = False
        self._refused: str | None = None  # why the store refused to record how the run ended

    def written(self) -> set[tuple[str, int | None]]:
        """Every (key, step) the run holds: those of earlier processes of this run, then this one's."""
        if self._written is None:
            client, run_id = self.experiment, self.run_id
            self._written = {
                (key, metric.step)
                for key in client.get_run(run_id).data.metrics
                for metric in client.get_metric_history(run_id, key)
            }
        return self._written

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        written = self.written()
        fresh = {key: value for key, value in metrics.items() if (key, step) not in written}
        written.update((key, step) for key in fresh)
        if fresh:
            super().log_metrics(fresh, step)

    def finalize(self, status: str = "success") -> None:
        if status != "success":  # "failed" on an exception, "finished" before a SLURM requeue
            self.close("FAILED" if status == "failed" else "FINISHED")

    def close(self, status: str, why: str | None = None) -> str | None:
        """Mark the run `status` (FINISHED or FAILED), once, and keep `why` it failed as its `STOPPED_TAG` (Lightning
        may have marked it FAILED already); returns None when the store took the status, else why not (the run then
        reads RUNNING in MLflow)."""
        if why is not None:
            try:
                self.experiment.set_tag(self.run_id, STOPPED_TAG, why)
            except Exception:  # a store that refuses this write refuses the status too, which is said below
                pass
        if not self._closing:
            from ragen_lit.run.faults import database_error

            self._closing = True
            try:
                super().finalize(status)
            except Exception as err:  # the store refuses the write that would say how the run ended
                self._refused = database_error(err)
        return self._refused


def make_logger(cfg: Config, run_dir: Path, info: dict):
    """The run's MLflow logger: a new run, or the one run.json (`info`) names; `fit` logs the config to it."""
    if rank_zero_only.rank == 0:
        ensure_experiment(cfg)
    logger = RunLogger(
        experiment_name=cfg.logging.experiment,
        run_name=default_run_name(cfg),
        tracking_uri=tracking_uri(cfg),
        run_id=info.get("mlflow_run_id"),
        tags={str(k): str(v) for k, v in cfg.logging.tags.items()} or None,
    )
    if info.get("mlflow_run_id") and rank_zero_only.rank == 0:
        # a resumed run runs again, whatever its last process left it as (and said why: `STOPPED_TAG`)
        logger.experiment.update_run(logger.run_id, status="RUNNING")
        if STOPPED_TAG in logger.experiment.get_run(logger.run_id).data.tags:
            logger.experiment.delete_tag(logger.run_id, STOPPED_TAG)
    return logger
