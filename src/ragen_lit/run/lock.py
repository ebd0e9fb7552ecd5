"""One process at a time: an exclusive `flock` on a lock file that names its holder, and the lock `fit` holds on the
run folder it trains.

`take(path)` takes the lock on the file `path` (made if needed) and writes its holder's line into it (`pid N,
started T`); while another process holds it, it raises `Held` with that process's line. `holder(path)` reads who holds
it without keeping it. The kernel releases a lock when its holder ends, however it ends, so a killed holder leaves no
stale lock: its file stays, holding its line, and the next process takes the lock over. No child keeps its parent's
lock: Python's descriptors are not inherited across exec, and a forked child closes its copy at once
(`os.register_at_fork`), so a child that outlives a killed parent does not hold the lock on. Linux and macOS
(`fcntl`).

The run folder's lock: one process trains a run folder at a time, whatever started it (`fit` in a shell, a sweep's
pool, a launcher's job). `fit` holds the lock on `<run folder>/fit.lock` while it trains the folder (`hold`): a
resumed run's from before its checks (`resolve_held`), a new run's from the moment its folder is made. A second `fit`
that would train the same folder (`trainer.resume=last`, or a checkpoint of that run) is refused in one line naming
the folder and the process that holds it; a killed `fit` leaves no stale lock, so the next one takes the folder over.
A sweep reads the lock to leave a run that is in use alone (`in_use`, `analysis.sweep_run`), and holds a lock of the
same kind on its own folder (`analysis.sweep_lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from ragen_lit.errors import ConfigError

LOCK_NAME = "fit.lock"
"""a run folder's lock file (`hold`)"""
_HELD: set[int] = set()
"""the descriptors of the locks this process holds, which a forked child closes"""


def _close_in_child() -> None:
    for descriptor in _HELD:
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class Held(Exception):
    """The lock is held by another process; `holder` is its line (`pid N, started T`)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


class FolderLock:
    """A lock this process holds until `release` (or the end of a `with` block, or of the process)."""

    def __init__(self, descriptor: int):
        self._descriptor: int | None = descriptor

    def release(self) -> None:
        """Let the lock go (the file stays, holding this process's line); a second call does nothing."""
        if self._descriptor is not None:
            _HELD.discard(self._descriptor)
            os.close(self._descriptor)
            self._descriptor = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take(path: Path) -> FolderLock:
    """Take the lock on `path` (its folder must exist); raises `Held` while another process holds it."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise Held(_line(path)) from None
    _HELD.add(descriptor)
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    return FolderLock(descriptor)


def holder(path: Path) -> str | None:
    """The line of the process that holds the lock on `path`, None when none does (or there is no such file). Read
    under a shared lock let go at once, which a holder's exclusive lock excludes."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _line(path)
    finally:
        os.close(descriptor)
    return None


def _line(path: Path) -> str:
    """The holder's line in `path` (empty for an instant after a holder took the lock, before it wrote)."""
    with contextlib.suppress(OSError):
        return path.read_text().strip() or "a process"
    return "a process"


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
    `run.folder.resolve_run_dir` finds) with the lock of a resumed run's folder held: the folder is locked,
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
