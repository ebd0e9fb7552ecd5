"""`scripts/bench_filter.py` (`bench.filter`) on a tiny configuration: it runs through the real update
path, drops whole groups, trains on fewer tokens with the same optimizer steps, and prints its verdict. Whether
the target is met is the benchmark's finding on the machine that runs it, not a unit test's: timings on a shared
CI machine are no evidence either way."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_filter.py"
ROW = r"^{}\s+([0-9.]+)\s+([0-9.]+)\s+(\d+)\s+([0-9.]+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$"


def test_the_filtered_update_trains_on_fewer_tokens_and_is_judged(tiny_model_dir):
    # top-p 0.5 keeps about half of the 4 groups, so the filtered update has fewer tokens to train on
    # (at kept_ratio 1 there is nothing to compare); 2 mini-batches of 8 rows, the median of 3 repeats
    overrides = [
        f"model.path={tiny_model_dir}",
        "model.name=hf",
        "rollout.groups=4",
        "rollout.group_size=4",
        "rollout.max_turns=2",
        "rollout.max_new_tokens=48",
        "filter.value=0.5",
        "optim.num_minibatches=2",
        "trainer.threads=1",
    ]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeats", "3", *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SCRIPT.parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("bench_filter  ") and "rollouts=16" in out and "minibatch=scale" in out
    none = re.search(ROW.format("none"), out, flags=re.MULTILINE)
    top_p = re.search(ROW.format("top_p"), out, flags=re.MULTILINE)
    assert none and top_p, out
    assert float(none.group(2)) == 1.0 and int(none.group(3)) == 16 and float(none.group(6)) > 0, out
    kept_ratio, kept_rows, token_ratio, steps = (
        float(top_p.group(2)),
        int(top_p.group(3)),
        float(top_p.group(4)),
        int(top_p.group(5)),
    )
    assert 0 < kept_ratio < 1, out  # the filter dropped something, so there is a saving to measure
    assert kept_rows == round(kept_ratio * 16) and kept_rows % 4 == 0  # whole groups of 4
    assert token_ratio < 1
    assert steps == int(none.group(5)) == 2  # filter.minibatch=scale: same optimizer steps, smaller mini-batches
    assert re.search(r"^target: filtered update <= .* -> (meets|MISSES)$", out, flags=re.MULTILINE), out
