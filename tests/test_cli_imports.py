"""`python -m ragen_lit --help`, a config that fails to load, and a refusal by the env registry or by this machine's
bounds answer without importing torch, transformers or Lightning: `-X importtime` lists every module the process
imported. (How long they take is measured by `scripts/bench_cli.py`, not asserted here: a test's wall time says more
about the machine's load than the code.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CONF = str(Path(__file__).resolve().parents[1] / "conf" / "frozenlake.yaml")
HEAVY = ("torch", "transformers", "lightning")


def _heavy_imports(args: list[str], code: int) -> tuple[list[str], str]:
    """(the heavy modules `python -m ragen_lit ARGS` imported, its stderr without the import times); its exit code
    must be `code`."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ragen_lit", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    heavy = sorted(name for name in imported if name.split(".")[0] in HEAVY)
    return heavy, "\n".join(line for line in lines if not line.startswith("import time:"))


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
    heavy, _ = _heavy_imports(args, code)
    assert not heavy, heavy[:10]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["fit", "--config", CONF, "env.name=chess"], "env.name='chess' is not a known environment; allowed: coding,"),
        (["fit", "--config", CONF, "env.options.size=100000"], "env.name=frozenlake then shows observations of up to"),
        (["fit", "--config", CONF, "trainer.threads=100000"], "trainer.threads=100000: this machine has"),
        (["fit", "--config", CONF, "rollout.groups=1000000000"], "rollout.groups=1000000000 x rollout.group_size=8 ="),
        (["config", "--config", CONF, "env.name=chess"], "env.name='chess' is not a known environment"),
        (["sweep", "--config", CONF, "env.name=frozenlake,chess"], "grid point 'env.name=chess': env.name='chess' is"),
        (["evaluate", "--model", "tiny", "--config", CONF, "env.name=chess"], "env.name='chess' is not a known"),
        (["warm-start", "--config", CONF, "--out", "unused", "env.name=chess"], "env.name='chess' is not a known"),
    ],
)
def test_a_refusal_by_the_env_registry_or_the_machines_bounds_imports_no_torch(args, error):
    """`fit`'s checks before training run before torch, Lightning and transformers are imported, and ask torch only
    for a GPU's facts (none of these refusals needs one), so they answer as fast as a config that fails to load."""
    heavy, err = _heavy_imports(args, 2)
    assert err.startswith("error: ") and err.count("\n") == 0 and error in err, err
    assert not heavy, heavy[:10]
