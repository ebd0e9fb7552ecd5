"""One process trains a run folder at a time (`run.lock`): while a `fit` trains a run, a second `fit` that would
resume it is refused in one line naming the folder and the holder's process id, before anything is written; once
the holder is killed (SIGKILL: its lock file stays, naming the dead process) the next `fit` takes the folder over."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.cli import main
from ragen_lit.run.lock import LOCK_NAME, holder

KILL_FIT = str(Path(__file__).with_name("kill_fit.py"))


def test_a_run_in_training_is_not_resumed_twice_and_a_killed_holders_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["--config", CONFIG, *SMALL, "trainer.iterations=2", "trainer.checkpoint_every=1"]
    args.append(f"logging.output_dir={out}")
    first = subprocess.Popen(
        [sys.executable, KILL_FIT, "wait", "1", "fit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        seen = []
        while "kill_fit: waiting" not in (line := first.stdout.readline()):  # its first checkpoint is written
            assert line, "".join(seen)
            seen.append(line)
        (run,) = out.glob("frozenlake-*")
        listing = sorted(p.name for p in run.rglob("*"))
        assert main(["fit", *args, "trainer.resume=last"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: run folder {run} is being trained by another process (pid {first.pid}, ")
        assert err.endswith("); wait for it to end, or stop it, and run this again\n") and err.count("\n") == 1, err
        assert sorted(p.name for p in run.rglob("*")) == listing  # nothing written
    finally:
        first.kill()
        first.wait()
    lock = run / LOCK_NAME
    assert lock.read_text().startswith(f"pid {first.pid}, ") and holder(lock) is None  # stale: its holder is dead
    assert main(["fit", *args, "trainer.resume=last"]) == 0
    assert lock.read_text().startswith(f"pid {os.getpid()}, ") and holder(lock) is None  # let go when fit ended
