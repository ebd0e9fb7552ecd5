"""The template-collapse alarm on hand-written diagnostics streams: MI falling k times with the entropy
held fires it; a healthy run, noise below the minimum drop and a low-entropy deterministic policy do not."""

from __future__ import annotations

from ragen_lit.config import DiagnosticsConfig
from ragen_lit.metrics.alarm import CollapseAlarm

Z, H = "collapse/first_turn/mi_zscore_ema", "collapse/first_turn/cond_entropy"
ACC, CHANCE = "collapse/first_turn/retrieval_acc", "collapse/first_turn/retrieval_chance"


def _feed(alarm: CollapseAlarm, zscores, entropies=None):
    entropies = entropies or [2.0] * len(zscores)
    return [alarm.update({Z: z, H: h, "rollout/reward": 0.5}) for z, h in zip(zscores, entropies)]


def test_template_collapse_fires_only_after_k_falls():
    # 3.0 > 2.5 > 1.8 > 1.0: three falls, drop 2.0 > 0.5, entropy 2.1 >= 0.75 * 2.0
    assert _feed(CollapseAlarm(), [3.0, 2.5, 1.8, 1.0], [2.0, 2.0, 1.9, 2.1]) == [False, False, False, True]


def test_a_healthy_run_stays_quiet():
    assert _feed(CollapseAlarm(), [1.0, 1.2, 1.1, 1.5, 1.6, 1.6]) == [False] * 6


def test_falls_below_the_minimum_drop_are_noise():
    # three falls of 0.1: total 0.3 <= 0.5
    assert _feed(CollapseAlarm(), [1.0, 0.9, 0.8, 0.7]) == [False] * 4
    # the same stream fires once the minimum is below 0.3
    assert _feed(CollapseAlarm(min_drop=0.25), [1.0, 0.9, 0.8, 0.7])[-1] is True


def test_a_high_mi_that_wobbles_down_a_little_is_not_a_collapse():
    # iterations 16-31 of a default FrozenLake run (retrieval accuracy 0.94 vs chance 0.07 at its end), which the
    # rule without a relative drop flagged: three falls of 1.04 z-units in all, but 17% of where they started
    stream = [6.15, 5.628, 5.36, 5.106]
    assert _feed(CollapseAlarm(), stream) == [False] * 4
    assert _feed(CollapseAlarm(min_relative_drop=0.15), stream)[-1] is True


def test_a_low_entropy_deterministic_policy_is_not_template_collapse():
    # MI falls as above, but the entropy falls too: 0.8 < (1 - 0.25) * 2.0 = 1.5
    assert _feed(CollapseAlarm(), [3.0, 2.5, 1.8, 1.0], [2.0, 1.6, 1.2, 0.8]) == [False] * 4
    # with a 70% tolerance 0.8 >= 0.3 * 2.0 = 0.6: the entropy rule was what kept it quiet
    assert _feed(CollapseAlarm(entropy_tolerance=0.7), [3.0, 2.5, 1.8, 1.0], [2.0, 1.6, 1.2, 0.8])[-1] is True


def test_a_rise_breaks_the_streak_and_the_alarm_clears_when_the_mi_recovers():
    alarm = CollapseAlarm()
    # 2.5 -> 2.6 is a rise: the window [2.5, 2.6, 1.8, 1.0] is not strictly decreasing
    assert _feed(alarm, [3.0, 2.5, 2.6, 1.8, 1.0]) == [False] * 5
    # [2.6, 1.8, 1.0, 0.5]: three falls, drop 2.1
    assert _feed(alarm, [0.5, 1.5]) == [True, False]


def test_iterations_without_diagnostics_are_no_points():
    alarm = CollapseAlarm()
    assert alarm.update({"rollout/reward": 0.5}) is None
    assert alarm.update({Z: float("nan"), H: 2.0}) is None
    assert _feed(alarm, [3.0, 2.5]) == [False, False]
    assert alarm.update({"rollout/reward": 0.1}) is None
    assert _feed(alarm, [1.8, 1.0]) == [False, True]


def test_retrieval_above_chance_stands_in_for_a_missing_zscore():
    alarm = CollapseAlarm()
    # above chance: 0.35, 0.25, 0.15, 0.05; drop 0.30 > min_drop_retrieval 0.1 (though not > 0.5)
    stream = [{ACC: acc, CHANCE: 0.25, H: 2.0} for acc in (0.6, 0.5, 0.4, 0.3)]
    assert [alarm.update(m) for m in stream] == [False, False, False, True]
    # the z-score returns: a new signal, a new window
    assert alarm.update({Z: -5.0, H: 2.0}) is False and alarm.values == [-5.0]


def test_the_state_survives_a_resume():
    first = CollapseAlarm()
    _feed(first, [3.0, 2.5, 1.8], [2.0, 2.2, 2.2])
    resumed = CollapseAlarm()
    resumed.load_state_dict(first.state_dict())
    # the first entropy 2.0 came along: 1.6 >= 1.5 holds against it (not against 2.2, whose bound is 1.65)
    assert resumed.update({Z: 1.0, H: 1.6}) is True and resumed.state_dict()["on"] is True


def test_the_config_defaults_are_the_detectors():
    cfg, alarm = DiagnosticsConfig(), CollapseAlarm()
    assert (cfg.collapse_patience, cfg.collapse_entropy_tolerance) == (alarm.patience, alarm.entropy_tolerance)
    assert cfg.collapse_min_relative_drop == alarm.min_relative_drop
    assert alarm.min_drops == {
        "mi_zscore_ema": cfg.collapse_min_drop,
        "retrieval_above_chance": cfg.collapse_min_drop_retrieval,
    }
    assert cfg.on_collapse == "warn"
