"""The reading of template collapse from logged diagnostics, on hand-made runs."""

from __future__ import annotations

import pytest

from ragen_lit.analysis.collapse import (
    Point,
    alarm_rates,
    collapse_markdown,
    collapse_onset,
    entropy_flag,
    read_run,
    regime,
    replay_alarm,
    success_plateau,
)
from ragen_lit.analysis.runs import RunRecord


def run(metrics, label="p", seed="0") -> RunRecord:
    return RunRecord("id" + label + seed, "r", label, seed, "store", "FINISHED", metrics=metrics)


def scope(scope, retrieval, chance, entropy, steps=(1, 5, 10, 15)):
    return {
        f"collapse/{scope}/retrieval_acc": list(zip(steps, retrieval)),
        f"collapse/{scope}/retrieval_chance": list(zip(steps, chance)),
        f"collapse/{scope}/cond_entropy": list(zip(steps, entropy)),
    }


def test_the_four_regimes_by_hand():
    first = Point(1, 0.8, 0.1, 10.0)
    assert regime(Point(5, 0.8, 0.1, 9.0), first) == "diverse, input-grounded"
    assert regime(Point(5, 0.2, 0.1, 8.0), first) == "template collapse"  # 0.2 <= 2 x 0.1, 8.0 = 0.8 x 10 not low
    assert regime(Point(5, 0.21, 0.1, 7.9), first) == "compressed, input-grounded"
    assert regime(Point(5, 0.1, 0.1, 2.0), first) == "low-entropy collapse"


def test_collapse_needs_low_mi_while_the_entropy_holds():
    points = [Point(1, 0.8, 0.1, 10.0), Point(5, 0.5, 0.1, 9.0), Point(10, 0.15, 0.1, 9.5), Point(15, 0.1, 0.1, 11)]
    assert collapse_onset(points) == 10
    fell_too = [Point(1, 0.8, 0.1, 10.0), Point(5, 0.1, 0.1, 3.0)]  # low-entropy collapse, not template collapse
    assert collapse_onset(fell_too) is None


def test_entropy_monitor_and_success_plateau_by_hand():
    metrics = {
        "actor/entropy": [(1, 2.0), (2, 1.9), (3, 1.5), (4, 1.7)],  # 1.5 < 0.8 x 2.0 at step 3
        **scope("first_turn", [0.8, 0.7, 0.6, 0.5], [0.1] * 4, [10, 9, 8.5, 7.9]),  # 7.9 < 8 at step 15
    }
    assert entropy_flag(run(metrics)) == 3
    metrics["actor/entropy"] = [(1, 2.0), (2, 1.9)]
    assert entropy_flag(run(metrics)) == 15
    # moving means over 5 iterations: steps 1-5 0.2, 2-6 0.3, 3-7 0.36, 4-8 0.36 (tie: the first), 5-9 0.32
    success = [0.0, 0.2, 0.3, 0.2, 0.3, 0.5, 0.5, 0.3, 0.0]
    assert success_plateau(run({"rollout/success": list(enumerate(success, start=1))})) == 7
    assert success_plateau(run({"rollout/success": [(1, 0.5)]})) is None


def test_a_run_read_alarm_hits_and_false_alarms():
    collapsing = run(
        {
            **scope("first_turn", [0.8, 0.5, 0.18, 0.12], [0.1] * 4, [10, 10, 9.5, 9.8]),
            **scope("trajectory", [0.6, 0.4, 0.3, 0.11], [0.05] * 4, [12, 12, 12, 12]),
            "collapse/alarm": [(5, 0.0), (10, 1.0), (15, 1.0)],
            "val/success": [(0, 0.3), (15, 0.35)],
        },
        seed="0",
    )
    healthy = run({**scope("first_turn", [0.8] * 4, [0.1] * 4, [10] * 4), "collapse/alarm": [(5, 1.0)]}, seed="1")
    quiet = run(scope("first_turn", [0.8] * 4, [0.1] * 4, [10] * 4), seed="2")
    readings = [read_run(r) for r in (collapsing, healthy, quiet)]
    assert readings[0].onset == {"first_turn": 10, "trajectory": None} and readings[0].collapsed == 10
    assert readings[0].regime_end == "template collapse" and readings[0].alarm == 10
    assert readings[1].collapsed is None and readings[1].alarm == 5 and readings[1].regime_end.startswith("diverse")
    rates = alarm_rates(readings)
    assert (rates.collapsed, rates.hits, rates.healthy, rates.false_alarms, rates.leads) == (1, 1, 2, 1, (0,))
    text = collapse_markdown(readings)
    assert "| p | 0 | 10 | – | template collapse | 10 | – | – | 0.350 |" in text
    assert "| p | 3 | 1 | – | 1/1 | 1/2 | +0 | – | 0/1 | 0/2 |" in text
    assert "| all | 3 | 1 | – | 1/1 | 1/2 | +0 | – | 0/1 | 0/2 |" in text


