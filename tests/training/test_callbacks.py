"""`IterationLogger`'s empty-filter stop rule and what the callbacks keep across a resume: the streak, the history,
the wall time and the validation results are their own checkpointed state."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ragen_lit.config import ValidationConfig
from ragen_lit.training.callbacks import IterationLogger, ValidationRollouts

LIMIT = 3  # filter.empty_stop_steps


def _iteration(logger: IterationLogger, empty: bool, epoch: int):
    trainer = SimpleNamespace(
        datamodule=SimpleNamespace(iteration_metrics={"filter/empty": float(empty)}),
        loggers=[],
        current_epoch=epoch,
        is_global_zero=True,
        should_stop=False,
    )
    module = SimpleNamespace(pop_step_stats=dict, device=torch.device("cpu"))
    logger.on_train_epoch_start(trainer, module)
    logger.on_train_epoch_end(trainer, module)
    return trainer.should_stop


def test_the_streak_counts_empty_iterations_in_a_row_and_a_kept_one_resets_it():
    logger = IterationLogger(LIMIT)
    assert [_iteration(logger, empty, i) for i, empty in enumerate([True, True, False, True])] == [False] * 4
    assert logger.empty_streak == 1
    assert _iteration(logger, True, 4) is False and _iteration(logger, True, 5) is True


def test_a_resumed_run_continues_the_streak():
    first = IterationLogger(LIMIT)
    _iteration(first, True, 0)
    _iteration(first, True, 1)
    resumed = IterationLogger(LIMIT)
    resumed.load_state_dict(first.state_dict())
    assert resumed.empty_streak == 2 and _iteration(resumed, True, 2) is True


def test_a_checkpoint_from_before_the_move_keeps_its_streak():
    logger = IterationLogger(LIMIT)
    logger.on_load_checkpoint(None, None, {"ragen_lit": {"empty_streak": 2}})
    assert logger.empty_streak == 2
    logger.on_load_checkpoint(None, None, {})  # nothing there: unchanged
    assert logger.empty_streak == 2


def test_a_resumed_logger_keeps_the_whole_runs_history_and_wall_time():
    first = IterationLogger(LIMIT, started=0.0)
    _iteration(first, False, 0)
    _iteration(first, True, 1)
    resumed = IterationLogger(LIMIT)
    saved = first.state_dict()  # the checkpoint: read once (a second read would be later, so larger)
    resumed.load_state_dict(saved)
    _iteration(resumed, False, 2)
    assert [h["iteration"] for h in resumed.history] == [1, 2, 3]
    assert resumed.wall_s() >= saved["wall_s"]  # the earlier process's time is counted


def test_a_resumed_validation_adds_no_point_at_train_start():
    validation = ValidationConfig(num_envs=2, every_n_iterations=5)
    first = ValidationRollouts(validation)
    first.results = {0: {"val/success": 0.25}}
    resumed = ValidationRollouts(validation)
    resumed.load_state_dict(first.state_dict())
    trainer = SimpleNamespace(current_epoch=3, datamodule=None, loggers=[])  # any rollout would fail on it
    resumed.on_train_start(trainer, None)
    assert resumed.results == {0: {"val/success": 0.25}}
    assert resumed.run(trainer, None, 0) == {"val/success": 0.25}  # kept, not redone
