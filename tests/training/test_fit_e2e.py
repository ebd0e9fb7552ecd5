"""`fit` end to end on the tiny model: metrics reach MLflow, checkpoints exist, resume continues,
every algorithm preset and every shipped recipe trains, an all-empty filter stops the run cleanly,
2 gloo ranks train together with DDP and with FSDP (which also resumes)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch

from ragen_lit.cli import fit
from ragen_lit.config import load_config
from ragen_lit.run.provenance import source_commit, weights_sha256

# the engine and end-to-end paths CI also runs at the lowest declared dependency versions
pytestmark = pytest.mark.floors

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
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
]


def _cfg(tmp_path, model_dir, *extra, config="frozenlake.yaml"):
    return load_config(
        str(ROOT / "conf" / config), [f"model.path={model_dir}", f"logging.output_dir={tmp_path}", *SMALL, *extra]
    )


def _runs(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    return mlflow.search_runs(experiment_names=["ragen_lit"])


# The first-turn MI needs valid first-turn reasonings from at least two prompts in an iteration (else it is not logged).
# With 2 prompts x 4 rollouts, a tiny model trained on one CPU left a prompt without any in some iterations; 4 prompts
# make every iteration's scope all but certain to hold two.
MI_EVERY_ITERATION = "rollout.groups=4"


@pytest.mark.slow
def test_fit_logs_to_mlflow_checkpoints_and_resumes(tmp_path, tiny_model_dir):
    summary = fit(
        _cfg(
            tmp_path,
            tiny_model_dir,
            "trainer.iterations=2",
            "logging.save_rollouts=true",
            "trainer.checkpoint_every=1",
            MI_EVERY_ITERATION,
        )
    )
    assert summary["iterations"] == 2
    runs = _runs(tmp_path)
    assert len(runs) == 1
    row = runs.iloc[0]
    for key in (
        "rollout/success",
        "rollout/reward",
        "filter/kept_ratio",
        "val/success",
        "actor/entropy",
        "time/generation_s",
        "summary/val_success_final",
        "summary/wall_time_s",
        "collapse/valid_reasoning_rate",
    ):
        assert f"metrics.{key}" in runs.columns, key
    assert row["params.algo.name"] == "grpo" and row["params.filter.strategy"] == "top_p"
    precision = _cfg(tmp_path, tiny_model_dir).trainer.precision
    assert row["tags.ragen_lit.device"] == f"cpu, float32 weights, {precision}"  # where it ran, on record
    # what it was made from: the code's commit (this checkout's) and the weights it started from
    commit, dirty = source_commit()
    assert row["tags.ragen_lit.commit"] == commit and row["tags.ragen_lit.commit_dirty"] == str(dirty).lower()
    assert row["tags.ragen_lit.weights_sha256"] == weights_sha256(tiny_model_dir)
    # the MI diagnostics ran (diagnostics every iteration): first-turn retrieval accuracy and its chance level
    client = mlflow.tracking.MlflowClient()
    for key in ("collapse/first_turn/retrieval_acc", "collapse/first_turn/retrieval_chance"):
        values = [m.value for m in client.get_metric_history(row["run_id"], key)]
        assert len(values) == 2 and all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values), (key, values)
    chance = client.get_metric_history(row["run_id"], "collapse/first_turn/retrieval_chance")
    assert all(m.value > 0 for m in chance)
    run_dir = next(tmp_path.glob("frozenlake-grpo-*"))
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert len(list((run_dir / "checkpoints").glob("iter-*.ckpt"))) == 2
    rollouts = sorted((run_dir / "rollouts").glob("*.jsonl"))
    assert len(rollouts) == 2
    first = json.loads(rollouts[0].read_text().splitlines()[0])
    assert {"prompt", "reasoning", "group"} <= set(first) and first["prompt"].endswith("<think>")

    # resume: same run folder and MLflow run, continues at iteration 3
    fit(_cfg(tmp_path, tiny_model_dir, "trainer.iterations=3", "trainer.resume=last", MI_EVERY_ITERATION))
    runs = _runs(tmp_path)
    assert len(runs) == 1
    steps = sorted(m.step for m in client.get_metric_history(runs.iloc[0]["run_id"], "rollout/success"))
    assert steps == [1, 2, 3]

    # `diagnose` reads what `fit` wrote
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragen_lit",
            "diagnose",
            "--model",
            str(tiny_model_dir),
            "--rollouts",
            str(rollouts[-1]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "retrieval" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["ppo", "dapo", "grpo", "drgrpo"])
def test_every_algorithm_preset_trains(tmp_path, tiny_model_dir, preset):
    summary = fit(
        _cfg(
            tmp_path,
            tiny_model_dir,
            f"algo={preset}",
            "trainer.iterations=2",
            "filter.strategy=none",
            "validation.num_envs=0",
            "rollout.max_turns=1",
            "diagnostics.every_n_iterations=0",
        )
    )
    assert summary["iterations"] == 2
    row = _runs(tmp_path).iloc[0]
    assert row["params.algo.name"] == preset
    assert "metrics.actor/pg_loss" in row.index and row["metrics.actor/grad_norm"] >= 0
    assert ("metrics.critic/value_loss" in row.index) == (preset == "ppo")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["frozenlake.yaml", "sokoban.yaml"])
def test_gigpo_fits_on_the_envs_with_anchor_states(tmp_path, tiny_model_dir, config):
    summary = fit(
        _cfg(
            tmp_path,
            tiny_model_dir,
            "algo=gigpo",
            "trainer.iterations=2",
            "rollout.max_turns=3",
            "filter.strategy=none",
            "validation.num_envs=0",
            "diagnostics.every_n_iterations=0",
            config=config,
        )
    )
    assert summary["iterations"] == 2
    row = _runs(tmp_path).iloc[0]
    assert row["params.algo.name"] == "gigpo" and row["params.algo.advantage"] == "gigpo"
    assert "metrics.actor/pg_loss" in row.index and "metrics.critic/value_loss" not in row.index
    # 4 rollouts of a map all start in the same state: at least their first turns share an anchor state
    assert 0.0 < row["metrics.gigpo/anchored_step_fraction"] <= 1.0


@pytest.mark.slow
def test_dapo_fit_refills_the_batch_shapes_long_turns_and_logs_both(tmp_path, tiny_model_dir):
    """`algo=dapo` through `fit`: dynamic sampling's rounds and groups, and the overlong penalty, every iteration."""
    cfg = _cfg(
        tmp_path,
        tiny_model_dir,
        "algo=dapo",
        "trainer.iterations=2",
        "algo.max_sampling_rounds=3",
        "algo.overlong_cache_fraction=0.8",  # L_cache = 38 of the 48-token turn budget: turns over 10 tokens pay
        "validation.num_envs=0",
        "diagnostics.every_n_iterations=0",
    )
    assert fit(cfg)["iterations"] == 2
    row = _runs(tmp_path).iloc[0]
    assert "metrics.critic/value_loss" not in row.index  # group-relative advantages, no critic
    keys = ["sampling/rounds", "sampling/groups_generated", "sampling/groups_kept", "sampling/cap_hit"]
    _assert_logged_and_finite(row["run_id"], keys)
    rounds, generated, kept, cap_hit = (_history(row["run_id"], key) for key in keys)
    for it in range(2):
        assert 1 <= rounds[it] <= 3 and generated[it] == rounds[it] * cfg.rollout.groups
        assert kept[it] <= cfg.rollout.groups and cap_hit[it] == float(kept[it] < cfg.rollout.groups)
        assert cap_hit[it] or rounds[it] == 3 or kept[it] == cfg.rollout.groups
    # the filter saw the refilled batch: its groups are dynamic sampling's
    assert _history(row["run_id"], "filter/kept_count") <= kept
    penalties = _history(row["run_id"], "overlong/penalty_mean")
    rates = _history(row["run_id"], "overlong/penalised_turn_rate")
    assert len(penalties) == len(rates) == sum(k > 0 for k in kept) >= 1
    assert all(-cfg.rollout.max_turns <= p <= 0 for p in penalties) and all(0 <= r <= 1 for r in rates)
    assert min(penalties) < 0 and max(rates) > 0  # the tiny model's turns run past 10 tokens


