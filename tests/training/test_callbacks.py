"""`IterationLogger`'s empty-filter stop rule: the streak is the callback's own state and survives a resume."""

from __future__ import annotations

from types import SimpleNamespace

from ragen_lit.training.callbacks import IterationLogger


def _iteration(logger: IterationLogger, empty: bool, epoch: int, limit: int = 3):
    trainer = SimpleNamespace(
        datamodule=SimpleNamespace(iteration_metrics={"filter/empty": float(empty)}),
        loggers=[],
        current_epoch=epoch,
        is_global_zero=True,
        should_stop=False,
    )
    module = SimpleNamespace(pop_step_stats=dict, cfg=SimpleNamespace(filter=SimpleNamespace(empty_stop_steps=limit)))
    logger.on_train_epoch_start(trainer, module)
    logger.on_train_epoch_end(trainer, module)
    return trainer.should_stop


def test_the_streak_counts_empty_iterations_in_a_row_and_a_kept_one_resets_it():
    logger = IterationLogger()
    assert [_iteration(logger, empty, i) for i, empty in enumerate([True, True, False, True])] == [False] * 4
    assert logger.empty_streak == 1
    assert _iteration(logger, True, 4) is False and _iteration(logger, True, 5) is True


def test_a_resumed_run_continues_the_streak():
    first = IterationLogger()
    _iteration(first, True, 0)
    _iteration(first, True, 1)
    resumed = IterationLogger()
    resumed.load_state_dict(first.state_dict())
    assert resumed.empty_streak == 2 and _iteration(resumed, True, 2) is True


def test_a_checkpoint_from_before_the_move_keeps_its_streak():
    logger = IterationLogger()
    logger.on_load_checkpoint(None, None, {"ragen_lit": {"empty_streak": 2}})
    assert logger.empty_streak == 2
    logger.on_load_checkpoint(None, None, {})  # nothing there: unchanged
    assert logger.empty_streak == 2
