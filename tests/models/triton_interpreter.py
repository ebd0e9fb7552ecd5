"""Run Triton kernels in Triton's interpreter from a test: `TRITON_INTERPRET=1` must be set before Triton compiles
anything, so the kernels run in a subprocess, which loads its inputs from a file and saves its outputs to one."""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def interpreted(script: str, payload, tmp_path):
    """Save `payload`, run `script` (Python reading `sys.argv[1]` with `torch.load` and writing its result to
    `sys.argv[2]` with `torch.save`) under the interpreter, and return what it saved."""
    torch.save(payload, tmp_path / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(tmp_path / "out.pt")
