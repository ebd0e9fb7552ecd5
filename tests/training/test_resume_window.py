"""A run stopped between an iteration's periodic checkpoint and its `last.ckpt` is resumed from the periodic one, by
`fit` and by `sweep`; a checkpoint path the project writes passes back as `trainer.resume=PATH` unquoted."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.analysis.sweep_run import DONE_MARKER, LOG_NAME
from ragen_lit.cli import main


def _resumed_from(run: Path) -> list[str]:
    return [Path(resume["checkpoint"]).name for resume in json.loads((run / "run.json").read_text())["resumes"]]


def test_a_periodic_checkpoint_path_is_passed_back_unquoted(tmp_path, capsys):
    args = ["fit", "--config", CONFIG, f"logging.output_dir={tmp_path}", *SMALL, "trainer.checkpoint_every=1"]
    assert main([*args, "trainer.iterations=2"]) == 0
    (run,) = tmp_path.glob("frozenlake-*")
    periodic = run / "checkpoints" / "iter-0001.ckpt"
    assert sorted(p.name for p in periodic.parent.iterdir()) == ["iter-0001.ckpt", "iter-0002.ckpt", "last.ckpt"]
    capsys.readouterr()
    assert main([*args, "trainer.iterations=3", f"trainer.resume={periodic}"]) == 0, capsys.readouterr().err
    assert _resumed_from(run) == ["iter-0001.ckpt"]


def test_a_sweep_resumes_a_run_stopped_before_its_first_last_checkpoint(tmp_path, capsys):
    args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", *SMALL]
    args += ["trainer.iterations=2", "trainer.checkpoint_every=2"]
    assert main(args) == 0
    folder = tmp_path / "s" / "base-seed0"
    (run,) = folder.glob("frozenlake-*")
    # what a kill right after iteration 2's periodic checkpoint leaves: no last.ckpt yet, no `finished` record
    (run / "checkpoints" / "last.ckpt").unlink()
    (folder / DONE_MARKER).unlink()
    info = json.loads((run / "run.json").read_text())
    del info["finished"]
    (run / "run.json").write_text(json.dumps(info))
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr()
    commands = [line for line in (folder / LOG_NAME).read_text().splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and "trainer.resume=last" in commands[1].split()
    assert _resumed_from(run) == ["iter-0002.ckpt"]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 's' / 'mlruns.db'}")  # the sweep's store
    (status,) = mlflow.search_runs(experiment_names=["ragen_lit"])["status"]  # the same MLflow run, continued
    assert status == "FINISHED"