def test_the_point_summary_differences_collapse_shares_and_times_the_alarm_after_the_plateau():
    """Two points of two runs: the baseline's runs both collapse (alarm at 10, success peaking at 4 and never), the
    other's neither; an entropy monitor flags one run of each."""
    falling = scope("first_turn", [0.8, 0.5, 0.18, 0.12], [0.1] * 4, [10, 10, 9.5, 9.8])
    alarm = {"collapse/alarm": [(5, 0.0), (10, 1.0)]}
    # success rises to step 4, then holds: the first 5-iteration window at its highest mean ends at step 8
    success = {"rollout/success": [(step, min(step, 4) / 10) for step in range(1, 16)]}
    low_entropy = {"actor/entropy": [(1, 1.0), (5, 0.5)]}
    held = scope("first_turn", [0.8] * 4, [0.1] * 4, [10] * 4)
    runs = [
        run({**falling, **alarm, **success, **low_entropy}, seed="0", label="base"),
        run({**falling, **alarm}, seed="1", label="base"),
        run({**held, **low_entropy}, seed="0", label="filtered"),
        run(held, seed="1", label="filtered"),
    ]
    readings = [read_run(r) for r in runs]
    assert [r.plateau for r in readings] == [8, None, None, None] and readings[0].entropy == 5
    text = collapse_markdown(readings, baseline="base")
    # 0/2 - 2/2 = -1; Newcombe from Wilson's [0, 0.658] and [0.342, 1]: -1 + sqrt(0.658² + 0.658²) = -0.07 above
    assert "| base | 2 | 2 | baseline | 2/2 | 0/0 | +0, +0 | +2 | 1/2 | 0/0 |" in text
    assert "| filtered | 2 | 0 | -1 [-1, -0.07] | 0/0 | 0/2 | – | – | 0/0 | 1/2 |" in text


def test_replaying_the_alarm_with_other_settings():
    """The alarm's own rule on the logged stream: retrieval above chance at most a fifth of its baseline over the
    window, H(Z|X) held."""
    metrics = {
        "collapse/first_turn/retrieval_acc": [(1, 0.9), (2, 0.7), (3, 0.4), (4, 0.2), (5, 0.15)],
        "collapse/first_turn/retrieval_chance": [(s, 0.1) for s in range(1, 6)],
        "collapse/first_turn/cond_entropy": [(s, 2.0) for s in range(1, 6)],
        "actor/entropy": [(s, 1.0) for s in range(1, 6)],
    }
    # baseline 0.8; window 1: 0.6, 0.3, 0.1 (<= 0.16 at step 4); window 2: (0.3, 0.1) 0.2, (0.1, 0.05) 0.075 at 5
    assert replay_alarm(run(metrics), baseline=1, window=1) == 4
    assert replay_alarm(run(metrics), baseline=1, window=2) == 5
    assert replay_alarm(run(metrics), baseline=1, window=1, mi_fraction=0.05) is None
    assert replay_alarm(run(metrics)) is None  # baseline 3 and window 3 need six points
    with pytest.raises(ValueError):
        replay_alarm(run(metrics), window=0)


def test_compare_prints_and_writes_the_collapse_reading(sweep, tmp_path, capsys):
    import shutil

    from ragen_lit.cli import main

    copy = shutil.copytree(sweep, tmp_path / "sweep")
    assert main(["compare", str(copy), "--collapse", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    written = (tmp_path / "out" / "collapse.md").read_text()
    assert written in printed and "Template collapse, run by run" in printed
    # the hand-made sweep's first diagnostics already sit at chance x 0.8 (0.2 <= 2 x 0.25): every run with MI
    # diagnostics reads as collapsed at step 1; top_p's seed 2 logged none
    # against the baseline's 3 of 3: 2/3 - 3/3 with Newcombe's interval
    assert "| filter.strategy=none | 3 | 3 | baseline | 0/3 | 0/0 | – | – |" in written
    assert "| filter.strategy=top_p,filter.value=0.9 | 3 | 2 | -0.333 [-0.792, +0.291] | 0/2 | 0/1 | – | – |" in written