def _history(run_id: str, key: str) -> list[float]:
    return [
        m.value for m in sorted(mlflow.tracking.MlflowClient().get_metric_history(run_id, key), key=lambda m: m.step)
    ]


def _assert_logged_and_finite(run_id: str, keys, iterations: int = 2) -> None:
    for key in keys:
        values = _history(run_id, key)
        assert len(values) == iterations and all(math.isfinite(v) for v in values), (key, values)


# the ablation paths through `fit` (2 iterations each): overrides, then the metrics each must log (finite, every
# iteration), and the filter.minibatch mode whose optimizer-step count the checkpoint must show (GRPO: one optimizer)
ABLATIONS = {
    "ppo_bilevel_gae_kl": (
        ["algo=ppo", "algo.advantage=bilevel_gae", "algo.kl_coef=0.05"],
        ["actor/kl", "critic/value_loss", "critic/value_mean", "actor/pg_loss"],
        None,
    ),
    "rloo_minibatch_scale": (
        ["algo.advantage=rloo", "filter.minibatch=scale", "filter.value=0.5"],
        ["actor/pg_loss"],
        "scale",
    ),
    "quartile_gradient_buckets_minibatch_fixed": (
        ["filter.strategy=quartile", "diagnostics.gradient_buckets=true", "filter.minibatch=fixed"],
        ["actor/pg_loss"],
        "fixed",
    ),
    "trajectory_level": (["filter.level=trajectory"], [], None),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ABLATIONS))
