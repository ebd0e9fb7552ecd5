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


def _file(tmp_path: Path, name: str, text: str = "not a checkpoint") -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _fake_run(tmp_path: Path) -> str:
    """A run folder as `evaluate` recognises one (a checkpoint and run.json); nothing reads their contents before the
    refusals these cases test."""
    _file(tmp_path, "a-run/checkpoints/last.ckpt")
    _file(tmp_path, "a-run/run.json", "{}")
    return str(tmp_path / "a-run")


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
    # sizes: the episodes x samples of the one rollout call, against the host bound fit keeps for its iteration
    "samples no machine holds": (
        ["--model", "tiny", "--samples", "1000000000"],
        "--samples 1000000000 x validation.num_envs=64 (the default --episodes) = 64000000000 episodes of up to "
        "rollout.max_context_tokens=2048 tokens need up to 7,812,500 GiB of host memory",
    ),
    "episodes no machine holds": (
        ["--model", "tiny", "--episodes", "2000000000"],
        "--episodes 2000000000 x --samples 1 = 2000000000 episodes of up to rollout.max_context_tokens=2048 tokens",
    ),
    "episodes past the largest seed": (["--model", "tiny", "--episodes", "4294967290"], "use at most --episodes "),
    # the model: a file that is no checkpoint, a checkpoint outside its run, a run's model overridden
    "file that is no checkpoint": (
        lambda tmp: ["--model", _file(tmp, "notes.txt")],
        "notes.txt': a file that is not a checkpoint (*.ckpt); give a run folder or checkpoint, a model folder",
    ),
    "checkpoint outside its run": (
        lambda tmp: ["--model", _file(tmp, "lone/x.ckpt")],
        "x.ckpt': no run.json in ",
    ),
    "model preset over a run": (
        lambda tmp: ["--model", _fake_run(tmp), "model=smollm2-135m"],
        "model=smollm2-135m: --model ",
    ),
    "model key over a run's checkpoint": (
        lambda tmp: ["--model", str(Path(_fake_run(tmp)) / "checkpoints" / "last.ckpt"), "model.dtype=float32"],
        "names a run, and a run is evaluated with its own model (the model section of ",
    ),
    # where it writes: the report's path and the MLflow store, checked before any work
    "report under a file": (
        lambda tmp: ["--model", "tiny", "--out", _file(tmp, "a-file") + "/report.json"],
        "a-file is a file, not a folder",
    ),
    "report deep under a file": (
        lambda tmp: ["--model", "tiny", "--out", _file(tmp, "a-file") + "/x/y/report.json"],
        "a-file is a file, not a folder",
    ),
    "corrupt store": (
        lambda tmp: ["--model", "tiny", f"logging.tracking_uri=sqlite:///{_file(tmp, 'bad.db', 'x' * 2048)}"],
        "bad.db is not a readable sqlite database",
    ),
}


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_in_one_line_before_any_work(case, tmp_path, capsys):
    args, named = BAD[case]
    args = args(tmp_path) if callable(args) else [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = tmp_path / "out"
    before = _tree(tmp_path)
    assert main(["evaluate", *args, f"logging.output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and named in err, err
    assert _tree(tmp_path) == before  # nothing written: no report, no store, no folder


def test_a_seed_file_this_machine_cannot_play_is_refused_without_reading_it_all(tmp_path, monkeypatch, capsys):
    """With 1 MiB available, 8 episodes of 2048 tokens fit (128 KiB each): a file of 1000 seeds is refused after its
    ninth, and at --samples 3 after its third."""
    from ragen_lit.run import bounds

    monkeypatch.setattr(bounds, "available_memory", lambda: 1024**2)
    seeds = _seed_file(tmp_path, "\n".join(map(str, range(1000))))
    before = _tree(tmp_path)
    for samples, most in (("1", "8 seeds"), ("3", "2 seeds")):
        args = ["evaluate", "--model", "tiny", "--episodes-file", seeds, "--samples", samples]
        assert main([*args, f"logging.output_dir={tmp_path / 'out'}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"error: --episodes-file {seeds} (more than " in err, err
        assert f"x --samples {samples} = " in err and f"give at most {most} in the file" in err, err
    assert main(["evaluate", "--model", "tiny", "--episodes", "4", "--samples", "3", "logging.output_dir=x"]) == 2
    assert capsys.readouterr().err.endswith("; use at most --samples 2\n")
    assert _tree(tmp_path) == before


def test_an_unwritable_report_folder_is_refused_before_any_work(tmp_path, capsys, make_unwritable):
    locked = tmp_path / "locked"
    locked.mkdir()
    make_unwritable(locked)
    for out, key in (
        (["--out", str(locked / "report.json")], f"--out {locked / 'report.json'}"),
        ([], f"logging.output_dir='{locked}' (the report's folder without --out)"),
    ):
        assert main(["evaluate", "--model", "tiny", *out, f"logging.output_dir={locked}"]) == 2
        assert capsys.readouterr().err == f"error: {key}: cannot write in {locked} (Permission denied)\n"
    assert list(locked.iterdir()) == []


def test_the_report_is_written_before_anything_is_logged(tmp_path, monkeypatch):
    """MLflow never holds an evaluation whose report is missing: a report that cannot be written stops the logging,
    and a written one gets the MLflow runs' ids once they are logged."""
    from types import SimpleNamespace

    from ragen_lit.evaluation import record

    steps = []
    monkeypatch.setattr(record, "log_evaluation", lambda *args: steps.append("log") or ("uri", "id"))
    evaluated = SimpleNamespace(description="tiny", iteration=None, device="cpu")
    results = [(None, SimpleNamespace(to_json=lambda: {"env": "frozenlake"}))]
    path = tmp_path / "report.json"
    assert record.log_evaluations(path, "tiny", None, evaluated, results, ["uri"]) == [("uri", "id")]
    assert steps == ["log"] and json.loads(path.read_text())["mlflow"] == [{"tracking_uri": "uri", "run_id": "id"}]

    def full_disk(path, report):
        raise OSError(28, "No space left on device")

    steps.clear()
    monkeypatch.setattr(record, "write_report", full_disk)
    with pytest.raises(OSError):
        record.log_evaluations(tmp_path / "other.json", "tiny", None, evaluated, results, ["uri"])
    assert steps == []
