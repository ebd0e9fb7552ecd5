"""`diagnostics.on_collapse`: the callback warns once per firing, logs collapse/alarm on diagnostics iterations
only, and with `stop` ends a real fit cleanly at the firing iteration, its checkpoint written and resumable."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch

from ragen_lit.cli import fit
from ragen_lit.config import Config, ConfigError, load_config
from ragen_lit.metrics.collapse import CollapseDiagnostics
from ragen_lit.training.alarm import CollapseAlarmCallback
from ragen_lit.training.callbacks import IterationLogger

ROOT = Path(__file__).resolve().parents[2]
ACC, CHANCE, H = (f"collapse/first_turn/{k}" for k in ("retrieval_acc", "retrieval_chance", "cond_entropy"))


def _entry(accuracy: float) -> dict[str, float]:
    return {ACC: accuracy, CHANCE: 0.1, H: 1.0}


class _Recorder:
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, metrics))


def _trainer(mode="warn", checkpoint_every=5, **diagnostics):
    cfg = Config()
    cfg.diagnostics.on_collapse, cfg.trainer.checkpoint_every = mode, checkpoint_every
    for key, value in diagnostics.items():
        setattr(cfg.diagnostics, key, value)
    saved = []
    trainer = SimpleNamespace(
        callbacks=[IterationLogger(cfg.filter.empty_stop_steps)],
        loggers=[_Recorder()],
        is_global_zero=True,
        should_stop=False,
        current_epoch=0,
        checkpoint_callback=SimpleNamespace(
            CHECKPOINT_NAME_LAST="last",
            last_model_path="",
            format_checkpoint_name=lambda metrics, name: f"ckpts/{name}.ckpt",
        ),
        save_checkpoint=lambda path: saved.append((trainer.current_epoch, str(path))),
    )
    return CollapseAlarmCallback(cfg.diagnostics, cfg.trainer.checkpoint_every), trainer, saved


def _iterations(callback, trainer, entries):
    for metrics in entries:
        trainer.callbacks[0].history.append({"iteration": trainer.current_epoch + 1, **metrics})
        callback.on_train_epoch_end(trainer, None)
        trainer.current_epoch += 1


def test_warn_logs_every_diagnostics_iteration_and_prints_once_until_it_clears(capsys):
    callback, trainer, saved = _trainer(collapse_baseline=1, collapse_window=1)
    # above chance: 0.8 (the baseline), no diagnostics, 0.1 (fires: <= 0.2 x 0.8), 0.0 (still on: no new line),
    # 0.7 (clears), 0.05 (fires again)
    _iterations(callback, trainer, [_entry(0.9), {}, _entry(0.2), _entry(0.1), _entry(0.8), _entry(0.15)])
    assert trainer.loggers[0].logged == [
        (step, {"collapse/alarm": value}) for step, value in [(1, 0.0), (3, 1.0), (4, 1.0), (5, 0.0), (6, 1.0)]
    ]
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert len(lines) == 2 and lines[0].startswith("warning: template collapse at iteration 3")
    assert "fell to 0.1 from 0.8" in lines[0] and "iteration 6" in lines[1]
    assert trainer.should_stop is False and saved == []


def test_stop_writes_last_unless_model_checkpoint_writes_this_iteration_and_off_does_nothing():
    one = {"collapse_baseline": 1, "collapse_window": 1}
    callback, trainer, saved = _trainer("stop", checkpoint_every=5, **one)
    _iterations(callback, trainer, [_entry(0.9), _entry(0.1)])
    assert trainer.should_stop is True and saved == [(1, "ckpts/last.ckpt")]
    assert trainer.checkpoint_callback.last_model_path == "ckpts/last.ckpt"
    callback, trainer, saved = _trainer("stop", checkpoint_every=2, **one)
    _iterations(callback, trainer, [_entry(0.9), _entry(0.1)])  # iteration 2: ModelCheckpoint's turn
    assert trainer.should_stop is True and saved == []
    callback, trainer, saved = _trainer("off", **one)
    _iterations(callback, trainer, [_entry(0.9), _entry(0.1)])
    assert trainer.loggers[0].logged == [] and trainer.should_stop is False


def test_the_callback_must_follow_iteration_logger():
    callback, trainer, _ = _trainer()
    with pytest.raises(RuntimeError, match="after IterationLogger"):
        callback.on_train_epoch_end(trainer, None)  # the logger has not recorded this iteration


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "diagnostics.on_collapse=halt",
            "diagnostics.on_collapse='halt' is not allowed; choose one of: warn, stop, off",
        ),
        ("diagnostics.collapse_window=0", "diagnostics.collapse_window=0 is out of range; it must be >= 1"),
        ("diagnostics.collapse_mi_fraction=1", "diagnostics.collapse_mi_fraction=1.0 is out of range; it must be < 1"),
        ("diagnostics.collapse_patience=2", "diagnostics.collapse_patience=2: this setting was removed"),
    ],
)
def test_bad_alarm_settings_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(str(ROOT / "conf" / "frozenlake.yaml"), [override])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_stop_ends_a_fit_at_the_firing_iteration_with_its_checkpoint_and_summary(tmp_path, tiny_model_dir, monkeypatch):
    compute = CollapseDiagnostics.maybe_compute

    def falling_mi(self, policy, chat, trajectories, iteration, temperature=1.0, **options):
        # the real diagnostics, with retrieval above chance forced down from 0.8 by 0.35 per iteration, H held
        real = compute(self, policy, chat, trajectories, iteration, temperature, **options)
        return {**real, ACC: 0.9 - 0.35 * iteration, CHANCE: 0.1, H: 2.0}

    monkeypatch.setattr(CollapseDiagnostics, "maybe_compute", falling_mi)
    small = [
        f"model.path={tiny_model_dir}",
        f"logging.output_dir={tmp_path}",
        "rollout.groups=2",
        "rollout.group_size=4",
        "rollout.max_turns=1",
        "rollout.max_new_tokens=32",
        "validation.num_envs=0",
        "trainer.threads=1",
        "diagnostics.every_n_iterations=1",
        "diagnostics.num_samples=4",
        "diagnostics.trajectory=false",
        "optim.micro_batch_size=4",
        "diagnostics.on_collapse=stop",
        "diagnostics.collapse_baseline=1",
        "diagnostics.collapse_window=1",
    ]
    # above chance 0.8 (the baseline), 0.45, 0.1 at iterations 1-3: 0.1 <= 0.2 x 0.8 fires at iteration 3 of 6;
    # ModelCheckpoint saves at iteration 2 only, so without the alarm's own save last.ckpt would hold iteration 2
    summary = fit(
        load_config(
            str(ROOT / "conf" / "frozenlake.yaml"), [*small, "trainer.iterations=6", "trainer.checkpoint_every=2"]
        )
    )
    assert summary["iterations"] == 3
    checkpoints = next(tmp_path.glob("frozenlake-*")) / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["iter-0002.ckpt", "last.ckpt"]
    state = torch.load(checkpoints / "last.ckpt", weights_only=False)
    alarm = state["callbacks"]["CollapseAlarmCallback"]
    assert state["epoch"] == 2 and alarm["on"] is True
    assert (alarm["base"], alarm["recent"]) == ([pytest.approx([0.8, 2.0])], [pytest.approx([0.1, 2.0])])
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = mlflow.search_runs(experiment_names=["ragen_lit"]).iloc[0]
    history = mlflow.tracking.MlflowClient().get_metric_history(run["run_id"], "collapse/alarm")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.0), (2, 0.0), (3, 1.0)]
    assert run["metrics.summary/iterations"] == 3

    # resume: the restored baseline keeps the alarm on at iteration 4 (a fresh one would take that iteration as its
    # baseline), which is no new firing, so the run goes on to its end
    summary = fit(
        load_config(str(ROOT / "conf" / "frozenlake.yaml"), [*small, "trainer.iterations=4", "trainer.resume=last"])
    )
    assert summary["iterations"] == 4
    history = mlflow.tracking.MlflowClient().get_metric_history(run["run_id"], "collapse/alarm")
    assert sorted((m.step, m.value) for m in history)[-1] == (4, 1.0)
