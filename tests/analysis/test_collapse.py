"""The reading of MI loss and its regimes from logged diagnostics, on hand-made runs."""

from __future__ import annotations

import math

import pytest

from ragen_lit.analysis.collapse import (
    BLOW_UP,
    LOW_ENTROPY,
    NO_LOSS,
    TEMPLATE,
    entropy_flag,
    entropy_state,
    learns,
    read_run,
    replay_alarm,
    scope_points,
    start_and_levels,
    success_plateau,
    zscore_loss,
)
from ragen_lit.analysis.collapse_report import collapse_markdown
from ragen_lit.analysis.runs import RunRecord

STEPS = list(range(1, 9))
# levels from the 6th point: (0.8, 0.5, 0.2) 0.5, (0.5, 0.2, 0.1) 0.267, (0.2, 0.1, 0.1) 0.133 -> over 2 x 0.1:
# 2.5, 1.33, 0.667: MI lost at step 8 only
FALLING = [0.8, 0.8, 0.8, 0.8, 0.5, 0.2, 0.1, 0.1]
HELD = [0.8] * 8


def run(metrics, label="p", seed="0") -> RunRecord:
    return RunRecord("id" + label + seed, "r", label, seed, "store", "FINISHED", metrics=metrics)


def scope(name, retrieval, entropy, chance=0.1):
    return {
        f"collapse/{name}/retrieval_acc": list(zip(STEPS, retrieval)),
        f"collapse/{name}/retrieval_chance": [(s, chance) for s in STEPS],
        f"collapse/{name}/cond_entropy": list(zip(STEPS, entropy)),
    }


def token(values):
    return {"actor/entropy": list(zip(STEPS, values))}


def test_start_and_levels_are_the_alarms_baseline_and_window():
    start, levels = start_and_levels([1, 2, 3, 4, 5, 6, 7])
    assert start == 2 and levels == [None] * 5 + [5, 6]
    start, levels = start_and_levels([1, 2])
    assert math.isnan(start) and levels == [None, None]


def test_entropy_states_by_hand():
    assert entropy_state([1.0, 2.0]) == TEMPLATE and entropy_state([0.8, 1.2]) == TEMPLATE  # the band is closed
    assert entropy_state([2.01, 1.0]) == BLOW_UP and entropy_state([0.79, 1.0]) == LOW_ENTROPY
    assert entropy_state([0.5, 3.0]) == BLOW_UP  # above the band wins


def test_scope_points_read_levels_against_twice_chance_and_the_starts():
    points = scope_points(run({**scope("first_turn", FALLING, [1.0] * 8), **token([0.5] * 8)}), "first_turn")
    assert [p.step for p in points] == [6, 7, 8]
    assert [round(p.closeness, 3) for p in points] == [2.5, 1.333, 0.667]
    assert [p.mi_lost for p in points] == [False, False, True]
    assert points[-1].cond_entropy_ratio == 1.0 and points[-1].token_entropy_ratio == 1.0


@pytest.mark.parametrize(
    ("cond_entropy", "token_entropy", "outcome"),
    [
        ([1.0] * 8, [0.5] * 8, TEMPLATE),
        # token entropy's level at step 8: 1.5 = 3 x its start 0.5
        ([1.0] * 8, [0.5] * 5 + [1.5] * 3, BLOW_UP),
        # H(Z|X)'s level at step 8: 0.5 = 0.5 x its start
        ([1.0] * 5 + [0.5] * 3, [0.5] * 8, LOW_ENTROPY),
    ],
)
def test_the_outcome_is_the_regime_the_entropies_name_at_the_mi_loss(cond_entropy, token_entropy, outcome):
    reading = read_run(run({**scope("first_turn", FALLING, cond_entropy), **token(token_entropy)}))
    assert reading.onset == {"first_turn": 8, "trajectory": None} and reading.mi_loss == 8
    assert reading.outcome == outcome and reading.regime_end == outcome
    assert reading.template == (8 if outcome == TEMPLATE else None)


