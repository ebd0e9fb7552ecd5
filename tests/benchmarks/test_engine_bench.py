"""`scripts/bench_engine.py` end to end on CPU: the eager and `--compile` rows, each also with `--split-attention` (on a
CPU its steps keep sdpa), and the `--profile` section."""

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
    command += ["--split-attention"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("16 ")]
    labels = ["graph", "graph, split attention", "graph, compiled", "graph, compiled, split attention"]
    labels += ["graph, compiled decode", "graph, compiled decode, split attention"]
    assert [row[1].strip() for row in rows] == labels
    assert all(float(row[5]) > 0 for row in rows)  # sampled tokens/s with the group prefill shared
    assert "batch 16, cache=graph, compiled decode, split attention, one generate call (4 steps at most)" in done.stdout
