"""One process trains a run folder at a time, whatever started it (`fit` in a shell, a sweep's pool, a launcher's job).

`fit` holds the lock on `<run folder>/fit.lock` (`folder_lock`) while it trains the folder: a resumed run's from before
its checks, a new run's from the moment its folder is made. A second `fit` that would train the same folder
(`trainer.resume=last`, or a checkpoint of that run) is refused in one line naming the folder and the process that
holds it; a killed `fit` leaves no stale lock (the kernel lets it go), so the next one takes the folder over. A sweep
reads the lock to leave a run that is in use alone (`analysis.sweep_run`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ragen_lit.errors import ConfigError
from ragen_lit.folder_lock import FolderLock, Held, holder, take

LOCK_NAME = "fit.lock"


def hold(run_dir: Path) -> FolderLock:
    """The lock on `run_dir` (made if needed); ConfigError naming the holder while another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        return take(run_dir / LOCK_NAME)
    except Held as held:
        raise ConfigError(
            f"run folder {run_dir} is being trained by another process ({held.holder}); wait for it to end, or stop "
            "it, and run this again"
        ) from None


def resolve_held(
    resolve: Callable[[], tuple[Path, str | None, dict]],
) -> tuple[Path, str | None, dict, FolderLock | None]:
    """`resolve()` (the run folder, the checkpoint to resume or None, the run's record: what
    `training.tracking.resolve_run_dir` finds) with the lock of a resumed run's folder held: the folder is locked,
    then resolved again, so that the checkpoint is the newest one a process that ended meanwhile left. A new run's
    folder does not exist yet: its lock is None, and `fit` takes it (`hold`) once nothing can refuse the run."""
    while True:
        run_dir, checkpoint, info = resolve()
        if checkpoint is None:
            return run_dir, None, info, None
        lock = hold(run_dir)
        try:
            again = resolve()
        except BaseException:
            lock.release()
            raise
        if again[0] == run_dir:
            return (*again, lock)
        lock.release()  # another run of the name has the newest checkpoint now: resume that one


def in_use(run_dir: Path) -> str | None:
    """`run folder <run_dir> is being trained by another process (pid N, started T)` while a `fit` holds it."""
    line = holder(run_dir / LOCK_NAME)
    return None if line is None else f"run folder {run_dir} is being trained by another process ({line})"
