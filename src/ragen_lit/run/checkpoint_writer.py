"""How `fit` writes a run's checkpoints, on Lightning's side: `IterationCheckpoint`, the callback that names and times
them, and `StrictCheckpointIO`, the writer under it, whose failed write is never silent. Which checkpoint stands for a
run is `run.checkpoints`' rule, the policy inside one `run.trained_policy`'s.

`IterationCheckpoint` is Lightning's `ModelCheckpoint` with the project's file names (`run.checkpoints`). The periodic
checkpoints are named by the iteration they end, 1-based like the logged steps (`iter-0005.ckpt` after iteration 5,
Lightning's epoch 4), with no `=` in the name, so that the path passes back unquoted as `trainer.resume=...`;
`last.ckpt` follows each of them and the end of training.

`trainer.checkpoint_every` counts iterations, as its name says: Lightning's own rule also skips a save when no
optimizer step happened since the last one, so an iteration whose filter kept nothing (it takes no step, yet its
metrics, rollout seeds and the empty-filter streak are the run's) would go unsaved and a resume would redo it.

`StrictCheckpointIO`: Lightning's own writer (`lightning.fabric.utilities.cloud_io._atomic_save`) catches
`PermissionError` to reword a cross-device case and drops every other one, so a checkpoint folder that refuses writes
loses every later checkpoint while the run reports success. The rule here: a checkpoint that cannot be written stops
the run at once with `RunError` naming the file and the OS error (`fit` adds where the run stopped, the checkpoint to
resume from and the MLflow status: `run.faults`). No retry and no other folder: a full disk or a revoked
permission does not heal by itself, and checkpoints scattered elsewhere would not be found by `trainer.resume=last`.
Lightning then marks the MLflow run FAILED; metrics logged so far are already in the store (the checkpoint callback
runs after `IterationLogger` has logged the iteration). The write goes to a hidden partial file renamed over the
target, so the checkpoints written before stay whole and resumable.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from ragen_lit.errors import RunError
from ragen_lit.run.checkpoints import PERIODIC_NAME


class IterationCheckpoint(ModelCheckpoint):
    def __init__(self, dirpath: Path, every_n_iterations: int):
        super().__init__(
            dirpath=dirpath,
            filename=PERIODIC_NAME,
            auto_insert_metric_name=False,
            every_n_epochs=every_n_iterations,
            save_last=True,
            save_top_k=-1,
            save_on_train_epoch_end=True,
        )

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        """Every `every_n_iterations`-th iteration: its periodic checkpoint, then last.ckpt (module docstring)."""
        if trainer.sanity_checking or trainer.fast_dev_run or (trainer.current_epoch + 1) % self._every_n_epochs:
            return
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    @property
    def state_key(self) -> str:
        """`ModelCheckpoint`'s own key: the state it saved in runs checkpointed before this class (the path of their
        last.ckpt among it) is restored when they resume, so their next save replaces that last.ckpt."""
        return ModelCheckpoint.__qualname__ + super().state_key.removeprefix(type(self).__qualname__)

    def format_checkpoint_name(self, metrics, *args, **kwargs) -> str:
        """The periodic name's `iteration` from Lightning's epoch (`last` names none); the other arguments pass through
        as they are, since their list differs between the Lightning versions pyproject.toml allows."""
        if "epoch" in metrics:
            metrics = {**metrics, "iteration": metrics["epoch"] + 1}
        return super().format_checkpoint_name(metrics, *args, **kwargs)


class StrictCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose save raises `RunError` on any OS error (local paths only, like the project)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("StrictCheckpointIO.save_checkpoint takes no storage_options")
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)  # serialise first: only the file writes below can meet an OS error
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as file:
                file.write(buffer.getbuffer())
            os.replace(partial, path)
        except OSError as err:
            with contextlib.suppress(OSError):  # a folder that refused the write may refuse the clean-up too
                partial.unlink(missing_ok=True)
            raise RunError(f"checkpoint {path} could not be written ({err.strerror or err})") from err
