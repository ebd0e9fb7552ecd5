"""`scripts/bench_engine.py` end to end on CPU: the eager and `--compile` rows, a row per `--decode-attention` kernel,
and the `--profile` section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_engine.py"


@pytest.mark.slow
def test_engine_bench_times_the_compiled_model_beside_the_eager_one_and_profiles():
    command = [sys.executable, str(SCRIPT), "--batches", "16", "--prompt-tokens", "20", "--max-new-tokens", "4"]
    command += ["--threads", "1", "--caches", "graph", "--compile", "--compile-decode", "--profile"]
    command += ["--decode-attention", "auto", "math"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("16 ")]
    labels = ["graph", "graph, math attention", "graph, compiled", "graph, compiled, math attention"]
    labels += ["graph, compiled decode", "graph, compiled decode, math attention"]
    assert [row[1].strip() for row in rows] == labels
    assert all(float(row[5]) > 0 for row in rows)  # sampled tokens/s with the group prefill shared
    assert "batch 16, cache=graph, compiled decode, math attention, one generate call (4 steps at most)" in done.stdout