def test_ablation_paths_fit_and_log(tmp_path, tiny_model_dir, name):
    from ragen_lit.training.data import plan_minibatches

    overrides, keys, minibatch = ABLATIONS[name]
    diagnose = "diagnostics.gradient_buckets=true" in overrides
    cfg = _cfg(
        tmp_path,
        tiny_model_dir,
        "trainer.iterations=2",
        "trainer.checkpoint_every=1",
        "validation.num_envs=0",
        "rollout.groups=4",
        "rollout.max_turns=1",
        f"diagnostics.every_n_iterations={int(diagnose)}",
        *overrides,
    )
    assert fit(cfg)["iterations"] == 2
    row = _runs(tmp_path).iloc[0]
    for override in overrides:  # the run really used the ablation's settings
        key, value = override.split("=")
        assert str(row[f"params.{'algo.name' if key == 'algo' else key}"]).lower() == value, override
    _assert_logged_and_finite(row["run_id"], ["filter/kept_ratio", "filter/kept_count", *keys])
    kept_ratio = _history(row["run_id"], "filter/kept_ratio")
    assert all(0.0 < r <= 1.0 for r in kept_ratio), kept_ratio
    if diagnose:  # Fig. 3 bucket norms: task and regulariser, every bucket finite (whatever order the buckets have)
        for kind in ("task", "reg"):
            bucket_keys = [c[len("metrics.") :] for c in row.index if c.startswith(f"metrics.grad/{kind}_norm/q")]
            assert len(bucket_keys) >= 2, row.index.tolist()
            _assert_logged_and_finite(row["run_id"], bucket_keys)
    if minibatch is not None:  # optimizer steps = the mini-batches `plan_minibatches` makes of each iteration's rows
        K, total = cfg.rollout.group_size, cfg.rollout.groups * cfg.rollout.group_size
        kept_rows = [int(c) * K for c in _history(row["run_id"], "filter/kept_count")]
        plans = {
            mode: sum(len(plan_minibatches(k, total, 2, mode, 1, torch.Generator())) for k in kept_rows)
            for mode in ("scale", "fixed")
        }
        assert plans["scale"] != plans["fixed"], kept_rows  # the filter dropped rows, so the two modes differ
        checkpoint = next(tmp_path.glob("frozenlake-*")) / "checkpoints" / "last.ckpt"
        assert torch.load(checkpoint, weights_only=False)["global_step"] == plans[minibatch], (kept_rows, plans)


