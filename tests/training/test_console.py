"""The console of a default `fit`: one line saying what runs, the progress bar, the summary; third-party tips,
INFO lines, deprecation warnings and weight-loading bars only with `--verbose`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHATTER = (
    "Tip:",
    "litlogger",
    "GPU available",
    "TPU available",
    "LeafSpec",
    "in eval mode",
    "INFO mlflow",
    "Loading weights",
    "`Trainer.fit` stopped",
)


def _fit(tmp_path, *extra):
    cmd = [
        sys.executable,
        "-m",
        "ragen_lit",
        "fit",
        "--config",
        str(ROOT / "conf" / "frozenlake.yaml"),
        *extra,
        "trainer.iterations=1",
        "trainer.threads=1",
        "rollout.groups=2",
        "rollout.group_size=4",
        "rollout.max_turns=2",
        "validation.num_envs=8",
        f"logging.output_dir={tmp_path}",
    ]
    tmp_path.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's default filters, as a user has
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def test_a_default_fit_prints_what_runs_the_bar_and_the_summary_and_nothing_else(tmp_path):
    out, err = _fit(tmp_path / "quiet")
    first = out.splitlines()[0]
    assert first.startswith("fit: frozenlake | grpo, filter top_p 0.9 | model tiny (shipped in the package) | cpu")
    assert "1 iterations x 2 prompts x 4 rollouts | run folder" in first
    assert "validation success (before → after)" in out
    assert "iterations (validating: 8 episodes)" in err  # a long step shows what it does
    for text in CHATTER:
        assert text not in out + err, text
    # everything on stderr belongs to the progress bar
    for line in err.replace("\r", "\n").splitlines():
        assert not line.strip() or line.startswith("iterations"), line


@pytest.mark.slow
def test_verbose_keeps_the_third_party_lines(tmp_path):
    out, err = _fit(tmp_path / "verbose", "--verbose")
    assert "GPU available" in out + err
    assert "Loading weights" in err


def test_the_notices_only_a_gpu_machine_gets_are_dropped(monkeypatch, caplog, recwarn):
    """Lightning's advice on float32 products on tensor cores (the run sets the precision itself:
    `trainer.matmul_precision`) and on loader workers (the rollout loader's batches are made in this process), each
    raised by Lightning's own check as on a 16-core GPU machine."""
    import logging
    import types

    import torch
    from lightning.fabric.accelerators import cuda
    from lightning.pytorch.trainer.connectors import data_connector
    from torch.utils.data import DataLoader

    from ragen_lit.run.console import quiet_third_party

    quiet_third_party()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(cuda, "_is_ampere_or_later", lambda device=None: True)
    monkeypatch.setattr(data_connector, "suggested_max_num_workers", lambda local_world_size: 15)
    cuda._check_cuda_matmul_precision.cache_clear()
    previous = torch.get_float32_matmul_precision()  # a fit earlier in this process set its own
    torch.set_float32_matmul_precision("highest")  # the condition of Lightning's advice
    with caplog.at_level(logging.INFO):
        cuda._check_cuda_matmul_precision(torch.device("cuda", 0))
        data_connector._worker_check(types.SimpleNamespace(num_devices=1), DataLoader([1]), "train_dataloader")
    cuda._check_cuda_matmul_precision.cache_clear()
    torch.set_float32_matmul_precision(previous)
    assert not caplog.records and not recwarn.list, [*caplog.records, *recwarn.list]
