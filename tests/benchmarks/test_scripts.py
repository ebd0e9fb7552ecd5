"""The thin entry points in `scripts/` stay wired to `bench`: each one's --help runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
ENTRY_POINTS = [
    "bench_step",
    "bench_update",
    "bench_filter",
    "bench_diagnostics",
    "bench_engine",
    "bench_scoring",
    "bench_envs",
    "bench_scaling",
    "make_random_model",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help_runs(name):
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=SCRIPTS.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"usage: {name}.py")