@pytest.mark.slow
def test_rollouts_in_bfloat16_from_float32_weights_show_in_the_logprob_gap(tmp_path, tiny_model_dir):
    """rollout.dtype=bfloat16 with float32 training weights: the engine samples from a bfloat16 copy, so its
    log-probs of the sampled tokens differ from the trainer's float32 ones (a small gap); without it they agree."""
    gaps = {}
    for dtype in ("null", "bfloat16"):
        out = tmp_path / dtype
        cfg = _cfg(out, tiny_model_dir, "model.dtype=float32", f"rollout.dtype={dtype}", "trainer.iterations=1",
                   "validation.num_envs=0", "diagnostics.every_n_iterations=0")  # fmt: skip
        assert fit(cfg)["iterations"] == 1
        (gaps[dtype],) = _history(_runs(out).iloc[0]["run_id"], "rollout/logprob_gap")
    assert gaps["null"] < 1e-3 < gaps["bfloat16"] < 0.1, gaps


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    sorted(
        str(p.relative_to(ROOT / "conf"))
        for p in [*(ROOT / "conf").glob("*.yaml"), *(ROOT / "conf").glob("collapse/*.yaml")]
    ),
)
def test_every_shipped_recipe_fits(tmp_path, tiny_model_dir, config):
    summary = fit(
        _cfg(
            tmp_path,
            tiny_model_dir,
            "trainer.iterations=1",
            "validation.num_envs=2",
            "diagnostics.num_samples=4",
            config=config,
        )
    )
    assert summary["iterations"] == 1


@pytest.mark.slow
def test_all_empty_filter_stops_cleanly(tmp_path, tiny_model_dir):
    # one rollout per group: every group has zero reward variance, linear top-p keeps nothing (PPO: a group
    # of one has no group-relative advantage, so GRPO refuses it)
    summary = fit(
        _cfg(
            tmp_path,
            tiny_model_dir,
            "algo=ppo",
            "rollout.group_size=1",
            "trainer.iterations=10",
            "filter.empty_stop_steps=2",
            "validation.num_envs=0",
        )
    )
    assert summary["iterations"] == 2
    row = _runs(tmp_path).iloc[0]
    assert row["metrics.filter/empty"] == 1.0 and "metrics.actor/pg_loss" not in row.index


FSDP = [
    "trainer.strategy=fsdp",
    "trainer.accelerator=cpu",
    "algo=ppo",
    "algo.kl_coef=0.01",
    "diagnostics.gradient_buckets=true",
]


DDP = ["trainer.strategy=ddp", "trainer.accelerator=cpu"]


