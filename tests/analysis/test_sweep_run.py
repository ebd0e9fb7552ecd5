"""One run of a sweep from its folder: the resume-or-start-clean decision, the markers an attempt leaves, and a
launcher job's attempt (`run_attempt`), with a stand-in for `fit` (the real fits run in test_sweep*.py)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from ragen_lit.analysis import sweep_run
from ragen_lit.analysis.sweep_run import (
    DONE_MARKER,
    FAILED_MARKER,
    LOG_NAME,
    outcome,
    record_end,
    run_attempt,
    server_override,
    start_attempt,
    status,
)
from ragen_lit.errors import ConfigError


def _run_folder(root: Path, checkpoint: str | None = None) -> Path:
    """A run folder as `sweep` leaves it: its config, a log, an MLflow store, a fit's run folder (with `checkpoint`)."""
    folder = root / "filter.strategy-none-seed0"
    (folder / "frozenlake-grpo-20261128-120000" / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text("trainer:\n  seed: 0\n")
    (folder / LOG_NAME).write_text("$ fit ...\n")
    (folder / "mlruns.db").write_text("a run")
    if checkpoint:
        (folder / "frozenlake-grpo-20261128-120000" / "checkpoints" / checkpoint).write_text("weights")
    return folder


@pytest.fixture
def fake_fit(monkeypatch):
    """`fit` replaced by a process that exits with the code in `codes[0]` and records its command line."""
    commands, codes, real = [], [0], sweep_run.fit_command

    def command(folder: Path, resume: bool) -> list[str]:
        commands.append(real(folder, resume))
        return [sys.executable, "-c", f"import sys; print('fit output'); sys.exit({codes[0]})"]

    monkeypatch.setattr(sweep_run, "fit_command", command)
    return commands, codes


@pytest.mark.parametrize(
    ("checkpoint", "state"),
    [(None, "new"), ("last.ckpt", "resume"), ("iter-0002.ckpt", "resume"), (".last.ckpt.partial", "new")],
)
def test_a_run_resumes_from_a_complete_checkpoint_of_any_kind(tmp_path, checkpoint, state):
    assert status(_run_folder(tmp_path, checkpoint)) == state


def test_a_done_marker_makes_a_run_done_whatever_else_is_there(tmp_path):
    folder = _run_folder(tmp_path, "last.ckpt")
    record_end(folder, 0, 12.4)
    assert status(folder) == "done" and outcome(folder) == (True, "12 s")


def test_a_resumed_attempt_keeps_the_run_and_a_new_one_starts_clean(tmp_path, fake_fit):
    """With a checkpoint: `trainer.resume=last`, nothing deleted; without: a clean start that keeps config.yaml and
    the log. Either way the previous attempt's failed marker goes: the new attempt's end is recorded afresh."""
    commands, _ = fake_fit
    resumed = _run_folder(tmp_path / "a", "last.ckpt")
    fresh = _run_folder(tmp_path / "b")
    for folder in (resumed, fresh):
        record_end(folder, -11, 3.0)
        process = start_attempt(folder, ["trainer.accelerator=cpu"], {})
        process.wait()
        process.log.close()
    assert commands[0][-1] == "trainer.resume=last" and "trainer.resume=last" not in commands[1]
    assert sorted(p.name for p in resumed.iterdir()) == [
        "config.yaml",
        "frozenlake-grpo-20261128-120000",
        "mlruns.db",
        LOG_NAME,
    ]
    assert sorted(p.name for p in fresh.iterdir()) == ["config.yaml", LOG_NAME]
    log = [line for line in (fresh / LOG_NAME).read_text().splitlines() if line]  # attempts apart by a blank line
    assert log[0] == "$ fit ..." and log[1].startswith("$ ") and log[2] == "fit output"


def test_only_a_run_that_writes_the_sweeps_store_is_given_its_server(tmp_path):
    """The server's address goes on the command line of a run whose config names the sweep's store; a run with a store
    of its own (an earlier sweep's layout) or the user's, or a sweep without a server, gets none."""
    server = "http://127.0.0.1:5000"
    folder = _run_folder(tmp_path)  # its config names no store: the run's own, beside it
    assert server_override(folder, server) == []
    (folder / "config.yaml").write_text(f"logging:\n  tracking_uri: sqlite:///{tmp_path / 'mlruns.db'}\n")
    assert server_override(folder, server) == [f"logging.tracking_server={server}"]
    assert server_override(folder, None) == []
    (folder / "config.yaml").write_text(f"logging:\n  tracking_uri: sqlite:///{tmp_path / 'mine.db'}\n")
    assert server_override(folder, server) == []


@pytest.mark.parametrize(("code", "marker", "text"), [(0, DONE_MARKER, r"\d+ s"), (3, FAILED_MARKER, "exit 3")])
def test_a_launcher_jobs_attempt_records_how_the_run_ended(tmp_path, fake_fit, code, marker, text):
    _, codes = fake_fit
    codes[0] = code
    folder = _run_folder(tmp_path, "iter-0001.ckpt")
    record_end(folder, 1, 1.0)  # an earlier attempt's failure
    assert run_attempt(folder) is (code == 0)
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("sweep")) == [LOG_NAME, marker]
    finished, detail = outcome(folder)
    assert finished is (code == 0) and re.fullmatch(text, detail)
    assert (folder / LOG_NAME).read_text().endswith("fit output\n")


def test_a_launcher_job_of_a_done_run_starts_nothing(tmp_path, fake_fit):
    commands, _ = fake_fit
    folder = _run_folder(tmp_path)
    record_end(folder, 0, 5.0)
    assert run_attempt(folder) is True
    assert commands == [] and (folder / "mlruns.db").exists()


def test_a_launcher_job_on_a_folder_without_a_config_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no config.yaml; give a run folder of a sweep"):
        run_attempt(tmp_path)


def test_a_launcher_jobs_attempt_at_a_run_in_use_starts_nothing_and_clears_nothing(tmp_path, fake_fit):
    """A fit holds the run's folder (`run.lock`, here this process): the job records the failure naming it, the
    folder keeps its store and run folder, and no fit is started."""
    from ragen_lit.run.lock import hold

    folder = _run_folder(tmp_path)
    run = folder / "frozenlake-grpo-20261128-120000"
    with hold(run):
        assert run_attempt(folder) is False
    commands, _ = fake_fit
    assert commands == []
    busy = f"run folder {run} is being trained by another process (pid {os.getpid()}, "
    assert (folder / FAILED_MARKER).read_text().startswith(busy)
    assert (folder / "mlruns.db").is_file() and run.is_dir()
