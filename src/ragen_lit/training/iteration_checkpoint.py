"""`IterationCheckpoint`: Lightning's `ModelCheckpoint` with the project's file names (`run.checkpoints`).

The periodic checkpoints are named by the iteration they end, 1-based like the logged steps (`iter-0005.ckpt` after
iteration 5, Lightning's epoch 4), with no `=` in the name, so that the path passes back unquoted as
`trainer.resume=...`; `last.ckpt` follows each of them and the end of training.

`trainer.checkpoint_every` counts iterations, as its name says: Lightning's own rule also skips a save when no
optimizer step happened since the last one, so an iteration whose filter kept nothing (it takes no step, yet its
metrics, rollout seeds and the empty-filter streak are the run's) would go unsaved and a resume would redo it.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint

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