def test_a_run_that_keeps_its_mi_has_no_loss_and_a_closest_approach():
    reading = read_run(run({**scope("first_turn", HELD, [1.0] * 8), **token([0.5] * 8)}))
    assert reading.outcome == NO_LOSS and reading.regime_end == NO_LOSS and reading.mi_loss is None
    assert reading.closest == (pytest.approx(4.0), 6)  # 0.8 / 0.2 at every point: the first
    # entropies outside the band at every point: no closest approach
    fallen = read_run(run({**scope("first_turn", HELD, [1.0] * 3 + [0.1] * 5), **token([0.5] * 8)}))
    assert fallen.closest is None


def test_the_first_turn_scope_names_the_regime_when_both_lose_mi_at_one_step():
    metrics = {
        **scope("first_turn", FALLING, [1.0] * 8),
        **scope("trajectory", FALLING, [1.0] * 5 + [0.5] * 3),
        **token([0.5] * 8),
    }
    reading = read_run(run(metrics))
    assert reading.onset == {"first_turn": 8, "trajectory": 8} and reading.outcome == TEMPLATE
    # the trajectory scope alone lost MI earlier: it names the outcome
    metrics.update(scope("trajectory", [0.8] * 3 + [0.1] * 5, [1.0] * 5 + [0.5] * 3))
    reading = read_run(run(metrics))
    assert reading.onset["trajectory"] == 6 and reading.outcome == TEMPLATE  # H still 1.0 at step 6
    assert reading.template == 6


def test_entropy_monitors_one_and_two_sided():
    metrics = {**scope("first_turn", HELD, [1.0] * 8), **token([0.5] * 5 + [1.5] * 3)}
    # token entropy's level: 0.833 (x1.67) at 6, 1.167 (x2.33) at 7: a rise the one-sided monitor does not see
    assert entropy_flag(run(metrics), two_sided=False) is None
    assert entropy_flag(run(metrics), two_sided=True) == 7
    metrics.update(scope("trajectory", HELD, [1.0] * 6 + [0.5] * 2))  # level 1 at 6, 0.833 at 7, 0.667 at 8
    assert entropy_flag(run(metrics), two_sided=False) == 8


def test_the_zscore_clause_and_the_plateau_by_hand():
    metrics = {
        **scope("first_turn", HELD, [1.0] * 8),
        "collapse/first_turn/mi_zscore": list(zip(STEPS, [2, 2, 2, 2, 2, 0.4, 0.4, 0.4])),
    }
    # levels over the start 2: (2, 2, 0.4) 0.73, (2, 0.4, 0.4) 0.47, 0.4 -> 0.2 <= 0.25 at step 8
    assert zscore_loss(run(metrics)) == 8
    assert zscore_loss(run(metrics), fraction=0.1) is None
    # moving means over 3: 0.1, 0.2, 0.3, 0.3 (tie: the first, ending at step 5), 0.2
    success = [0.0, 0.1, 0.2, 0.3, 0.4, 0.2, 0.0]
    assert success_plateau(run({"rollout/success": list(enumerate(success, start=1))}), window=3) == 5
    assert success_plateau(run({"rollout/success": [(1, 0.5)]})) is None


def test_a_run_learns_when_its_last_three_validations_beat_its_first_by_five_points():
    def validations(*values):
        return run({"val/success": list(zip(range(0, 10 * len(values), 10), values))})

    # last three (0.3, 0.2, 0.25) = 0.25 >= 0.2 + 0.05: a tie counts
    assert learns(validations(0.2, 0.1, 0.3, 0.2, 0.25)) is True
    assert learns(validations(0.2, 0.1, 0.3, 0.2, 0.2)) is False  # 0.233 < 0.25
    assert learns(validations(0.5, 0.4, 0.45, 0.5)) is False  # falling behind its start is not learning
    assert learns(validations(0.2, 0.9, 0.9)) is None  # three validations: no last three after the first
    assert learns(validations(0.2, 0.3, 0.3, 0.3), margin=0.2) is False


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


