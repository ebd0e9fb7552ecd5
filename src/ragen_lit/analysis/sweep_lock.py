"""One sweep at a time in a sweep folder.

`sweep_lock(folder)` holds an exclusive `flock` on `<folder>/sweep.lock` while a sweep works in the folder (writing
its runs' configs, running them); a second sweep on the same folder is refused at once, in one line naming the
holder (its process id and start time, which the holder writes into the file). The kernel releases the lock when the
holder's process ends, however it ends, so a killed sweep leaves no stale lock; the runs a sweep starts do not
inherit it (Python's file descriptors are not inherited). Linux and macOS (`fcntl`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ragen_lit.errors import ConfigError

LOCK_NAME = "sweep.lock"


@contextlib.contextmanager
def sweep_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s sweep lock for the `with` block (the folder is made if needed); raises ConfigError when
    another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text().strip() or "a process"
            raise ConfigError(
                f"sweep folder {folder} is in use by another sweep ({holder}); wait for it to end, or give this one "
                "another --name or --out"
            ) from None
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        yield
    finally:
        os.close(descriptor)  # releases the lock; the file stays, holding the last holder's line
