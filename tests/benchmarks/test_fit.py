"""`scripts/bench_fit.py --smoke` (`bench.fit`): it runs a real fit and its phases add up to the
whole command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_fit.py"


@pytest.mark.slow
def test_smoke_run_prints_every_phase_and_they_add_up(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "trainer.threads=1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "machine: " in out and "date: " in out
    rows = dict(re.findall(r"^\| ([a-z -]+) \| ([0-9.-]+) \|", out, flags=re.MULTILINE))
    phases = ("generation", "diagnostics", "prepare", "update", "validation", "start-up and teardown")
    assert set(phases) <= set(rows), out
    whole = float(re.search(r"\*\*whole command\*\* \| \*\*([0-9.]+)\*\*", out).group(1))
    assert abs(sum(float(rows[p]) for p in phases) - whole) < 0.5
    for phase in ("generation", "update", "validation"):
        assert float(rows[phase]) > 0, phase
    assert "| 2 iterations |" in out
