"""The entrance of a `fit`'s run: `open_run` opens it once, from the config sections it needs, and hands back a
`run.folder.Run`, which the loggers, the callbacks and the end-of-run record take instead of the config.

Opening a run, in order: its folder (a new one, or the one a resume continues: `run.folder.resolve_run_dir`), held by
this process (`run.lock`; the other ranks train rank zero's); the runs of its name a kill left RUNNING marked KILLED
(`run.killed_runs`), whether or not this one is refused; a resume's config changes checked (`check_resume`) and a run
that already trained what is asked found (`finished_run`: nothing more is opened); then its MLflow store
(`run.store.open_store`: last, so that a run refused above leaves no store behind). The ranks Lightning launches run
`fit` again and train rank zero's folder, which it names to them in `RUN_DIR_ENV`. Leaving the `with` block releases
the folder's lock and takes the variable away.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path

from ragen_lit.config import LoggingConfig, TrainerConfig
from ragen_lit.run.folder import Run, check_resume, finished_run, resolve_run_dir
from ragen_lit.run.killed_runs import mark_killed
from ragen_lit.run.lock import hold, resolve_held
from ragen_lit.run.store import open_store

RUN_DIR_ENV = "RAGEN_LIT_RUN_DIR"
"""the run folder rank zero opened, for the ranks Lightning launches (they run `fit` again)"""


@contextlib.contextmanager
def open_run(logging: LoggingConfig, trainer: TrainerConfig, name: str, config: dict) -> Iterator[Run]:
    """Open the run `name` (`run.folder.default_run_name`) that follows `config` (`config.to_dict`) as the module
    docstring says, and yield it; `logging`: where it is written, `trainer`: its resume, iterations and checkpoints.
    Raises ConfigError on a run that cannot be (no checkpoint to resume, a folder another process trains, a config
    change a resume was not allowed, a store that does not open) before the run writes anything."""
    from lightning.pytorch.utilities import rank_zero_only

    rank_zero = rank_zero_only.rank == 0
    with contextlib.ExitStack() as held:
        # one process trains a run folder: a resumed run's is held from here, a new run's once made (below)
        resolve = functools.partial(resolve_run_dir, logging, trainer, name)
        try:
            folder, resume_from, record, lock = resolve_held(resolve) if rank_zero else (*resolve(), None)
            if lock is not None:
                held.enter_context(lock)
        finally:  # refused or not: the runs of this name a kill left RUNNING say so (this one, held now, is not)
            if rank_zero:
                mark_killed(logging, name)
        changes = check_resume(config, trainer, folder, record) if resume_from else {}
        finished = finished_run(trainer.iterations, record) if resume_from else None
        if not finished:
            if rank_zero:  # the other ranks start after rank zero opened it
                open_store(logging)
            inherited = os.environ.get(RUN_DIR_ENV)
            if inherited:
                folder = Path(inherited)
            else:
                os.environ[RUN_DIR_ENV] = str(folder)
                held.callback(os.environ.pop, RUN_DIR_ENV, None)
            if rank_zero and lock is None:
                held.enter_context(hold(folder))
        yield Run(
            folder,
            name,
            logging,
            trainer.iterations,
            trainer.checkpoint_every,
            config,
            resume_from,
            record,
            changes,
            finished,
        )
