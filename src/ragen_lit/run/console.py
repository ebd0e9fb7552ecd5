"""What a `fit` prints about its run, and what it keeps off the console: the one line saying what runs
(`describe_run`), where it computes (`run_device`, also its MLflow tag). Third-party chatter that says nothing about
this run is dropped at its source, each by its own logger and exact wording (no blanket warning filter), unless `fit
--verbose` asks for everything (`quiet_third_party`, which `warm-start` and `evaluate` call too). The progress bar is
`training.callbacks.IterationProgressBar`, the end-of-run summary `run.folder.format_summary`."""

from __future__ import annotations

import logging
import re
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragen_lit.config import Config

# Lightning's rank-zero INFO lines: the device inventory, advertisements for its cloud services, the note that the
# last iteration ran (the summary says so), and its advice on float32 matrix products on tensor cores (set on purpose
# by `trainer.matmul_precision`, whose "highest" asks for exactly what the advice would change).
_LIGHTNING_CHATTER = re.compile(
    r"^(💡 Tip:|GPU available:|TPU available:|HPU available:|`Trainer.fit` stopped:|You are using a CUDA device)"
)
_LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
# MLflow's store set-up ("Creating initial MLflow database tables...") and the schema migrations it runs.
_MLFLOW_INFO_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")
# MLflow's database layer logs each error it then raises, with a traceback; `fit` reports that error in one line
_MLFLOW_ERROR_ECHO = "mlflow.store.db.utils"
# Warnings that concern Lightning's own internals or a deliberate choice of ours:
WARNINGS = (
    # Lightning's pytree helper on torch >= 2.10 (a deprecation inside Lightning, nothing the user can change)
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # transformers returns models in eval mode and the policy is trained so: RL wants no dropout noise between
    # the rollout's and the update's log-probs (as in veRL), and the LMs used here have none to begin with
    r"Found \d+ module\(s\) in eval mode at the start of training",
    # the rollout loader's batches are made in this process, one RL iteration at a time (`RolloutDataModule`):
    # loader workers would have nothing to do, yet Lightning advises them on any machine of more than two cores
    r"The '\w+' does not have many workers which may be a bottleneck",
)


class _DropMatching(logging.Filter):
    def __init__(self, pattern: re.Pattern):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


def quiet_third_party(verbose: bool = False) -> None:
    """Drop the chatter above (idempotent). `verbose` keeps everything."""
    if verbose:
        return
    for name in _LIGHTNING_LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropMatching) for f in log.filters):
            log.addFilter(_DropMatching(_LIGHTNING_CHATTER))
    for name in _MLFLOW_INFO_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger(_MLFLOW_ERROR_ECHO).setLevel(logging.CRITICAL)
    for message in WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars: the tiny model loads in well under a second


def run_device(trainer, weights) -> str:
    """Where a run computes, as its MLflow tag `ragen_lit.device` records it: the device (with the GPU's name), the
    weights' dtype and the Lightning precision, e.g. `cuda (NVIDIA H200), bfloat16 weights, bf16-mixed`."""
    import torch

    root = trainer.strategy.root_device
    name = f"{root.type} ({torch.cuda.get_device_name(root)})" if root.type == "cuda" else root.type
    dtype = str(next(weights.parameters()).dtype).removeprefix("torch.")
    return f"{name}, {dtype} weights, {trainer.precision}"


def describe_run(cfg: Config, trainer, run_dir) -> str:
    """The one line that says what runs: environment, algorithm and filter, model, device, size, run folder, and the
    folders in it that the loggers besides MLflow write to."""
    from ragen_lit.run.loggers import logger_folder

    f = cfg.filter
    selection = "no filter" if f.strategy == "none" else f"filter {f.strategy} {f.value:g}"
    if cfg.model.path:
        model = cfg.model.path
    else:
        model = "tiny (shipped in the package)" if cfg.model.name == "tiny" else cfg.model.name
    device = trainer.strategy.root_device.type
    if device == "cpu" and cfg.trainer.threads:
        device += f", {cfg.trainer.threads} thread{'s' if cfg.trainer.threads > 1 else ''}"
    if trainer.world_size > 1:
        device += f", {trainer.world_size} processes"
    r = cfg.rollout
    folders = [f"{folder.relative_to(run_dir)}/" for folder in map(logger_folder, trainer.loggers) if folder]
    also = f" (logs also in {', '.join(folders)})" if folders else ""
    return (
        f"fit: {cfg.env.name} | {cfg.algo.name}, {selection} | model {model} | {device} | "
        f"{cfg.trainer.iterations} iterations x {r.groups} prompts x {r.group_size} rollouts | run folder {run_dir}"
        f"{also}"
    )
