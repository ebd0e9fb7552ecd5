"""One sweep at a time in a sweep folder.

`sweep_lock(folder)` holds the lock on `<folder>/sweep.lock` (`run.lock`) while a sweep works in the folder
(writing its runs' configs, running them); a second sweep on the same folder is refused at once, in one line naming
the holder (its process id and start time). A killed sweep leaves no stale lock, and the runs a sweep starts do not
inherit it (`run.lock`); each run's `fit` holds its own run folder's lock (`run.lock.hold`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ragen_lit.errors import ConfigError
from ragen_lit.run.lock import Held, take

LOCK_NAME = "sweep.lock"


@contextlib.contextmanager
def sweep_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s sweep lock for the `with` block (the folder is made if needed); raises ConfigError when
    another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        lock = take(folder / LOCK_NAME)
    except Held as held:
        raise ConfigError(
            f"sweep folder {folder} is in use by another sweep ({held.holder}); wait for it to end, or give this one "
            "another --name or --out"
        ) from None
    with lock:
        yield
