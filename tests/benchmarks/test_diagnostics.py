"""`scripts/bench_diagnostics.py --smoke` (`bench.diagnostics`): the whole benchmark runs and prints
its table with finite figures."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_diagnostics.py"


def _figure(stdout: str, label: str) -> str:
    """The value cell of the `| label | value |` row."""
    match = re.search(rf"^\| {re.escape(label)}[^|]* \| (.+?) \|$", stdout, flags=re.MULTILINE)
    assert match, f"no row {label!r} in:\n{stdout}"
    return match.group(1)


def _number(cell: str) -> float:
    return float(re.match(r"[-+0-9.e]+", cell.replace("%", "").replace("x", " ")).group(0))


@pytest.mark.slow
def test_smoke_run_prints_every_figure(tiny_model_dir):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--model-path", str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SCRIPT.parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for header in ("machine: ", "date: ", "## 1. share of iteration time", "## 2. scorer peak memory"):
        assert header in out
    # one iteration, and it is the first, so the diagnostics ran on it (their cost rounds to 0.000 s when
    # no sampled turn closed its reasoning within the smoke budget, so the share may be 0)
    iteration_rows = re.findall(r"^\| 1 \| ([0-9.]+) \| ([0-9.]+) \| (yes|no) \|", out, flags=re.MULTILINE)
    assert iteration_rows == [iteration_rows[0]] and iteration_rows[0][2] == "yes"
    iteration_s, diagnostics_s = float(iteration_rows[0][0]), float(iteration_rows[0][1])
    assert 0 <= diagnostics_s < iteration_s
    assert _number(_figure(out, "diagnostics seconds on the iterations where they ran")) == diagnostics_s
    assert _number(_figure(out, "total iteration seconds")) == iteration_s
    share = _number(_figure(out, "amortised share of iteration time")) / 100
    assert math.isclose(share, diagnostics_s / iteration_s, abs_tol=5e-3)
    for label in ("cross_score (chunked log-softmax)", "naive (full fp32 logits + log_softmax)"):
        peak_mib, seconds = (_number(cell) for cell in _figure(out, label).split(" | "))
        assert math.isfinite(peak_mib) and peak_mib >= 0 and seconds > 0
    assert math.isfinite(_number(_figure(out, "memory ratio naive / cross_score")))
    # both scorers compute the same L_sum (fp32, ~60-magnitude sums)
    assert _number(_figure(out, "L_sum max abs diff")) < 1e-3
    for label in ("target | <= 10%", "target | >= 3x"):
        assert label in out
