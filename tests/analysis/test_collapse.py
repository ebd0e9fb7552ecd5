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
    assert "| p | 3 | 1 | 1/1 | 1/2 | +0 |" in text and "| all | 3 | 1 | 1/1 | 1/2 | +0 |" in text


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
    assert "| filter.strategy=none | 3 | 3 | 0/3 | 0/0 | – |" in written
    assert "| filter.strategy=top_p,filter.value=0.9 | 3 | 2 | 0/2 | 0/1 | – |" in written
