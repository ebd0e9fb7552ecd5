"""Resume rules (`run.folder`): a finished run resumed says so and changes nothing; a changed config is refused
with one line unless `trainer.resume_allow_changes=true`, which records the change (run.json, MLflow tags) and trains
on; `trainer.iterations` may grow without it; the summary covers the whole run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ragen_lit.cli import fit, main
from ragen_lit.config import load_config, to_dict
from ragen_lit.errors import ConfigError
from ragen_lit.run.folder import check_resume, config_changes

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "rollout.groups=2",
    "rollout.group_size=4",
    "rollout.max_turns=1",
    "rollout.max_new_tokens=32",
    "validation.num_envs=2",
    "validation.every_n_iterations=1",
    "diagnostics.every_n_iterations=0",
    "optim.num_minibatches=2",
    "optim.micro_batch_size=4",
    "trainer.threads=1",
    "trainer.checkpoint_every=1",
]


def _overrides(out: Path, model_dir, *extra) -> list[str]:
    return [f"model.path={model_dir}", f"logging.output_dir={out}", *SMALL, *extra]


def _cfg(out: Path, model_dir, *extra):
    return load_config(str(ROOT / "conf" / "frozenlake.yaml"), _overrides(out, model_dir, *extra))


def _saved(cfg) -> dict:
    """run.json's record of a run started with `cfg`."""
    return {"config": json.loads(json.dumps(to_dict(cfg), default=str))}


def test_only_the_runs_own_keys_count_as_changes_and_a_change_needs_the_flag(tmp_path):
    run = load_config(None, ["rollout.groups=4"])
    info = _saved(run)
    runtime = ["trainer.resume=last", "trainer.threads=3", "trainer.checkpoint_every=7", "logging.save_rollouts=true"]
    same = load_config(None, ["rollout.groups=4", "trainer.iterations=40", *runtime])
    assert config_changes(to_dict(same), info) == {"trainer.iterations": [20, 40]}
    growing = check_resume(to_dict(same), same.trainer, tmp_path, info)
    assert growing == {"trainer.iterations": [20, 40]}  # growing a run needs no flag
    changed = load_config(None, ["rollout.groups=8", "trainer.resume=last"])
    with pytest.raises(ConfigError) as err:
        check_resume(to_dict(changed), changed.trainer, tmp_path, info)
    message = str(err.value)
    assert "\n" not in message and "rollout.groups=8" in message and "rollout.groups=4" in message
    assert "trainer.resume_allow_changes=true" in message
    allowed = load_config(None, ["rollout.groups=8", "trainer.resume=last", "trainer.resume_allow_changes=true"])
    assert check_resume(to_dict(allowed), allowed.trainer, tmp_path, info) == {"rollout.groups": [4, 8]}
    assert config_changes(to_dict(changed), {}) == {}  # a run.json without a config (older runs) compares nothing


def _rows(out: Path) -> tuple[MlflowClient, object, list[tuple[str, int, float]]]:
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ragen_lit").experiment_id])
    rows = [(k, m.step, m.value) for k in run.data.metrics for m in client.get_metric_history(run.info.run_id, k)]
    return client, run, sorted(rows)


@pytest.mark.slow
def test_a_finished_run_says_so_and_a_changed_config_is_refused_or_recorded(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "runs"
    first = fit(_cfg(out, tiny_model_dir, "trainer.iterations=2"))
    (run_json,) = out.glob("frozenlake-*/run.json")
    (summary_json,) = (out / "artifacts").glob("*/artifacts/summary.json")
    before = run_json.read_text(), summary_json.read_text(), _rows(out)[2]
    capsys.readouterr()

    # finished: says so, returns the stored summary, writes nothing
    again = fit(_cfg(out, tiny_model_dir, "trainer.iterations=2", "trainer.resume=last"))
    assert "already finished at iteration 2" in capsys.readouterr().out
    assert again == json.loads(json.dumps(first)) and again["iterations"] == 2
    assert (run_json.read_text(), summary_json.read_text(), _rows(out)[2]) == before

    # a changed config: one line, exit 2, nothing written
    refused = _overrides(out, tiny_model_dir, "trainer.iterations=3", "rollout.groups=3", "trainer.resume=last")
    code = main(["fit", "--config", str(ROOT / "conf" / "frozenlake.yaml"), *refused])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "rollout.groups=3" in err and "Traceback" not in err
    assert (run_json.read_text(), summary_json.read_text(), _rows(out)[2]) == before

    # allowed: trains on, the change is recorded; MLflow params keep the first values (they cannot change)
    grown = fit(
        _cfg(
            out,
            tiny_model_dir,
            "trainer.iterations=3",
            "rollout.groups=3",
            "trainer.resume=last",
            "trainer.resume_allow_changes=true",
        )
    )
    info = json.loads(run_json.read_text())
    assert info["resumes"][-1]["changes"] == {"rollout.groups": [2, 3], "trainer.iterations": [2, 3]}
    assert info["config"]["rollout"]["groups"] == 3 and info["finished"]["iteration"] == 3
    client, run, rows = _rows(out)
    assert run.data.tags["config_change/rollout.groups"] == "2 -> 3" and run.data.params["rollout.groups"] == "2"
    # the summary covers all 3 iterations, not only the resumed one
    rewards = [value for key, step, value in rows if key == "rollout/reward"]
    assert len(rewards) == 3 and grown["train_reward_mean"] == pytest.approx(sum(rewards) / 3)
    assert grown["val_success_initial"] == next(v for k, s, v in rows if k == "val/success" and s == 0)
    assert sorted(s for k, s, _ in rows if k == "val/success") == [0, 1, 2, 3]  # no extra validation point

    # the run now follows rollout.groups=3: resuming with it is no change, and the run is finished again
    fit(_cfg(out, tiny_model_dir, "trainer.iterations=3", "rollout.groups=3", "trainer.resume=last"))
    assert "already finished at iteration 3" in capsys.readouterr().out
