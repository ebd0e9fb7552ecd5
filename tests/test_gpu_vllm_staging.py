"""`scripts/gpu_vllm.sh` carries a wheelhouse to a host part by part: each part arrives in an upload of its own (the
folder of an earlier upload gone), is checked and staged, and `install` puts the wheels back together and installs
them. Run here with a made-up wheel whose payload spans several parts. Its `check` runs here with a stand-in for
Python that plays each step's program (a failure, a hang, a crash after some iterations), so that what the check does
with them is seen: every step runs, the deadline holds, and the table and the files it leaves say what happened."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT, WHEELS = ROOT / "scripts/gpu_vllm.sh", ROOT / "scripts/gpu_vllm_wheels.txt"
REPORT = ROOT / "scripts/gpu_vllm_report.py"


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
    """A bare copy of the files the script needs, as a checkout would hold them."""
    (folder / "scripts").mkdir(parents=True)
    for path in (SCRIPT, WHEELS, REPORT):
        shutil.copy(path, folder / "scripts")
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


# Python's stand-in for `check`: each step's program as the check calls it, the real interpreter for the rest (the
# report script). The weight-sync tests fail, the fit tests hang, the fit dies after logging iterations 0-10, the
# evaluation of what it left passes, the vLLM benchmark hangs after its first iteration (the HF one gets no time left).
STUB = r"""#!/usr/bin/env bash
case "$*" in
"-")
    cat >/dev/null
    echo "import: vllm 0.25.0, torch 2.11.0+cu130 (CUDA 13.0), transformers 5.24.0; NVIDIA H200, 138 of 139 GiB free"
    echo "missing: hypothesis" ;;
*"-m pytest"*test_vllm_sync.py*)
    echo "SKIPPED [1] tests/engines/test_vllm_sync.py:351: two ranks on CUDA need two GPUs (one engine per rank)"
    echo "vLLM sleep level 2 freed 2.05, 2.01 GiB (KV cache 2.00 GiB)"
    echo "FAILED tests/engines/test_vllm_sync.py::test_vllm_scores_as_the_lora_policy - AssertionError: assert 0.3"
    echo "=========== 1 failed, 4 passed, 1 skipped in 3.10s ==========="
    exit 1 ;;
*"-m pytest"*test_vllm_fit.py*)
    echo "collecting ..."
    sleep 100 ;;
*"-m ragen_lit fit"*)
    run="$WORK/fit/vllm-fit-stub"
    mkdir -p "$run" && echo '{"config": {}}' >"$run/run.json"
    REAL "$STUB_DIR/metrics.py" "$WORK/fit/mlruns.db"
    echo "Traceback (most recent call last):"
    echo "RuntimeError: out of memory while vLLM generated 1024 sequences"
    exit 1 ;;
*"-m ragen_lit evaluate"*)
    echo '{"environments": [{"success": 0.45, "success_low": 0.42, "success_high": 0.48, "seeds": [1, 2, 3, 4],
        "seconds": 12.0}]}' >"$WORK/evaluate.json" ;;
*"scripts/bench_step.py"*"rollout.engine=vllm"*)
    echo "[bench    61.2s] iteration 0: generation 48.31s, prepare 2.10s, update 30.02s"
    sleep 100 ;;
*"scripts/bench_step.py"*)
    echo "the HF benchmark must get no time"; exit 3 ;;
*)
    exec REAL "$@" ;;
esac
"""

# the fit's MLflow store as the stand-in leaves it: one run's metrics, iterations 0-10
METRICS = """import sys
from mlflow.tracking import MlflowClient
client = MlflowClient(tracking_uri=f"sqlite:///{sys.argv[1]}")
run = client.create_run(client.create_experiment("fit")).info.run_id
rows = [("val/success", 0.40, 0), ("val/success", 0.45, 10)]
rows += [("rollout/logprob_gap", 0.001 * (1 + i % 2), i) for i in range(1, 11)]
rows += [("rollout/success", 0.3, i) for i in range(1, 11)]
for key, value, step in rows:
    client.log_metric(run, key, value, step=step)
