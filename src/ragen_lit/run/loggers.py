"""A run's Lightning loggers: `RunLogger`, MLflow's, which holds the run's record (`make_logger` opens it for a run),
and the loggers `logging.loggers` adds beside it (`make_extra_loggers`), each writing inside the run folder, so that
a resumed run goes on where it wrote before; both are made from the opened run (`run.folder.Run`). The callbacks log
every metric to each of them; `fit` gives each the resolved config at the start of every process, and the end-of-run
summary (`log_summary`); `RunFigures` gives those that take pictures the run's figures.

`RunLogger` writes each (key, step) of its run at most once, and marks the run FINISHED only when `fit` says every
end-of-run record is written. A resumed run starts again from its last checkpoint, so it recomputes and logs again the
iterations the killed process had logged after that checkpoint (and, killed mid-iteration, part of one). MLflow cannot
delete a metric row, so the rule is the other way round: a (key, step) the run already holds is not written again.
Resuming is then idempotent whatever the moment of the kill: no step is missing (everything after the checkpoint is
redone) and none is doubled. The value kept is the first process's; a resume recomputes it bit for bit where the
computation is deterministic (CPU, fixed seeds), which `tests/training/test_resume_kill.py` checks.

Lightning closes the run as FINISHED when training ends, before `fit` writes the summary and run.json's `finished`
record; a fault there would leave a FINISHED run that exits with an error. Here a successful end waits for `close`,
which `fit` calls once those records are written (a failure is closed at once, as Lightning asks); a run that failed
says why in its tag `STOPPED_TAG`.

The extra loggers:

- tensorboard, `<run folder>/tensorboard/` (`tensorboard --logdir` it): the metrics as scalars, the config in
  hparams.yaml and, with the end-of-run summary, in the HParams dashboard, the figures as images. A resumed process
  purges what earlier processes wrote from its first step on (TensorBoard's `purge_step`): the iterations a kill left
  logged past the checkpoint are run again and show once.
- csv, `<run folder>/csv/version_<n>/`: metrics.csv (one row per logged group of metrics: its step and a column per
  key) and hparams.yaml (the config); no figures. Each process of a run writes the next version, a resumed one from
  the iteration after its checkpoint: where two versions hold a step, the later one's values are the run's.
- wandb, `<run folder>/wandb/`: project `logging.experiment`, the run's name, and the MLflow run's id as its id, so
  every process of a run logs to one W&B run (`resume="allow"`); offline unless `logging.wandb_mode=online` (`wandb
  sync <folder>` uploads an offline run). The steps are the iterations, W&B's x-axis `trainer/global_step`
  (Lightning's name for it); an iteration run again after a kill is logged again.

TensorBoard and CSV write a metric to disk as it is logged, as MLflow does, so a kill loses none of it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from ragen_lit.errors import error_chain
from ragen_lit.run.folder import Run
from ragen_lit.run.store import ensure_experiment, tracking_uri

TENSORBOARD_FOLDER = "tensorboard"
CSV_FOLDER = "csv"
FOLDERS = {"tensorboard": TENSORBOARD_FOLDER, "csv": CSV_FOLDER, "wandb": "wandb"}
"""each extra logger's folder in the run folder (W&B's is its own name under the `save_dir` it is given)"""


STOPPED_TAG = "ragen_lit.stopped"
"""the MLflow tag that says why a run stopped before its end: the line of the fault or error on a FAILED run
(`close`), the kill on a KILLED one (`run.killed_runs`); a resume takes it away (`make_logger`)"""


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


def make_logger(run: Run) -> RunLogger:
    """The run's MLflow logger: a new MLflow run, or the one its run.json names; `fit` logs the config to it."""
    if rank_zero_only.rank == 0:
        ensure_experiment(run.logging)
    logger = RunLogger(
        experiment_name=run.logging.experiment,
        run_name=run.name,
        tracking_uri=tracking_uri(run.logging),
        run_id=run.record.get("mlflow_run_id"),
        tags={str(k): str(v) for k, v in run.logging.tags.items()} or None,
    )
    if run.record.get("mlflow_run_id") and rank_zero_only.rank == 0:
        # a resumed run runs again, whatever its last process left it as (and said why: `STOPPED_TAG`)
        logger.experiment.update_run(logger.run_id, status="RUNNING")
        if STOPPED_TAG in logger.experiment.get_run(logger.run_id).data.tags:
            logger.experiment.delete_tag(logger.run_id, STOPPED_TAG)
    return logger


class RunTensorBoardLogger(TensorBoardLogger):
    """TensorBoard in `<run_dir>/tensorboard`, one folder for every process of the run, flushed at every call.
    `resumed`: the first step this process logs purges the events earlier processes wrote at it and after."""

    def __init__(self, run_dir: Path, resumed: bool):
        super().__init__(run_dir, name="", version=TENSORBOARD_FOLDER, default_hp_metric=False)
        self._purge_from_first_step = resumed
        _quiet_writer_threads()

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self._purge_from_first_step and step is not None:
            self._purge_from_first_step = False
            # the writer Lightning opened at setup holds no metric yet; the one that replaces it (Lightning's logger
            # makes it with these keyword arguments) starts its file with the purge
            self.experiment.close()
            self._experiment = None
            self._kwargs["purge_step"] = step
        super().log_metrics(metrics, step)
        self.experiment.flush()


