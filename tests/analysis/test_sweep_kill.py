"""A sweep killed with SIGKILL leaves no fit training, whatever launched its runs: the pool's runs die with it
(`sweep_run.child_setup`), and a launcher's job on this machine (joblib, submitit_local: the job outlives the
multirun, submitit's controller is made to survive it) kills its run's fit once the sweep's lock is let go
(`sweep_run.run_attempt`). Seen from outside: the fit's run folder lock (`run.lock`) is let go and its process ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.run.lock import LOCK_NAME, holder


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an ended process its parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["local", "joblib", "submitit_local"])
def test_a_killed_sweep_leaves_no_fit_training(tmp_path, launcher):
    # a run far longer than the test waits (no filter: no empty-filter stop rule ends it early)
    long_run = ["filter.strategy=none", "trainer.iterations=2000", "trainer.checkpoint_every=2000"]
    long_run.append("validation.every_n_iterations=2000")
    command = [sys.executable, "-m", "ragen_lit", "sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s"]
    command += ["--launcher", launcher, *SMALL, *long_run]
    sweep = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=os.environ.copy()
    )
    try:
        deadline, line = time.monotonic() + 300, None
        while line is None:  # until the run's fit holds its run folder
            assert sweep.poll() is None and time.monotonic() < deadline, f"the sweep ended: {sweep.returncode}"
            locks = list((tmp_path / "s").glob(f"base-seed0/*/{LOCK_NAME}"))
            line = holder(locks[0]) if locks else None
            time.sleep(0.2)
        fit = int(line.split(",")[0].removeprefix("pid "))
        assert _running(fit)
        os.kill(sweep.pid, signal.SIGKILL)  # the sweep alone, as `kill -9 <sweep>` does
        sweep.wait()
        deadline = time.monotonic() + 60
        while holder(locks[0]) is not None or _running(fit):
            assert time.monotonic() < deadline, f"fit {fit} still runs after its sweep was killed ({line})"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # what the sweep left, should the test fail
            os.killpg(sweep.pid, signal.SIGKILL)