"""


def test_check_runs_every_step_within_its_deadline_and_tables_what_each_did(tmp_path):
    host = checkout(tmp_path / "host")
    stub_dir = tmp_path / "stub"
    stub_dir.mkdir()
    (stub_dir / "metrics.py").write_text(METRICS)
    python = stub_dir / "python"
    python.write_text(STUB.replace("REAL", sys.executable))
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    # the GPU's memory in use, as the check samples it while the lanes run (its sampler must not hold the check up)
    smi = stub_dir / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\necho 40960\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    out, work = tmp_path / "out", tmp_path / "work"
    env = {
        "PATH": f"{stub_dir}:{os.environ['PATH']}",
        "PYTHON": str(python),
        "STUB_DIR": str(stub_dir),
        "VLLM_SITE": str(tmp_path / "site"),
        "VLLM_CHECK_DIR": str(work),
        "OUT": str(out),
        # the steps that end by themselves (each a python start and a report) need a few seconds of it on a slow or
        # busy CPU; the two that hang take the rest
        "VLLM_CHECK_SECONDS": "30",
        "RAGEN_LIT_COMMIT": "abc1234",
    }
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "scripts/gpu_vllm.sh", "check"],
        cwd=host,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert 29 <= took < 30 + 12, took  # the hanging steps were stopped at the deadline, not at their own limits
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == "| step | result | seconds | key figures |"
    table = {row.split(" | ")[0].removeprefix("| "): row.split(" | ")[1:] for row in rows[1:]}
    assert list(table) == [
        "1. import vllm, torch; the CUDA device",
        "2. vLLM tests on CUDA: weight sync, LoRA, sleep/wake",
        "2. vLLM tests on CUDA: fit and evaluate",
        "3. fit conf/frozenlake.yaml rollout.engine=vllm, 20 iterations",
        "3. evaluate that run, rollout.engine=vllm",
        "4. bench_step.py, HF engine",
        "4. bench_step.py, vLLM engine",
    ]
    (imported, tests, fit_tests, fit, evaluate, bench_hf, bench_vllm) = table.values()
    assert imported[0] == "pass" and "vllm 0.25.0" in imported[2] and "missing: hypothesis" in imported[2]
    assert tests[0] == "FAIL (exit 1)"
    assert tests[2].startswith("1 failed, 4 passed, 1 skipped in 3.10s; failed: test_vllm_scores_as_the_lora_policy")
    assert "skipped: two ranks on CUDA need two GPUs" in tests[2] and "sleep level 2 freed 2.05, 2.01 GiB" in tests[2]
    assert fit_tests[0].startswith("TIMEOUT after ") and fit_tests[2].endswith("last line: collecting ... |")
    # the fit died: what it logged before still reads, and the evaluation of its run ran all the same
    assert fit[0] == "FAIL (exit 1)"
    assert fit[2].startswith("val success 0.400 (it 0) → 0.450 (it 10), +0.050; 10 iterations trained; log-prob gap")
    assert evaluate[0] == "pass" and evaluate[2].startswith("success 0.450 [0.420, 0.480] over 4 episodes in 12 s")
    assert bench_vllm[0].startswith("TIMEOUT after ") and "iteration 0: generation 48.31s" in bench_vllm[2]
    assert bench_hf[0] == "skipped: no time left"
    assert "4 bench_step.py, HF engine" not in done.stdout  # never started
    # what comes back: the table, every step's last lines, the results, the fit's curves and the evaluation
    assert sorted(p.name for p in out.iterdir()) == [
        "check.log",
        "evaluate.json",
        "fit.json",
        "results.tsv",
        "summary.md",
    ]
    assert "| 3. evaluate that run, rollout.engine=vllm | pass |" in (out / "summary.md").read_text()
    assert (out / "summary.md").read_text().startswith("vLLM check of commit abc1234, ")
    assert "; peak GPU memory in use 40 GiB (nvidia-smi, all processes)" in (out / "summary.md").read_text()
    log = (out / "check.log").read_text()
    assert "===== 3. fit conf/frozenlake.yaml rollout.engine=vllm, 20 iterations: FAIL (exit 1);" in log
    assert "RuntimeError: out of memory while vLLM generated 1024 sequences" in log
    curves = json.loads((out / "fit.json").read_text())
    assert curves["val_success"] == [[0, 0.4], [10, 0.45]] and len(curves["logprob_gap"]) == 10


def test_check_refuses_a_work_folder_that_is_not_empty_and_a_missing_install(tmp_path):
    host = checkout(tmp_path / "host")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "old.log").write_text("")
    env = {"VLLM_SITE": str(tmp_path / "site"), "VLLM_CHECK_DIR": str(tmp_path / "work")}
    busy = run(host, "check", env=env)
    assert busy.returncode == 2 and f"VLLM_CHECK_DIR={tmp_path / 'work'} is not empty" in busy.stderr
    out = tmp_path / "out"
    bare = run(host, "check", env={**env, "VLLM_CHECK_DIR": str(tmp_path / "new"), "OUT": str(out)})
    assert bare.returncode == 2 and "no vLLM in" in bare.stderr
    assert "run 'install' first" in (out / "summary.md").read_text()  # what comes back says why


def test_report_reads_a_benchmarks_json(tmp_path):
    import gpu_vllm_report

    result = {
        "step": {"step_s": 5.653, "generation_s": 1.741, "update_s": 2.587},
        "throughput": {"generation_tokens_per_s": 36748.0},
        "roofline": {"tokens_per_s": 241070.0},
        "peak_memory_gib": {"generation": 18.3, "update": 49.7},
        "per_iteration": [{"generation": 17.66}, {"generation": 1.7}],
    }
    (tmp_path / "bench_hf.json").write_text(json.dumps(result))
    figures = gpu_vllm_report.figures("bench-hf", tmp_path / "none.log", tmp_path)
    assert figures == (
        "step 5.65 s (generation 1.74, update 2.59); generation 36,748 tokens/s = 15.2% of the bandwidth roofline; "
        "peak 49.7 GiB allocated; iteration 0 generation 17.7 s (start-up, compilation)"
    )
    assert gpu_vllm_report.figures("bench-vllm", tmp_path / "none.log", tmp_path) == "no output"
