"""`python -m ragen_lit evaluate` end to end: the report's numbers agree with each other and with MLflow, an
evaluation of a run's final checkpoint plays its final validation again (same maps, weights and sampling seed, same
success), `compare` shows it beside the run, and bad input ends in one line before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.cli import main

TINY = ["--model", "tiny", "trainer.threads=1", "rollout.max_turns=2", "rollout.max_new_tokens=32"]


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


def _runs(store: Path, role: str | None = None):
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments)
    return [r for r in runs if role is None or r.data.tags.get("ragen_lit.role") == role]


def test_a_preset_is_evaluated_with_pass_at_k_and_logged(tmp_path, capsys):
    out = tmp_path / "report.json"
    args = ["evaluate", "--config", CONFIG, *TINY, "--episodes", "3", "--samples", "3", "--temperature", "1.0"]
    # a config that trains on many devices still evaluates in one process on one
    assert main([*args, "--out", str(out), f"logging.output_dir={tmp_path}", "trainer.devices=4096"]) == 0
    printed = capsys.readouterr().out
    (env,) = _report(out)["environments"]
    assert env["env"] == "frozenlake" and env["seeds"] == [123, 124, 125] and env["samples"] == 3
    assert len(env["successes"]) == 3 and all(0 <= c <= 3 for c in env["successes"])
    assert env["success"] == pytest.approx(sum(env["successes"]) / 9)
    assert env["pass_at"]["1"] == pytest.approx(env["success"])
    assert env["pass_at"]["1"] <= env["pass_at"]["2"] <= env["pass_at"]["3"]
    assert env["pass_at"]["3"] == pytest.approx(sum(c > 0 for c in env["successes"]) / 3)
    assert env["success_low"] <= env["success"] <= env["success_high"]
    assert 3 <= env["effective_episodes"] <= 9
    assert set(env["rates"]) >= {"format_ok_rate", "valid_turn_rate", "num_turns", "response_tokens"}
    assert list(env["pass_at_interval"]) == ["1", "2", "3"]
    for k in ("1", "2", "3"):
        low, high = env["pass_at_interval"][k]
        assert low - 1e-9 <= env["pass_at"][k] <= high + 1e-9
        assert f"pass@{k}           {env['pass_at'][k]:.3f}  [{low:.3f}, {high:.3f}]" in printed
    (run,) = _runs(tmp_path / "mlruns.db", "evaluation")
    assert run.data.tags["point"] == "tiny (evaluation on frozenlake: 3 episodes x 3, T=1)"
    assert run.data.metrics["eval/success"] == pytest.approx(env["success"])
    assert run.data.metrics["eval/pass_at_3"] == pytest.approx(env["pass_at"]["3"])
    assert run.data.metrics["eval/pass_at_3_low"] == pytest.approx(env["pass_at_interval"]["3"][0])
    assert run.data.metrics["eval/pass_at_3_high"] == pytest.approx(env["pass_at_interval"]["3"][1])
    assert run.data.params["evaluate.samples"] == "3"
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_evaluating_a_run_replays_its_final_validation(tmp_path, capsys):
    out = tmp_path / "runs"
    fit = ["fit", "--config", CONFIG, *SMALL, "validation.num_envs=8", "trainer.iterations=2", "optim.actor_lr=5e-3"]
    assert main([*fit, f"logging.output_dir={out}"]) == 0
    (run_dir,) = [p for p in out.iterdir() if (p / "run.json").is_file()]
    final = json.loads((run_dir / "run.json").read_text())["finished"]["summary"]["val_success_final"]
    capsys.readouterr()

    assert main(["evaluate", "--model", str(run_dir)]) == 0  # the run's own config, store and validation
    assert "iteration 2" in capsys.readouterr().out
    (report_file,) = (run_dir / "evaluations").glob("eval-*.json")
    report = _report(report_file)
    (env,) = report["environments"]
    assert report["iteration"] == 2 and env["seeds"] == list(range(123, 131))
    assert env["success"] == final
    (evaluation,) = _runs(out / "mlruns.db", "evaluation")
    (training,) = [r for r in _runs(out / "mlruns.db") if r.info.run_id != evaluation.info.run_id]
    assert evaluation.data.tags["ragen_lit.evaluated_run_id"] == training.info.run_id
    label = f"{training.info.run_name} (evaluation on frozenlake at iteration 2: 8 episodes x 1, T=0.5)"
    assert evaluation.data.tags["point"] == label
    # not the success rate alone: every episode statistic of the final validation comes back exactly
    for key in ("format_ok_rate", "valid_turn_rate", "num_turns", "response_tokens", "sequence_tokens"):
        assert env["rates"][key] == training.data.metrics[f"val/{key}"], key

    # a checkpoint file and an explicit config give the same episodes; K samples at another temperature
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    again = tmp_path / "again.json"
    args = ["evaluate", "--model", str(ckpt), "--config", CONFIG, "--samples", "2", "--temperature", "1.0"]
    assert main([*args, "--out", str(again), "validation.num_envs=8", "trainer.threads=1"]) == 0
    (sampled,) = _report(again)["environments"]
    assert sampled["seeds"] == env["seeds"] and sampled["samples"] == 2

    capsys.readouterr()
    assert main(["compare", str(out), "--collapse", "--out", str(tmp_path / "compare")]) == 0
    table, readings = capsys.readouterr().out.split("Template collapse, run by run")
    # the replay and the sampled evaluation differ in K and T: two rows, not one row of two "seeds"
    assert "eval success" in table and f"| {label} | 1 |" in table
    assert f"{training.info.run_name} (evaluation on frozenlake at iteration 2: 8 episodes x 2, T=1) | 1 |" in table
    assert "(evaluation on" not in readings  # no training curves: not read for collapse


def _seed_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "seeds.txt"
    path.write_text(text)
    return str(path)


def _model_folder_without_config(tmp_path: Path) -> str:
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    return str(folder)


def _run_without_checkpoints(tmp_path: Path) -> str:
    run = tmp_path / "a-run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    return str(run)


def _dtype_config(tmp_path: Path) -> str:
    path = tmp_path / "bf16.yaml"
    path.write_text("model:\n  dtype: bfloat16\n")
    return path


# (arguments after `evaluate`, with {tmp} the test's folder, or a function of it; what the one line names)
BAD = {
    "no samples": (["--model", "tiny", "--samples", "0"], "--samples=0"),
    "greedy samples": (["--model", "tiny", "--samples", "2", "--temperature", "0"], "--temperature 0: greedy"),
    "negative temperature": (["--model", "tiny", "--temperature", "-1"], "--temperature=-1.0"),
    "episodes and file": (
        lambda tmp: ["--model", "tiny", "--episodes", "2", "--episodes-file", _seed_file(tmp, "1\n")],
        "--episodes and --episodes-file",
    ),
    "seed file missing": (["--model", "tiny", "--episodes-file", "{tmp}/none.txt"], "no such file"),
    "seed file bad line": (
        lambda tmp: ["--model", "tiny", "--episodes-file", _seed_file(tmp, "1\nmap-2\n")],
        "line 2: 'map-2' is not a seed",
    ),
    "seed file empty": (lambda tmp: ["--model", "tiny", "--episodes-file", _seed_file(tmp, "# none\n")], "no seed"),
    "missing model folder": (["--model", "{tmp}/no/such/model"], "no such folder"),
    "folder that is no model": (lambda tmp: ["--model", _model_folder_without_config(tmp)], "no config.json"),
    "run without checkpoints": (lambda tmp: ["--model", _run_without_checkpoints(tmp)], "no checkpoints"),
    "no validation episodes": (["--model", "tiny", "validation.num_envs=0"], "give --episodes N"),
    "report is a folder": (["--model", "tiny", "--out", "{tmp}"], "a folder; give the JSON file"),
    "configs disagree on the model": (
        lambda tmp: ["--model", "tiny", "--config", CONFIG, "--config", str(_dtype_config(tmp))],
        "model differs",
    ),
    "unknown key": (["--model", "tiny", "rollout.bogus=1"], "rollout.bogus: unknown key"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_in_one_line_before_any_work(case, tmp_path, capsys):
    args, named = BAD[case]
    args = args(tmp_path) if callable(args) else [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = tmp_path / "out"
    assert main(["evaluate", *args, f"logging.output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and named in err, err
    assert not (out / "mlruns.db").exists() and not (out / "evaluations").exists()