def test_the_tables_count_outcomes_difference_shares_and_read_the_monitors():
    """Base: two template collapses at step 8, the alarm at 7 in one; filtered: one blow-up, one run without loss
    whose alarm fired (a false alarm) and whose entropy fell."""
    alarm = {"collapse/alarm": [(6, 0.0), (7, 1.0)]}
    template = {**scope("first_turn", FALLING, [1.0] * 8), **token([0.5] * 8)}
    blow_up = {**scope("first_turn", FALLING, [1.0] * 8), **token([0.5] * 5 + [1.5] * 3)}
    healthy = {**scope("first_turn", HELD, [1.0] * 5 + [0.5] * 3), **token([0.5] * 8), **alarm}
    success = {"rollout/success": [(s, min(s, 4) / 10) for s in range(1, 21)]}  # the first 10-window at 0.4: 13
    runs = [
        run({**template, **alarm, **success, "val/success": [(0, 0.2), (8, 0.25)]}, label="base", seed="0"),
        run(template, label="base", seed="1"),
        run(blow_up, label="filtered", seed="0"),
        run({**healthy, "val/success": [(0, 0.2), (2, 0.2), (4, 0.3), (8, 0.3)]}, label="filtered", seed="1"),
    ]
    text = collapse_markdown([read_run(r) for r in runs], baseline="base")
    assert (
        "| base | 0 | 8 | – | template collapse | 8 | template collapse | 0.67 at 8 | – | 7 | – | – | 13 | 0.250 | – |"
    ) in text
    blown = "| filtered | 0 | 8 | – | entropy blow-up | – | entropy blow-up | 2.50 at 6 | – | – | – | 7 | – | – | – |"
    assert blown in text
    # (the blow-up's closest approach: step 6, where token entropy was 1.67 x its start, in the band)
    # 0/2 - 2/2 = -1, Newcombe -1 + sqrt(0.658² + 0.658²) above; Fisher: tables [[0, 2], [2, 0]] and
    # [[2, 0], [0, 2]], 1/6 each; any MI loss 1/2 - 2/2, Fisher p 1
    assert (
        "| filtered | 2 | 0/2 [0.00, 0.66] | 1/2 [0.09, 0.91] | 0/2 [0.00, 0.66] | 1/2 [0.09, 0.91] | "
        "-1 [-1, -0.07] | 0.333 | -0.5 [-0.905, +0.273] | 1 |"
    ) in text
    assert "| base | 2 | 2/2 [0.34, 1.00] | 0/2 [0.00, 0.66] | 0/2 [0.00, 0.66] | 0/2 [0.00, 0.66] | baseline |" in text
    # the alarm at 7 in one of the base's two: 1 step before the MI loss and 6 before the plateau at 13
    assert (
        "| base | alarm | 1/2 | 0/0 | 0/0 | 1/2 [0.09, 0.91] | 0/0 | 0/0 | -1 [-1, -1], n=1 | -6 [-6, -6], n=1 |"
        in text
    )
    # the filtered run without MI loss learns (0.267 over the last 3 validations >= 0.2 + 0.05): its false alarm
    # counts among the learners' too
    learner = "0/1 [0.00, 0.79] | 1/1 [0.21, 1.00] | 1/1 [0.21, 1.00] | – | – |"
    assert "| filtered | alarm | 0/0 | 0/1 | 0/0 | " + learner in text
    assert "| filtered | entropy falls | 0/0 | 0/1 | 0/0 | " + learner in text
    two_sided = "| filtered | entropy two-sided | 0/0 | 1/1 | 0/0 | 1/1 [0.21, 1.00] | 1/1 [0.21, 1.00] | 1/1"
    assert two_sided in text
    shares = "| all | 4 | 2/4 [0.15, 0.85] | 1/4 [0.05, 0.70] | 0/4 [0.00, 0.49] | 1/4 [0.05, 0.70] |"
    assert shares + " – | – | – | – |" in text


def test_compare_prints_and_writes_the_collapse_reading(sweep, tmp_path, capsys):
    import shutil

    from ragen_lit.cli import main

    copy = shutil.copytree(sweep, tmp_path / "sweep")
    assert main(["compare", str(copy), "--collapse", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    written = (tmp_path / "out" / "collapse.md").read_text()
    assert written in printed and "Template collapse, run by run" in printed
    # two diagnostics points per run: no level is defined, so no run reads as losing MI
    assert "| filter.strategy=none | 3 | 0/3 [0.00, 0.56] | 0/3 [0.00, 0.56] | 0/3 [0.00, 0.56] | 3/3" in written
    assert "| filter.strategy=top_p,filter.value=0.9 | 3 | 0/3 [0.00, 0.56] |" in written
