"""The template-collapse alarm on hand-written diagnostics streams: retrieval above chance losing most of its
starting level while H(Z|X) holds fires it; a healthy run, a dip of one entry and a low-entropy policy do not."""

from __future__ import annotations

import pytest

from ragen_lit.config import DiagnosticsConfig
from ragen_lit.metrics.alarm import CollapseAlarm

ACC, CHANCE, H = (f"collapse/first_turn/{k}" for k in ("retrieval_acc", "retrieval_chance", "cond_entropy"))


def _feed(alarm: CollapseAlarm, accuracies, entropies=None, chance=0.1):
    entropies = entropies or [2.0] * len(accuracies)
    return [alarm.update({ACC: a, CHANCE: chance, H: h, "rollout/reward": 0.5}) for a, h in zip(accuracies, entropies)]


def test_template_collapse_fires_once_the_windows_mean_falls_below_a_fifth_of_the_baseline():
    # above chance: baseline mean(0.8, 0.7, 0.9) = 0.8, bound 0.16; windows after it: (0.5, 0.3, 0.1) -> 0.3,
    # (0.3, 0.1, 0.05) -> 0.15 <= 0.16; entropy window mean 2.0 >= 0.8 x 2.0
    stream = [0.9, 0.8, 1.0, 0.6, 0.4, 0.2, 0.15]
    assert _feed(CollapseAlarm(), stream) == [False] * 6 + [True]
    alarm = CollapseAlarm()
    _feed(alarm, stream)
    assert alarm.levels() == pytest.approx((0.15, 2.0, 0.8, 2.0))


def test_a_healthy_run_and_a_single_dip_stay_quiet():
    assert _feed(CollapseAlarm(), [0.9, 0.8, 1.0, 0.85, 0.9, 0.95, 0.8]) == [False] * 7
    # one entry at chance among healthy ones: the window's mean (0.7 + 0 + 0.8) / 3 stays above 0.16
    assert _feed(CollapseAlarm(), [0.9, 0.8, 1.0, 0.8, 0.1, 0.9]) == [False] * 6


def test_a_low_entropy_deterministic_policy_is_not_template_collapse():
    stream, entropies = [0.9, 0.8, 1.0, 0.2, 0.15, 0.12], [2.0, 2.0, 2.0, 1.2, 1.1, 1.0]
    # the MI fell as in a collapse, but so did H(Z|X): window mean 1.1 < 0.8 x 2.0
    assert _feed(CollapseAlarm(), stream, entropies) == [False] * 6
    # with a floor of 0.5 (1.1 >= 1.0) the entropy rule was what kept it quiet
    assert _feed(CollapseAlarm(entropy_floor=0.5), stream, entropies)[-1] is True


def test_the_alarm_clears_when_the_mi_recovers_and_entries_without_diagnostics_are_no_points():
    alarm = CollapseAlarm(baseline=1, window=2)
    assert _feed(alarm, [0.9, 0.1, 0.1]) == [False, False, True]
    assert alarm.update({"rollout/reward": 0.5}) is None and alarm.on is True  # diagnostics not due
    assert alarm.update({ACC: float("nan"), CHANCE: 0.1, H: 2.0}) is None
    assert _feed(alarm, [0.9]) == [False]  # window (0.0, 0.8): mean 0.4 > 0.16


def test_the_state_survives_a_resume_and_an_older_state_starts_afresh():
    first = CollapseAlarm()
    _feed(first, [0.9, 0.8, 1.0, 0.6, 0.4, 0.2])
    resumed = CollapseAlarm()
    resumed.load_state_dict(first.state_dict())
    assert resumed.update({ACC: 0.12, CHANCE: 0.1, H: 2.0}) is True  # window (0.3, 0.1, 0.02): 0.14
    older = CollapseAlarm()
    older.load_state_dict({"signal": "mi_zscore_ema", "values": [3.0, 2.0], "first_entropy": 2.0, "on": True})
    assert (older.base, older.recent, older.on) == ([], [], False)


def test_bad_settings_and_the_config_defaults():
    with pytest.raises(ValueError):
        CollapseAlarm(window=0)
    with pytest.raises(ValueError):
        CollapseAlarm(mi_fraction=1.0)
    cfg, alarm = DiagnosticsConfig(), CollapseAlarm()
    assert (cfg.collapse_baseline, cfg.collapse_window) == (alarm.baseline, alarm.window)
    assert (cfg.collapse_mi_fraction, cfg.collapse_entropy_floor) == (alarm.mi_fraction, alarm.entropy_floor)
    assert cfg.on_collapse == "warn"
