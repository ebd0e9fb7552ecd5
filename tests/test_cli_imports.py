"""`python -m ragen_lit --help` and a config that fails to load answer without importing torch, transformers or
Lightning: `-X importtime` lists every module the process imported. (How long they take is measured by
`scripts/bench_cli.py`, not asserted here: a test's wall time says more about the machine's load than the code.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CONF = str(Path(__file__).resolve().parents[1] / "conf" / "frozenlake.yaml")
HEAVY = ("torch", "transformers", "lightning")


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--help"], 0),
        (["fit", "--help"], 0),
        (["fit", "--config", CONF, "filter.value=7"], 2),
        (["config", "--config", CONF, "rollout.max_new_tokens=100000"], 2),
        (["fit", "--config", CONF, "trainer.resume=/runs/a/iter-epoch=0001.ckpt"], 2),
        # evaluate's and sweep's refusals of sizes no machine holds come before any model or engine is imported
        (["evaluate", "--model", "tiny", "--samples", "0"], 2),
        (["evaluate", "--model", "tiny", "--episodes", "2000000000"], 2),
        (["evaluate", "--model", "tiny", "--samples", "1000000000"], 2),
        (["sweep", "--config", CONF, "--seeds", "100000000"], 2),
        (["sweep", "--config", CONF, "rollout.groups=range(1,1000000000)"], 2),
    ],
)
def test_help_and_a_config_error_import_no_torch_transformers_or_lightning(args, code):
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ragen_lit", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    heavy = sorted(name for name in imported if name.split(".")[0] in HEAVY)
    assert not heavy, heavy[:10]
