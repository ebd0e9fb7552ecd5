"""A run's checkpoints: their names, which are complete, and which one a run folder (or a path given for one)
stands for. Light: no torch, no Lightning. How `fit` writes them is `run.checkpoint_writer`; the policy inside one,
and `export`, `run.trained_policy`.

A run folder (`<logging.output_dir>/<run name>-<time>/`) holds `run.json` (the run's record) and `checkpoints/`:
`iter-NNNN.ckpt` every `trainer.checkpoint_every` iterations (NNNN: the iteration it ends, 1-based like the logged
steps) and `last.ckpt`, written right after it and at the end of training. The names hold no `=`, so a path passes
unquoted as an override (`trainer.resume=runs/<run>/checkpoints/iter-0010.ckpt`). Runs written before this naming
hold `iter-epoch=NNNN.ckpt` (Lightning's 0-based epoch); they are read the same way.

Every `*.ckpt` file on disk is whole: it is written to a hidden partial file and renamed (`run.checkpoint_writer`).
Under `trainer.strategy=fsdp` a checkpoint is a folder, complete once its `meta.pt` is there (Lightning writes it
after the shards).

The newest complete checkpoint stands for the run, whichever kind it is: `last.ckpt` as a rule, but a process
stopped between an iteration's `iter-NNNN.ckpt` and its `last.ckpt` leaves the periodic one newer (with a large
model that window lasts seconds). Newest means last written: the file's modification time (a folder's: its newest
file); at equal times `last.ckpt` wins, as it is written after the periodic one.
"""

from __future__ import annotations

import os
from pathlib import Path

from ragen_lit.errors import ConfigError

CHECKPOINT_FOLDER = "checkpoints"
SUFFIX = ".ckpt"
PERIODIC_NAME = "iter-{iteration:04d}"
"""`ModelCheckpoint`'s filename template of the periodic checkpoints (without the suffix)"""
LAST_NAME = "last"
META_FILE = "meta.pt"


def is_sharded_checkpoint(path: Path) -> bool:
    """A distributed-checkpoint folder as Lightning's ModelParallelStrategy writes it (`meta.pt` + shards)."""
    return path.is_dir() and (path / META_FILE).is_file()


def is_complete_checkpoint(path: Path) -> bool:
    """A `*.ckpt` file, or a sharded checkpoint folder with its `meta.pt`; never a hidden partial file."""
    named = path.name.endswith(SUFFIX) and not path.name.startswith(".")
    return named and (path.is_file() or is_sharded_checkpoint(path))


def checkpoint_mtime(path: Path) -> int:
    """When a checkpoint was last written (ns); a folder's own mtime misses files rewritten in place."""
    if path.is_dir():
        return max((p.stat().st_mtime_ns for p in path.iterdir()), default=path.stat().st_mtime_ns)
    return path.stat().st_mtime_ns


def recency(path: Path) -> tuple[int, bool]:
    """A sort key that puts the newest checkpoint last: its write time, then `last.ckpt` after a periodic one."""
    return checkpoint_mtime(path), path.name == LAST_NAME + SUFFIX


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of the run folder `run_dir`, oldest first (the last one is `newest_checkpoint`)."""
    folder = run_dir / CHECKPOINT_FOLDER
    if not folder.is_dir():
        return []
    found = [path for path in folder.iterdir() if is_complete_checkpoint(path)]
    return sorted(found, key=recency)


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint that stands for the run folder `run_dir` (module docstring); None before the first one."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def is_run_or_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` names a run folder or a checkpoint (rather than a model folder or a hub id): a file, a
    sharded checkpoint folder, or a folder with `checkpoints/` or `run.json` and no `config.json`."""
    path = Path(path).expanduser()
    if path.is_file() or is_sharded_checkpoint(path):
        return True
    return (
        path.is_dir()
        and not (path / "config.json").exists()
        and ((path / "checkpoints").is_dir() or (path / "run.json").is_file())
    )


def find_checkpoint(source: str | os.PathLike, what: str) -> Path:
    """The checkpoint that `source` (a run folder or a checkpoint) stands for: itself, or the run
    folder's `newest_checkpoint`.

    `what` names the argument in errors (e.g. `--model`). Raises `ConfigError` for a missing path or a run
    folder without checkpoints."""
    path = Path(source).expanduser()
    if path.is_file() or is_sharded_checkpoint(path):
        return path.resolve()
    if not path.is_dir():
        raise ConfigError(f"{what} {str(source)!r}: no such run folder or checkpoint file")
    newest = newest_checkpoint(path)
    if newest is None:
        raise ConfigError(
            f"{what} {str(source)!r}: no checkpoints in {path / CHECKPOINT_FOLDER} (a run folder holds "
            "checkpoints/*.ckpt once an iteration has finished)"
        )
    return newest.resolve()
