"""A real kill and resume: `python -m ragen_lit fit` is SIGKILLed once iteration 2's checkpoint is on disk, resumed
with `trainer.resume=last` to iteration 3, and its MI EMA (`collapse/first_turn/mi_zscore_ema`, whose state lives in
the checkpoint) matches an uninterrupted 3-iteration run of the same config and seed."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EMA = "collapse/first_turn/mi_zscore_ema"


def _command(output_dir: Path, model_dir, *extra) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ragen_lit",
        "fit",
        "--config",
        str(ROOT / "conf" / "frozenlake.yaml"),
        f"model.path={model_dir}",
        f"logging.output_dir={output_dir}",
        "rollout.groups=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=48",
        "diagnostics.num_samples=8",
        "optim.num_minibatches=2",
        "optim.micro_batch_size=4",
        "trainer.threads=1",
        "trainer.iterations=3",
        "trainer.checkpoint_every=1",
        "diagnostics.every_n_iterations=1",
        # validation on 64 maps every iteration makes each iteration last a second or more even on a fast, idle
        # machine, so the kill lands between iteration 2's checkpoint and the end of iteration 3
        "validation.num_envs=64",
        "validation.every_n_iterations=1",
        "rollout.max_turns=1",
        *extra,
    ]


def _history(output_dir: Path, key: str) -> dict[int, float]:
    mlflow.set_tracking_uri(f"sqlite:///{output_dir / 'mlruns.db'}")
    (run_id,) = mlflow.search_runs(experiment_names=["ragen_lit"])["run_id"]
    return {m.step: m.value for m in mlflow.tracking.MlflowClient().get_metric_history(run_id, key)}


def _checkpoint_epoch(path: Path) -> int | None:
    """The epoch a complete checkpoint file holds; None while it is missing or still being written."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["epoch"])
    except Exception:
        return None


@pytest.mark.slow
def test_resume_after_sigkill_restores_the_mi_ema(tmp_path, tiny_model_dir):
    whole_dir, killed_dir = tmp_path / "whole", tmp_path / "killed"
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("whole", "killed", "resumed")}
    # both runs at once (each on one thread): the uninterrupted reference and the one to kill
    whole = subprocess.Popen(_command(whole_dir, tiny_model_dir), stdout=logs["whole"], stderr=subprocess.STDOUT)
    killed = subprocess.Popen(_command(killed_dir, tiny_model_dir), stdout=logs["killed"], stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint of iteration 2 within 10 minutes"
            checkpoints = list(killed_dir.glob("frozenlake-*/checkpoints"))
            # iteration 2 is epoch 1: its own file is complete and last.ckpt is (a complete copy of) it
            if checkpoints and any(_checkpoint_epoch(p) == 1 for p in checkpoints[0].glob("iter-*0001.ckpt")):
                if _checkpoint_epoch(checkpoints[0] / "last.ckpt") == 1:
                    break
            time.sleep(0.05)
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=60) == -signal.SIGKILL
    finally:
        if killed.poll() is None:
            killed.kill()
    assert not list(killed_dir.glob("frozenlake-*/checkpoints/iter-*0002.ckpt"))  # killed before iteration 3
    assert sorted(_history(killed_dir, EMA)) == [1, 2]

    resumed = subprocess.run(
        _command(killed_dir, tiny_model_dir, "trainer.resume=last"), stdout=logs["resumed"], stderr=subprocess.STDOUT
    )
    assert resumed.returncode == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    assert whole.wait(timeout=900) == 0, (tmp_path / "whole.log").read_text()[-3000:]

    reference, resumed_ema = _history(whole_dir, EMA), _history(killed_dir, EMA)
    assert sorted(reference) == sorted(resumed_ema) == [1, 2, 3]  # one MLflow run, continued at iteration 3
    for step in (1, 2, 3):
        assert math.isfinite(reference[step])
        assert resumed_ema[step] == pytest.approx(reference[step], rel=1e-5, abs=1e-6), (step, reference, resumed_ema)
