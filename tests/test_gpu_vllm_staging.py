"""`scripts/gpu_vllm.sh` carries a wheelhouse to a host part by part: each part arrives in an upload of its own (the
folder of an earlier upload gone), is checked and staged, and `install` puts the wheels back together and installs
them. Run here with a made-up wheel whose payload spans several parts."""

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT, WHEELS = ROOT / "scripts/gpu_vllm.sh", ROOT / "scripts/gpu_vllm_wheels.txt"


def make_wheel(folder: Path, payload: bytes) -> Path:
    """A pure-Python wheel `stagedpkg` 1.0 holding `payload` as package data."""
    wheel = folder / "stagedpkg-1.0-py3-none-any.whl"
    files = {
        "stagedpkg/__init__.py": b"from pathlib import Path\nPAYLOAD = Path(__file__).with_name('payload.bin')\n",
        "stagedpkg/payload.bin": payload,
        "stagedpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: stagedpkg\nVersion: 1.0\n",
        "stagedpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "stagedpkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("stagedpkg-1.0.dist-info/RECORD", record)
    return wheel


def checkout(folder: Path) -> Path:
    """A bare copy of the two files the script needs, as a checkout would hold them."""
    (folder / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, folder / "scripts")
    shutil.copy(WHEELS, folder / "scripts")
    return folder


def run(folder: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/gpu_vllm.sh", *args],
        cwd=folder,
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def upload(here: Path, host: Path, part: int | None) -> Path:
    """A fresh folder on the host holding the checkout, the MANIFEST and (when given) one part, nothing else."""
    if host.exists():
        shutil.rmtree(host)
    checkout(host)
    (host / ".vllm").mkdir()
    shutil.copy(here / ".vllm/MANIFEST", host / ".vllm")
    if part is not None:
        shutil.copytree(here / f".vllm/part-{part}", host / f".vllm/part-{part}")
    return host


@pytest.fixture
def prepared(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    payload = os.urandom(2_500_000)  # incompressible: three parts of 1 MiB
    make_wheel(house, payload)
    here = checkout(tmp_path / "here")
    done = run(here, "prepare", "1", env={"VLLM_WHEELS_FROM": str(house)})
    assert done.returncode == 0, done.stderr
    return here, payload


def test_parts_staged_one_upload_at_a_time_install_the_wheels(tmp_path, prepared):
    here, payload = prepared
    manifest = (here / ".vllm/MANIFEST").read_text().split("\n")
    assert [line.split()[0] for line in manifest if line] == ["0", "1", "2"]
    env = {"VLLM_STAGE": str(tmp_path / "stage"), "VLLM_SITE": str(tmp_path / "site")}
    for part in (2, 0, 1):  # any order
        staged = run(upload(here, tmp_path / "host", part), "stage", str(part), env=env)
        assert staged.returncode == 0, staged.stderr
    installed = run(upload(here, tmp_path / "host", None), "install", env=env)
    assert installed.returncode == 0, installed.stderr
    probe = "import hashlib, stagedpkg; print(hashlib.sha256(stagedpkg.PAYLOAD.read_bytes()).hexdigest())"
    site = {**os.environ, "PYTHONPATH": env["VLLM_SITE"]}
    out = subprocess.run([sys.executable, "-c", probe], env=site, capture_output=True, text=True)
    assert out.stdout.strip() == hashlib.sha256(payload).hexdigest()


def test_a_missing_or_damaged_part_is_named_and_nothing_is_installed(tmp_path, prepared):
    here, _ = prepared
    env = {"VLLM_STAGE": str(tmp_path / "stage"), "VLLM_SITE": str(tmp_path / "site")}
    host = upload(here, tmp_path / "host", 1)
    with open(host / ".vllm/part-1/part", "r+b") as part:
        part.write(b"\0" * 16)
    damaged = run(host, "stage", "1", env=env)
    assert damaged.returncode == 2 and "stage 1: the part differs from the MANIFEST" in damaged.stderr
    assert run(upload(here, tmp_path / "host", 0), "stage", "0", env=env).returncode == 0
    absent = run(upload(here, tmp_path / "host", None), "stage", "2", env=env)
    assert absent.returncode == 2 and ".vllm/part-2/part is not here" in absent.stderr
    unknown = run(upload(here, tmp_path / "host", None), "stage", "7", env=env)
    assert unknown.returncode == 2 and "the MANIFEST has parts 0 1 2 and no 7" in unknown.stderr
    incomplete = run(upload(here, tmp_path / "host", None), "install", env=env)
    assert incomplete.returncode == 2 and "parts 1 2 are missing or damaged" in incomplete.stderr
    assert not (tmp_path / "site").exists()


def test_bad_arguments_get_one_line(tmp_path):
    here = checkout(tmp_path / "here")
    for args, message in (
        (["prepare", "0"], "prepare MIB: '0' is not a whole number of MiB above 0"),
        (["stage", "x"], "stage K: give the number of a part"),
        (["launch"], "give one of: prepare [MIB], stage K, install, check (not 'launch')"),
    ):
        done = run(here, *args, env={})
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