def _quiet_writer_threads() -> None:
    """TensorBoard writes its events from a thread of its own: a write the machine refuses there is printed as that
    thread's traceback, and raised again in the thread that logs or flushes next (`_AsyncWriter._check_worker_status`),
    where `fit` reports it in one line (`run.faults`). That thread's own print is dropped; any other thread's error
    is printed as before. Once per process."""
    try:
        from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
    except ImportError:  # tensorboardX writes instead of tensorboard, from a thread of its own
        return

    printed = threading.excepthook
    if getattr(printed, "quiet_writer_threads", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.thread, _AsyncWriterThread):
            printed(args)

    hook.quiet_writer_threads = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def folders_in(run_dir: Path) -> dict[str, Path]:
    """Each extra logger's folder in `run_dir`, by its `logging.loggers` name (`run.faults` names a logger by it)."""
    return {name: run_dir / folder for name, folder in FOLDERS.items()}


def _wandb_logger(run: Run, run_id: str | None, verbose: bool) -> WandbLogger:
    logger = WandbLogger(
        name=run.name,
        save_dir=str(run.folder),
        id=run_id,
        project=run.logging.experiment,
        mode=run.logging.wandb_mode,  # wandb.init's `mode` wins over WANDB_MODE
        settings={"silent": not verbose},  # its banner, sparklines and sync advice; `fit` says where the run is
    )
    # Lightning passes wandb.init `anonymous=None`, which wandb answers with a warning that it has no effect
    logger._wandb_init.pop("anonymous", None)
    return logger


def make_extra_loggers(run: Run, run_id: str | None, verbose: bool = False) -> list[Logger]:
    """The loggers `logging.loggers` names besides mlflow, in its order, in the run's folder (a resumed run's go on
    from its checkpoint). `run_id`: the MLflow run's (W&B's id); `verbose`: W&B prints its own console lines."""
    made: list[Logger] = []
    for name in run.logging.loggers:
        if name == "tensorboard":
            made.append(RunTensorBoardLogger(run.folder, resumed=run.resume_from is not None))
        elif name == "csv":
            made.append(CSVLogger(run.folder, name=CSV_FOLDER, flush_logs_every_n_steps=1))
        elif name == "wandb":
            made.append(_wandb_logger(run, run_id, verbose))
    return made


def log_summary(loggers: Sequence[Logger], summary: Mapping[str, float], config: Mapping[str, Any], step: int) -> None:
    """The end-of-run summary as `summary/*` metrics at `step` to every logger; TensorBoard takes them with the
    flat `config` as hyperparameters, so its HParams dashboard shows each run's config beside its results."""
    metrics = {f"summary/{key}": value for key, value in summary.items()}
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(dict(config), metrics=metrics, step=step)
        else:
            logger.log_metrics(metrics, step=step)


def close_extra_loggers(loggers: Sequence[Logger], succeeded: bool, stopped_by: BaseException | None = None) -> None:
    """Write out and close the extra loggers' files (Lightning closed them after training; the summary opened
    TensorBoard's again) and finish the W&B run, marked failed unless `succeeded`. After a failure a logger that
    cannot close only warns, and not at all when it fails on a file the error that stopped the run (`stopped_by`)
    could not write: that error is the one to report, and `fit` reports it."""
    stopped_on = {inner.filename for inner in error_chain(stopped_by) if isinstance(inner, OSError)} - {None}
    for logger in loggers:
        try:
            logger.finalize("success" if succeeded else "failed")
            if isinstance(logger, WandbLogger):
                import wandb

                wandb.finish(exit_code=0 if succeeded else 1)
        except Exception as err:
            if succeeded:
                raise
            if not any(isinstance(inner, OSError) and inner.filename in stopped_on for inner in error_chain(err)):
                rank_zero_warn(f"{type(logger).__name__} not closed: {type(err).__name__}: {err}")


def logger_folder(logger: Logger) -> Path | None:
    """The folder an extra logger writes this process's records to (rank zero); None for MLflow's."""
    if isinstance(logger, (TensorBoardLogger, CSVLogger)):
        return Path(logger.log_dir)
    if isinstance(logger, WandbLogger):
        return Path(logger.experiment.settings.sync_dir)
    return None


def where_logged(loggers: Sequence[Logger]) -> list[str]:
    """One line per extra logger for the end of `fit`: where its records are and how to look at them."""
    lines = []
    for logger in loggers:
        folder = logger_folder(logger)
        if isinstance(logger, TensorBoardLogger):
            lines.append(f"TensorBoard: tensorboard --logdir {folder}")
        elif isinstance(logger, CSVLogger):
            lines.append(f"CSV: {folder / 'metrics.csv'} (config: {folder / 'hparams.yaml'})")
        elif isinstance(logger, WandbLogger) and logger.experiment.offline:
            lines.append(f"W&B (offline): {folder} (upload it with: wandb sync {folder})")
        elif isinstance(logger, WandbLogger):
            lines.append(f"W&B: {logger.experiment.url} (local copy: {folder})")
    return lines
