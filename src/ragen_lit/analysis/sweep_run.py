"""One run of a planned sweep, known by its folder `<sweep>/<point>-seed<k>/` (its `config.yaml` written by `sweep`).

Its state on disk: `done` once an attempt finished (the `sweep_done` marker, holding the attempt's wall time),
`resume` while a complete checkpoint of any kind is in the folder (`trainer.resume=last`: a run stopped between its
periodic checkpoint and its `last.ckpt` included), `new` otherwise. An attempt is one `python -m ragen_lit fit`
process whose output is appended to the run's `sweep.log`: a new attempt first clears what a failed one left (its
run folder, the MLflow store of its own if it has one; its MLflow run in the sweep's store the sweep deleted before
its server started, `sweep_store.prepare_store`) but keeps `config.yaml` and the log, so the reason an attempt failed
stays readable. An attempt that fails leaves the `sweep_failed` marker with its exit status or signal. A run whose
config names the sweep's store is given the address of the sweep's MLflow server on its command line
(`server_override`).

The local process pool (`sweep`) and a Hydra launcher's job (`run_attempt`, the task of `ragen_lit.analysis.sweep_app`)
start attempts through the same functions, so both make the same resume-or-start-clean decision. A run whose folder a
`fit` holds (`run.lock`: a run a killed sweep's job left, or one started by hand) is not started and nothing of it is
cleared: the attempt fails at once naming that process (`RunInUse`), and the sweep goes on with its other runs.

An attempt ends with the sweep that started it, however the sweep ends: the pool's `fit`s are killed by the kernel
when the sweep dies (`child_setup`), and a launcher's job on this machine, which outlives the multirun (submitit's
controller is made to survive it), kills its `fit` within `WATCH_S` of the sweep's lock being let go (`run_attempt`,
told the sweep's process by `SWEEP_ENV`). Jobs in a cluster's queue are the cluster's to stop.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ragen_lit.analysis.sweep_lock import LOCK_NAME as SWEEP_LOCK
from ragen_lit.analysis.sweep_store import store_uri
from ragen_lit.errors import ConfigError
from ragen_lit.run.checkpoints import newest_checkpoint
from ragen_lit.run.lock import holder, in_use

DONE_MARKER = "sweep_done"
FAILED_MARKER = "sweep_failed"
LOG_NAME = "sweep.log"
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): the signal a process gets when its parent dies
SWEEP_ENV = "RAGEN_LIT_SWEEP_PID"
"""the process id of the sweep whose launcher's jobs run on this machine, in their environment (`run_attempt`)"""
WATCH_S = 1.0
"""how often a launcher's job looks whether its sweep still runs"""
logger = logging.getLogger(__name__)  # a launcher's job log (Hydra's job logging)


def status(folder: Path) -> str:
    """`done` (finished under this sweep), `resume` (has a checkpoint) or `new`."""
    if (folder / DONE_MARKER).is_file():
        return "done"
    if folder.is_dir() and any(newest_checkpoint(run) for run in folder.iterdir() if run.is_dir()):
        return "resume"
    return "new"


def fit_command(folder: Path, resume: bool) -> list[str]:
    command = [sys.executable, "-m", "ragen_lit", "fit", "--config", str(folder / "config.yaml")]
    return command + (["trainer.resume=last"] if resume else [])


def child_setup(cores: tuple[int, ...] | None = None, death_signal: int = signal.SIGKILL) -> None:
    """In a child process before it starts: pin it to `cores` (None: leave its CPUs alone), and (Linux) have it sent
    `death_signal` when its parent dies, so that a restarted sweep never races a run left over from a killed one (a
    server is sent SIGTERM instead, to stop its own children)."""
    if cores is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, death_signal)


class RunInUse(Exception):
    """A run folder of the run is held by a `fit` (`run.lock`), so the attempt was not started; the message names it."""


def run_in_use(folder: Path) -> str | None:
    """Why a `fit` of the run is running already (`run.lock.in_use` of one of its run folders), None when none is."""
    runs = sorted(run for run in folder.iterdir() if run.is_dir()) if folder.is_dir() else []
    return next(filter(None, map(in_use, runs)), None)


