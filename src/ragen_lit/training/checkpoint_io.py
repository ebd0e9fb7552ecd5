"""Checkpoint files written so that a failed write is never silent.

Lightning's own writer (`lightning.fabric.utilities.cloud_io._atomic_save`) catches `PermissionError` to reword a
cross-device case and drops every other one, so a checkpoint folder that refuses writes loses every later checkpoint
while the run reports success. The rule here: a checkpoint that cannot be written stops the run at once with
`RunError` naming the file and the OS error (`fit` adds where the run stopped, the checkpoint to resume from and the
MLflow status: `training.run_faults`). No retry and no other folder: a full disk or a revoked permission does not
heal by itself, and checkpoints scattered elsewhere would not be found by `trainer.resume=last`. Lightning then marks
the MLflow run FAILED; metrics logged so far are already in the store (the checkpoint callback runs after
`IterationLogger` has logged the iteration). The write goes to a hidden partial file renamed over the target, so the
checkpoints written before stay whole and resumable.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ragen_lit.errors import RunError


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
