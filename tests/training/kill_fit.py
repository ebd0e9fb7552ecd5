"""`python tests/training/kill_fit.py POINT ITERATION fit ARGS`: `python -m ragen_lit fit ARGS`, SIGKILLed at one
chosen moment of 1-based ITERATION, for `test_resume_kill.py`. POINT is one of:

- `rollout`: as the iteration's training rollouts begin (the iterations since the last checkpoint are logged);
- `update`: right after the iteration's first optimizer step (weights half updated, nothing of it logged);
- `validation`: as its validation begins (its training metrics are logged, its validation metrics are not);
- `checkpoint`: right after its `last.ckpt` is written (before the next iteration; at the last one, before the
  summary and run.json's `finished`).
"""

from __future__ import annotations

import os
import signal
import sys

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
    else:
        raise SystemExit(f"unknown kill point {point!r}")
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