def start_attempt(
    folder: Path,
    placement: list[str],
    env: dict[str, str],
    cores: tuple[int, ...] | None = None,
    server: str | None = None,
) -> subprocess.Popen:
    """Start the run's `fit`: resumed from its checkpoint, or afresh in a cleared folder; `placement` overrides follow
    the run's own (e.g. `trainer.accelerator=cpu`), and `server` (the address of the sweep's MLflow server, if it
    runs one) is given to a run that writes the sweep's store. The process's `log` attribute is the open `sweep.log`,
    for the caller to close once it ended. Raises `RunInUse`, touching nothing but the log, while a `fit` holds the
    run."""
    busy = run_in_use(folder)
    if busy is not None:
        with open(folder / LOG_NAME, "a") as log:
            log.write(f"\nnot started: {busy}\n")
        raise RunInUse(busy)
    resume = status(folder) == "resume"
    (folder / FAILED_MARKER).unlink(missing_ok=True)
    if not resume and folder.exists():  # an attempt that never reached a checkpoint: start clean
        for child in folder.iterdir():  # but keep its log: why it failed is in there, the new attempt appends
            if child.name not in ("config.yaml", LOG_NAME):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    command = fit_command(folder, resume) + placement + server_override(folder, server)
    log = open(folder / LOG_NAME, "a")  # noqa: SIM115 - closed by the caller when the process ends
    # a killed attempt may have left a progress bar without its final newline
    log.write(f"{chr(10) if log.tell() else ''}$ {' '.join(command)}\n")
    log.flush()
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=lambda: child_setup(cores)
    )
    process.log = log  # type: ignore[attr-defined]
    return process


def server_override(folder: Path, server: str | None) -> list[str]:
    """`logging.tracking_server=<server>` for the run in `folder` when its config names the sweep's store
    (`sweep_store`); nothing for a run with a store of its own, or without a server."""
    if server is None:
        return []
    from ragen_lit.config import load_config

    if load_config(str(folder / "config.yaml")).logging.tracking_uri != store_uri(folder.parent):
        return []
    return [f"logging.tracking_server={server}"]


def exit_reason(returncode: int) -> str:
    """`exit 1`, or for a run killed by a signal its name (`killed by SIGSEGV`; Popen gives -signal)."""
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def record_end(folder: Path, returncode: int, seconds: float) -> None:
    """An attempt's end on disk: the done marker with its wall time, or the failed marker with why it ended."""
    if returncode == 0:
        (folder / DONE_MARKER).write_text(f"{seconds:.0f} s\n")
    else:
        record_failure(folder, exit_reason(returncode))


def record_failure(folder: Path, reason: str) -> None:
    """The failed marker, with why the attempt failed (an exit status, a signal, a run in use)."""
    (folder / FAILED_MARKER).write_text(reason + "\n")


def outcome(folder: Path) -> tuple[bool, str | None]:
    """(whether the run finished, its wall time or why its last attempt failed); the text is None when no attempt
    recorded an end."""
    for finished, marker in ((True, DONE_MARKER), (False, FAILED_MARKER)):
        if (folder / marker).is_file():
            return finished, (folder / marker).read_text().strip()
    return False, None


def run_attempt(folder: Path, server: str | None = None) -> bool:
    """One attempt at the run in `folder`, as a launcher's job makes it: nothing when the run is done already, else
    its `fit` (resumed or afresh, through the sweep's MLflow `server` if it runs one) waited for, or killed should the
    sweep that started the job end first (`_wait`), and its end recorded (`record_end`); whether the run is done."""
    if not (folder / "config.yaml").is_file():
        raise ConfigError(f"{folder}: no config.yaml; give a run folder of a sweep (`sweep` writes them)")
    if status(folder) == "done":
        logger.info(f"already done: {folder}")
        return True
    started = time.perf_counter()
    try:
        process = start_attempt(folder, [], dict(os.environ), server=server)
    except RunInUse as busy:
        record_failure(folder, str(busy))
    else:
        try:
            returncode = _wait(process, folder.parent, os.environ.get(SWEEP_ENV))
        finally:
            process.log.close()
        record_end(folder, returncode, time.perf_counter() - started)
    finished, detail = outcome(folder)
    logger.info(f"{'done' if finished else 'FAILED'}: {folder} ({detail}; its log: {folder / LOG_NAME})")
    return finished


def _wait(process: subprocess.Popen, sweep: Path, sweep_pid: str | None) -> int:
    """`process`'s exit status. Started by a sweep (`sweep_pid`), the attempt is killed (as the kernel kills a pool's
    attempt, `child_setup`) once that sweep no longer holds its folder's lock: it ended, however it ended (the lock
    let go, or held by a sweep started since)."""
    while True:
        try:
            return process.wait(timeout=WATCH_S if sweep_pid else None)
        except subprocess.TimeoutExpired:
            line = holder(sweep / SWEEP_LOCK)
            if line is None or not line.startswith(f"pid {sweep_pid},"):
                logger.info(f"its sweep (pid {sweep_pid}) ended: killing this run's fit (pid {process.pid})")
                process.kill()