def _probe_fit(tmp_path, model_dir, probe_dir, *extra, devices=2, settings=FSDP):
    """`fit` through tests/parallel/fsdp_fit_probe.py: returns what each rank recorded (see that script)."""
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "parallel" / "fsdp_fit_probe.py"),
        "fit",
        "--config",
        str(ROOT / "conf" / "frozenlake.yaml"),
        f"model.path={model_dir}",
        f"logging.output_dir={tmp_path}",
        *SMALL,
        *settings,
        f"trainer.devices={devices}",
        *extra,
    ]
    env = {**os.environ, "RAGEN_LIT_PROBE_DIR": str(probe_dir)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(probe_dir / f"rank{r}.pt", weights_only=False) for r in range(devices)]


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
def test_two_gloo_ranks_train_together(tmp_path, tiny_model_dir):
    """DDP, 4 groups on 2 ranks: both ranks end with the same trained weights (the ones checkpointed), and what is
    logged covers both ranks' groups (rollout means over all 16 rollouts, filter statistics over all 4 groups)."""
    from safetensors.torch import load_file

    ranks = _probe_fit(
        tmp_path, tiny_model_dir, tmp_path / "probe", "trainer.iterations=2", "rollout.groups=4", settings=DDP
    )
    runs = _runs(tmp_path)
    assert len(runs) == 1 and runs.iloc[0]["metrics.summary/iterations"] == 2
    run_dirs = list(tmp_path.glob("frozenlake-*"))
    assert len(run_dirs) == 1  # both ranks used rank 0's run folder
    end = ranks[0]["end"]["weights"]
    _assert_same_weights(end, ranks[1]["end"]["weights"])
    initial = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    assert any(not torch.equal(end[k], initial[k]) for k in initial)
    saved = torch.load(run_dirs[0] / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    for key, value in end.items():
        assert torch.equal(saved[f"policy.{key}"], value), key

    run_id = runs.iloc[0]["run_id"]
    logged = {key: _history(run_id, key) for key in ("rollout/reward", "filter/kept_count", "filter/reward_std_mean")}
    for it, (a, b) in enumerate(zip(ranks[0]["filter"], ranks[1]["filter"])):
        assert a["rows"] == b["rows"] == 8  # each rank rolled out its own 2 groups of 4
        assert a["stats"] == b["stats"] and a["kept_rows"] + b["kept_rows"] == int(a["stats"]["filter/kept_count"]) * 4
        rewards = torch.tensor(a["rewards"] + b["rewards"], dtype=torch.float64)
        assert logged["rollout/reward"][it] == pytest.approx(float(rewards.mean()))
        assert logged["filter/kept_count"][it] == a["stats"]["filter/kept_count"]
        stds = rewards.view(4, 4).std(dim=1)  # in-group std over all 4 groups (ddof=1)
        assert logged["filter/reward_std_mean"][it] == pytest.approx(float(stds.mean()))
    assert len(ranks[0]["filter"]) == len(logged["rollout/reward"]) == 2


@pytest.mark.slow
def test_two_gloo_ranks_fit_logs_the_single_process_mi_of_their_rollouts(tmp_path, tiny_model_dir):
    """A 2-rank DDP fit's logged MI diagnostics, iteration by iteration, are what one process computes on the union
    of both ranks' rollouts with the same weights (and the same EMA history).

    Not the values of a single-process *fit*: both deal the same env seeds, but the transformers engine draws one
    uniform per row and step from a generator seeded per `generate` call, so a row's tokens depend on the batch it
    is sampled in; a rank's half batch samples other tokens than the whole batch does, and the rollouts differ."""
    from ragen_lit.agent.chat import ChatFormat
    from ragen_lit.metrics.collapse import CollapseDiagnostics
    from ragen_lit.models import load_policy, load_tokenizer

    overrides = ["trainer.iterations=2", "rollout.groups=4", "validation.num_envs=0"]
    ranks = _probe_fit(tmp_path, tiny_model_dir, tmp_path / "probe", *overrides, settings=DDP)
    run_id = _runs(tmp_path).iloc[0]["run_id"]
    cfg = _cfg(tmp_path, tiny_model_dir, *overrides)
    collapse = CollapseDiagnostics(cfg.diagnostics)
    policy = load_policy(str(tiny_model_dir), "float32")
    chat = ChatFormat(load_tokenizer(str(tiny_model_dir)))
    assert len(ranks[0]["diagnostics"]) == len(ranks[1]["diagnostics"]) == 2
    for it, (a, b) in enumerate(zip(ranks[0]["diagnostics"], ranks[1]["diagnostics"])):
        assert a["iteration"] == b["iteration"] == it
        assert {t.group for t in a["trajectories"]} == {0, 2} and {t.group for t in b["trajectories"]} == {1, 3}
        _assert_same_weights(a["weights"], b["weights"])
        policy.load_state_dict(a["weights"])
        union = a["trajectories"] + b["trajectories"]
        expected = collapse.maybe_compute(policy, chat, union, it, cfg.rollout.temperature)
        assert 0 < expected["collapse/first_turn/num_rows"] <= cfg.diagnostics.num_samples  # N over both ranks
        assert a["values"].keys() == b["values"].keys() == expected.keys()
        for key, value in expected.items():
            if key.startswith("time/"):
                continue  # a clock: each process's own
            assert a["values"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (it, key)
            assert b["values"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (it, key)
            assert _history(run_id, key)[it] == pytest.approx(value, rel=1e-5, abs=1e-6), (it, key)


@pytest.mark.slow
def test_two_gloo_ranks_fsdp_train_and_resume(tmp_path, tiny_model_dir):
    """PPO (policy, critic, KL reference all sharded) with gradient buckets, 4 groups on 2 FSDP ranks."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    first = _probe_fit(tmp_path, tiny_model_dir, tmp_path / "probe1", "trainer.iterations=2", "rollout.groups=4")
    runs = _runs(tmp_path)
    assert len(runs) == 1 and runs.iloc[0]["metrics.summary/iterations"] == 2
    assert "metrics.critic/value_loss" in runs.columns and "metrics.grad/task_norm/q1" in runs.columns
    # one global keep decision: identical filter statistics on both ranks, kept rows add up to it
    assert len(first[0]["filter"]) == 2
    for a, b in zip(first[0]["filter"], first[1]["filter"]):
        assert a["stats"] == b["stats"]
        assert a["kept_rows"] + b["kept_rows"] == int(a["stats"]["filter/kept_count"]) * 4
    # the per-rank inference replicas are identical, trained, and hold the checkpointed policy
    end = first[0]["end"]["weights"]
    _assert_same_weights(end, first[1]["end"]["weights"])
    _assert_same_weights(first[0]["start"]["weights"], first[1]["start"]["weights"])
    initial = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    assert any(not torch.equal(end[k], initial[k]) for k in initial)
    assert first[0]["end"]["optimizer_step"] > 0
    last = next(tmp_path.glob("frozenlake-ppo-*")) / "checkpoints" / "last.ckpt"
    assert last.is_dir() and (last / "meta.pt").is_file()  # a distributed checkpoint folder
    dcp_to_torch_save(last, tmp_path / "full.pt")
    saved = torch.load(tmp_path / "full.pt", weights_only=False)["state_dict"]
    for key, value in end.items():
        assert torch.equal(saved[f"policy.{key}"], value), key

    # resume=last: restores weights and optimizer state, continues at iteration 3 in the same MLflow run
    second = _probe_fit(
        tmp_path, tiny_model_dir, tmp_path / "probe2", "trainer.iterations=3", "rollout.groups=4", "trainer.resume=last"
    )
    for rank in second:
        _assert_same_weights(rank["start"]["weights"], end)
        assert rank["start"]["optimizer_step"] == first[0]["end"]["optimizer_step"]
        assert rank["end"]["optimizer_step"] > rank["start"]["optimizer_step"] and len(rank["filter"]) == 1
    _assert_same_weights(second[0]["end"]["weights"], second[1]["end"]["weights"])
    runs = _runs(tmp_path)
    assert len(runs) == 1
    steps = sorted(
        m.step for m in mlflow.tracking.MlflowClient().get_metric_history(runs.iloc[0]["run_id"], "rollout/success")
    )
    assert steps == [1, 2, 3]


@pytest.mark.slow
def test_fsdp_on_one_rank_fits(tmp_path, tiny_model_dir):
    """trainer.strategy=fsdp with one device is a valid (unsharded) run, not an error."""
    (rank,) = _probe_fit(
        tmp_path,
        tiny_model_dir,
        tmp_path / "probe",
        "trainer.iterations=1",
        "validation.num_envs=0",
        "diagnostics.every_n_iterations=0",
        "diagnostics.gradient_buckets=false",
        "filter.strategy=none",
        devices=1,
    )
    assert rank["end"]["optimizer_step"] > 0
    assert _runs(tmp_path).iloc[0]["metrics.summary/iterations"] == 1
