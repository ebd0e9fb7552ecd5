"""`python tests/training/kill_fit.py POINT ITERATION fit ARGS`: `python -m ragen_lit fit ARGS`, SIGKILLed at one
chosen moment of 1-based ITERATION, for `test_resume_kill.py`. POINT is one of:

- `rollout`: as the iteration's training rollouts begin (the iterations since the last checkpoint are logged);
- `update`: right after the iteration's first optimizer step (weights half updated, nothing of it logged);
- `validation`: as its validation begins (its training metrics are logged, its validation metrics are not);
- `checkpoint`: right after its `last.ckpt` is written (before the next iteration; at the last one, before the
  summary and run.json's `finished`);
- `periodic`: right after its periodic `iter-NNNN.ckpt` is written, before its `last.ckpt` is begun;
- `last-partial`: while its `last.ckpt` is written: the hidden partial file is on disk, not yet renamed over it;
- `wait`: not killed here: right after its `last.ckpt` is written it prints `kill_fit: waiting` and sleeps, for the
  test to kill it (`run.lock`'s tests: a fit that holds its run folder).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from lightning.pytorch import Trainer

from ragen_lit import cli
from ragen_lit.training.callbacks import ValidationRollouts
from ragen_lit.training.data import RolloutDataModule
from ragen_lit.training.module import AgentRLModule


def _kill_around(owner, name: str, when) -> None:
    """Wrap `owner.name` so that the process SIGKILLs itself "before" or "after" the call `when(self, *args)` names."""
    original = getattr(owner, name)

    def wrapped(self, *args, **kwargs):
        moment = when(self, *args, **kwargs)
        if moment == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(self, *args, **kwargs)
        if moment == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, name, wrapped)


def _kill_while_writing_last(iteration: int) -> None:
    """SIGKILL as the checkpoint writer renames the finished partial file of `iteration`'s last.ckpt over it."""
    epochs: list[int] = []
    save = Trainer.save_checkpoint

    def save_noting_the_epoch(self, *args, **kwargs):
        epochs.append(self.current_epoch)
        return save(self, *args, **kwargs)

    replace = os.replace

    def replace_or_kill(src, dst):
        if Path(dst).name == "last.ckpt" and epochs[-1] + 1 == iteration:
            os.kill(os.getpid(), signal.SIGKILL)
        replace(src, dst)

    Trainer.save_checkpoint = save_noting_the_epoch
    os.replace = replace_or_kill


def main(point: str, iteration: int, argv: list[str]) -> int:
    if point == "rollout":
        _kill_around(RolloutDataModule, "train_seeds", lambda self, it, *_: "before" if it + 1 == iteration else None)
    elif point == "update":
        _kill_around(
            AgentRLModule,
            "training_step",
            lambda self, batch, index: "after" if self.current_epoch + 1 == iteration and index == 0 else None,
        )
    elif point == "validation":
        _kill_around(ValidationRollouts, "run", lambda self, trainer, module, it: "before" if it == iteration else None)
    elif point == "checkpoint":
        _kill_around(
            Trainer,
            "save_checkpoint",
            lambda self, path, *a, **k: (
                "after" if str(path).endswith("last.ckpt") and self.current_epoch + 1 == iteration else None
            ),
        )
    elif point == "periodic":
        _kill_around(
            Trainer,
            "save_checkpoint",
            lambda self, path, *a, **k: (
                "after" if Path(path).name != "last.ckpt" and self.current_epoch + 1 == iteration else None
            ),
        )
    elif point == "last-partial":
        _kill_while_writing_last(iteration)
    elif point == "wait":
        save = Trainer.save_checkpoint

        def save_then_wait(self, path, *args, **kwargs):
            save(self, path, *args, **kwargs)
            if str(path).endswith("last.ckpt") and self.current_epoch + 1 == iteration:
                print("kill_fit: waiting", flush=True)
                time.sleep(3600)

        Trainer.save_checkpoint = save_then_wait
    else:
        raise SystemExit(f"unknown kill point {point!r}")
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
