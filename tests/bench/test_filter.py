"""`scripts/bench_filter.py` (`ragen_lit.bench.filter`) on a tiny configuration: it runs through the real update
path and prints its table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_filter.py"


def test_prints_both_settings_and_a_verdict(tiny_model_dir):
    overrides = [
        f"model.path={tiny_model_dir}",
        "model.name=hf",
        "rollout.groups=4",
        "rollout.group_size=4",
        "rollout.max_turns=2",
        "rollout.max_new_tokens=48",
        "trainer.threads=1",
    ]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeats", "1", *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SCRIPT.parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("bench_filter  ") and "rollouts=16" in out
    none = re.search(r"^none\s+1\.00\s+1\.000\s+16\s+1\.000\s+4\s+([0-9.]+)\s+1\.000", out, flags=re.MULTILINE)
    assert none and float(none.group(1)) > 0, out
    top_p = re.search(r"^top_p\s+0\.90\s+([0-9.]+)\s+(\d+)", out, flags=re.MULTILINE)
    assert top_p, out
    kept_ratio, kept_rows = float(top_p.group(1)), int(top_p.group(2))
    assert kept_rows == round(kept_ratio * 16) and kept_rows % 4 == 0  # whole groups of 4
    assert re.search(r"^target: .*(meets|MISSES|not measurable)", out, flags=re.MULTILINE)
