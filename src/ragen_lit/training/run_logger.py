"""`RunLogger`: Lightning's MLflow logger that writes each (key, step) of its run at most once.

A resumed run starts again from its last checkpoint, so it recomputes and logs again the iterations the killed
process had logged after that checkpoint (and, killed mid-iteration, part of one). MLflow cannot delete a metric
row, so the rule is the other way round: a (key, step) the run already holds is not written again. Resuming is
then idempotent whatever the moment of the kill: no step is missing (everything after the checkpoint is redone)
and none is doubled. The value kept is the first process's; a resume recomputes it bit for bit where the
computation is deterministic (CPU, fixed seeds), which `tests/training/test_resume_kill.py` checks.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only


class RunLogger(MLFlowLogger):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._written: set[tuple[str, int | None]] | None = None  # read from the run at the first write

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
