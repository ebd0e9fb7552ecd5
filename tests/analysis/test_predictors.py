"""Early metrics as predictors of final success (Fig. 8): Spearman's ρ by hand on the hand-made sweep."""

import itertools
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import t as student_t

from ragen_lit.analysis.predictors import (
    bootstrap_markdown,
    bootstrap_rho_difference,
    logged_steps,
    predictor_table,
    predictors_heading,
    predictors_report,
    spearman,
    success_target,
    success_targets,
    value_at,
    windowed_value,
)
from ragen_lit.analysis.runs import RunRecord, find_stores, load_runs
from ragen_lit.cli import main
from ragen_lit.errors import ConfigError

from .conftest import log_run


@pytest.fixture(scope="module")
def runs(sweep):
    return load_runs(find_stores([sweep]))


def test_spearman_by_hand_with_ties():
    # x ranks (ties share the mean rank): 1.5 3.5 5.5 1.5 3.5 5.5; y ranks: 1 2 4 3 5 6
    # rho = sum(dx dy) / sqrt(sum dx^2 sum dy^2) = 12 / sqrt(16 * 17.5)
    rho, p, n = spearman([2, 3, 4, 2, 3, 4], [0.2, 0.4, 0.6, 0.5, 0.7, 0.9])
    assert n == 6 and rho == pytest.approx(12 / math.sqrt(16 * 17.5))
    # exact p: the pairings of y's ranks with x's whose |rho| reaches the observed one, 128 of the 6! = 720
    x_ranks, y_ranks = np.array([1.5, 3.5, 5.5, 1.5, 3.5, 5.5]), [1, 2, 4, 3, 5, 6]
    reach = sum(abs(np.corrcoef(x_ranks, pairing)[0, 1]) >= rho - 1e-9 for pairing in itertools.permutations(y_ranks))
    assert reach == 128 and p == pytest.approx(128 / 720)


def test_spearman_p_is_exact_up_to_nine_runs_and_the_t_test_beyond():
    # three runs in the same order: rho = 1, reached by 2 of the 3! orderings (1, 2, 3 and 3, 2, 1); the t-test says 0
    assert spearman([1, 2, 3], [10, 20, 30])[:2] == (pytest.approx(1.0), pytest.approx(1 / 3))
    # nine runs, the first two swapped: rho = 1 - 6 * 2 / (9 * 80); 1 - 6 * 2 / 720 = 59/60
    rho, p, n = spearman(list(range(9)), [1, 0, 2, 3, 4, 5, 6, 7, 8])
    assert n == 9 and rho == pytest.approx(59 / 60) and p == pytest.approx(spearman_p(59 / 60, 9))
    # ten runs: the t-test on 8 degrees of freedom
    rho, p, n = spearman(list(range(10)), [1, 0, 2, 3, 4, 5, 6, 7, 9, 8])
    t = rho * math.sqrt((n - 2) / (1 - rho**2))
    assert n == 10 and p == pytest.approx(2 * student_t.sf(t, n - 2))


def test_spearman_drops_missing_pairs_and_needs_three_and_spread():
    assert spearman([1, math.nan, 2, 3], [1, 5, 2, 3])[::2] == (pytest.approx(1.0), 3)
    assert all(math.isnan(v) for v in spearman([1, 2], [1, 2])[:2])
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])[0])


def test_value_at_is_the_exact_step_only():
    assert value_at([(1, 0.5), (6, 0.7)], 6) == 0.7 and math.isnan(value_at([(1, 0.5)], 6))


def test_predictor_table_on_the_hand_made_sweep(runs):
    rows = {r.label: r for r in predictor_table(runs, step=2)}
    # token entropy at step 2 is 2 + seed in both points; finals 0.2 0.4 0.6 (none) and 0.5 0.7 0.9 (top_p)
    entropy = rows["token entropy"]
    assert (entropy.n, entropy.rho) == (6, pytest.approx(12 / math.sqrt(16 * 17.5)))
    # retrieval acc at step 2: 0.4 0.5 0.6 and 0.4 0.5 (top_p seed 2 logged no MI): five runs
    assert rows["MI retrieval acc"].n == 5
    # nobody logged the MI z-score
    assert rows["MI z-score"].n == 0 and math.isnan(rows["MI z-score"].rho)


def test_compare_prints_and_writes_the_predictor_table(sweep, tmp_path, capsys):
    copy = shutil.copytree(sweep, tmp_path / "sweep")  # compare logs a run into the store: keep the fixture as it is
    out = tmp_path / "out"
    assert main(["compare", str(copy), "--predictors-at", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| iteration | metric | Spearman ρ with final val success | p | runs |" in printed
    assert "| 2 | token entropy | +0.72 | 0.178 | 6 |" in printed
    assert "MI z-score" not in printed  # logged by no run: no row
    assert (out / "predictors.md").read_text() in printed


def test_predictors_at_every_iteration(sweep, tmp_path, capsys):
    """`all`: a block per iteration the predictors were logged at (1 and 2 here), each as `--predictors-at N`."""
    copy = shutil.copytree(sweep, tmp_path / "sweep")
    assert main(["compare", str(copy), "--predictors-at", "all", "--out", str(tmp_path / "out")]) == 0
    table = (tmp_path / "out" / "predictors.md").read_text()
    assert "| 2 | token entropy | +0.72 | 0.178 | 6 |" in table
    # iteration 1: entropy 3.0 in every run: constant, no correlation, six runs
    assert "| 1 | token entropy | – | – | 6 |" in table
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == sorted(
        line.split("|")[1].strip() for line in table.splitlines()[2:]
    )
    assert main(["compare", str(copy), "--predictors-at", "late", "--out", str(tmp_path / "x")]) == 2
    assert "--predictors-at late: give an iteration (a whole number) or 'all'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("step", "message"),
    [(0, "--predictors-at 0: no run logged the predictors there; they were logged at "), (99, "--predictors-at 99")],
)
def test_an_iteration_without_diagnostics_is_refused_with_the_ones_there_are(sweep, tmp_path, capsys, step, message):
    steps = logged_steps(load_runs(find_stores([sweep])))
    assert steps and step not in steps
    copy = shutil.copytree(sweep, tmp_path / "sweep")
    assert main(["compare", str(copy), "--predictors-at", str(step), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and f"logged at {', '.join(map(str, steps))}" in err
    assert not (tmp_path / "out").exists()  # refused before the table, figures or MLflow run


def test_compare_names_unfinished_runs_and_can_leave_them_out(sweep, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    copy = shutil.copytree(sweep, tmp_path / "sweep")
    client = MlflowClient(tracking_uri=f"sqlite:///{copy / 'none-seed0' / 'mlruns.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    client.update_run(run.info.run_id, status="RUNNING")  # as a run killed midway is left
    assert main(["compare", str(copy), "--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    assert "warning: 1 run(s) did not finish, in the table with their last logged values: none-seed0 (RUNNING)" in (
        captured.err
    )
    assert "| filter.strategy=none | 3 (1 unfinished) |" in captured.out  # its point says so in the table too
    assert "| filter.strategy=top_p,filter.value=0.9 | 3 |" in captured.out
    assert main(["compare", str(copy), "--finished-only", "--out", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert "left out (--finished-only): none-seed0 (RUNNING)" in captured.err
    assert "| filter.strategy=none | 2 |" in captured.out


# Five runs whose correlations can be ranked by hand. Validation success at steps 0, 5, 10, 15; the last one
# (step 15) ranks the runs 1 2 3 4 5, the mean of steps 10 and 15 (0.5 0.2 0.3 0.4 0.25) ranks them 5 1 3 4 2.
# The trajectory MI z-score at step 6 ranks them 1 2 3 4 5; the mean of its points at steps 1 and 6 (5 1 3 4 2.5)
# ranks them 5 1 3 4 2. Token entropy is the same at every step 1..6: ranks 5 4 3 2 1.
FINAL = [0.1, 0.2, 0.3, 0.4, 0.5]
AT_10 = [0.9, 0.2, 0.3, 0.4, 0.0]
Z_AT_1, Z_AT_6 = [9.0, 0.0, 3.0, 4.0, 0.0], [1.0, 2.0, 3.0, 4.0, 5.0]
ENTROPY = [0.5, 0.4, 0.3, 0.2, 0.1]
Z_KEY, ENTROPY_KEY = "collapse/trajectory/mi_zscore", "actor/entropy"


def five_metrics(i: int) -> dict[str, list[tuple[int, float]]]:
    return {
        "val/success": [(0, 0.0), (5, 0.0), (10, AT_10[i]), (15, FINAL[i])],
        Z_KEY: [(1, Z_AT_1[i]), (6, Z_AT_6[i])],
        ENTROPY_KEY: [(step, ENTROPY[i]) for step in range(1, 7)],
    }


@pytest.fixture(scope="module")
def five():
    return [
        RunRecord(
            run_id=f"id{i}",
            name=f"run{i}",
            label="fig8",
            seed=str(i),
            store="",
            status="FINISHED",
            metrics=five_metrics(i),
        )
        for i in range(5)
    ]


def spearman_p(rho: float, n: int) -> float:
    """The exact two-sided p of ρ = 0 for n runs without ties: the share of the n! orderings of n ranks whose ρ
    (1 - 6 Σd² / (n (n² - 1))) is at least |ρ| away from 0."""
    reach = 0
    for order in itertools.permutations(range(n)):
        r = 1 - 6 * sum((i - j) ** 2 for i, j in enumerate(order)) / (n * (n * n - 1))
        reach += abs(r) >= abs(rho) - 1e-9
    return reach / math.factorial(n)


def test_success_target_is_the_last_validation_or_the_mean_of_the_later_ones():
    history = [(0, 0.0), (5, 0.2), (10, 0.4), (15, 0.9)]
    assert success_target(history) == 0.9  # no option: the last validation, as before
    assert success_target(history, 10) == pytest.approx(0.65)  # (0.4 + 0.9) / 2
    assert success_target(history, 6) == pytest.approx(0.65)  # steps >= 6: 10 and 15
    assert success_target(history, 0) == pytest.approx(1.5 / 4)
    assert success_target(history, 15) == 0.9
    assert math.isnan(success_target(history, 16)) and math.isnan(success_target([], 0))
    assert math.isnan(success_target([]))


def test_windowed_value_is_the_mean_of_the_last_points_up_to_the_step():
    history = [(1, 1.0), (6, 2.0), (11, 4.0)]
    assert windowed_value(history, 11, 2) == 3.0 and windowed_value(history, 11, 3) == pytest.approx(7 / 3)
    assert windowed_value(history, 6, 2) == 1.5
    assert math.isnan(windowed_value(history, 6, 3))  # two points up to step 6: fewer than the window
    assert math.isnan(windowed_value(history, 11, 4))
    assert math.isnan(windowed_value(history, 7, 1)) and math.isnan(windowed_value(history, 7, 2))  # none at 7
    for step in (0, 1, 6, 7, 11, 12):  # window 1 is the single value at the step, as before
        assert windowed_value(history, step) == value_at(history, step) or math.isnan(value_at(history, step))
    assert math.isnan(windowed_value([(1, math.nan), (6, 2.0)], 6, 2))  # a NaN point: NaN, left out as NaN is
    with pytest.raises(ValueError, match="window must be >= 1"):
        windowed_value(history, 11, 0)


@pytest.mark.parametrize(
    ("target_from", "window", "rho_z", "rho_entropy"),
    [
        (None, 1, 1.0, -1.0),  # ranks 12345 against 12345, and 54321 against 12345
        (10, 1, -0.3, 0.3),  # 12345 against 51342: sum d^2 = 16+1+0+0+9 = 26, rho = 1 - 6*26/(5*24)
        (10, 2, 1.0, 0.3),  # 51342 against 51342; 54321 against 51342: sum d^2 = 0+9+0+4+1 = 14
        (None, 2, -0.3, -1.0),
    ],
)
def test_predictor_table_by_hand_with_target_and_window(five, target_from, window, rho_z, rho_entropy):
    rows = {r.key: r for r in predictor_table(five, 6, target_from=target_from, window=window)}
    assert rows[Z_KEY].rho == pytest.approx(rho_z) and rows[ENTROPY_KEY].rho == pytest.approx(rho_entropy)
    assert rows[Z_KEY].n == rows[ENTROPY_KEY].n == 5
    if abs(rho_entropy) < 1:
        assert rows[ENTROPY_KEY].p == pytest.approx(spearman_p(rho_entropy, 5))
    assert success_targets(five, 10) == pytest.approx([0.5, 0.2, 0.3, 0.4, 0.25])


def test_a_window_longer_than_the_points_leaves_the_run_out(five):
    runs = [*five[:4], replace(five[4], metrics={**five[4].metrics, Z_KEY: [(6, 5.0)]})]  # one point only
    rows = {r.key: r for r in predictor_table(runs, 6, target_from=10, window=2)}
    assert rows[Z_KEY].n == 4 and rows[Z_KEY].rho == pytest.approx(1.0)  # 5 1 3 4 against 0.5 0.2 0.3 0.4
    assert rows[ENTROPY_KEY].n == 5


def test_a_run_without_a_later_validation_is_refused_in_one_line(five):
    short = replace(five[2], metrics={**five[2].metrics, "val/success": [(0, 0.0), (5, 0.1)]})
    none = replace(five[3], name="empty", seed="", metrics={})
    with pytest.raises(ConfigError) as refused:
        success_targets([five[0], short, none], 10)
    message = str(refused.value)
    assert message == (
        "--predictors-target 10: 2 of the 3 runs have no validation at or after step 10 "
        "(run2 seed 2: last validation at step 5; empty: no validation)"
    )
    with pytest.raises(ConfigError, match=r"\(run2 seed 2: last validation at step 5\); give a step <= 5, the"):
        success_targets([five[0], short], 10)
    assert success_targets([five[0], short], 5) == pytest.approx([(0.0 + 0.9 + 0.1) / 3, 0.1])


def test_bootstrap_of_identical_or_mirrored_predictors_is_zero_every_time():
    target = [0.1, 0.5, 0.2, 0.9, 0.4, 0.3]
    x = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for b in (x, [-v for v in x]):  # |rho| is the same in every resample: the difference is 0 in each
        d = bootstrap_rho_difference(x, b, target, resamples=500)
        assert (d.observed, d.low, d.high, d.at_most_zero) == (0.0, 0.0, 0.0, 1.0)
        assert d.used + d.skipped == 500 and d.runs == 6


def test_bootstrap_matches_spearman_resample_by_resample():
    """The vectorised ranks against `spearman` on each drawn resample, with ties and a run missing one predictor."""
    target = [0.1, 0.5, 0.2, 0.9, 0.4, 0.3, 0.5, 0.8]
    a = [1.0, 2.0, 2.0, 4.0, math.nan, 0.5, 3.0, 3.5]
    b = [0.7, 0.1, 0.9, 0.2, 0.4, 0.4, 0.3, 0.0]
    d = bootstrap_rho_difference(a, b, target, resamples=400, seed=3)
    draws = np.random.default_rng(3).integers(0, 8, size=(400, 8))
    expected = []
    for row in draws:
        rho_a, rho_b = (spearman([x[i] for i in row], [target[i] for i in row])[0] for x in (a, b))
        if not (math.isnan(rho_a) or math.isnan(rho_b)):
            expected.append(abs(rho_a) - abs(rho_b))
    assert d.used == len(expected) and d.skipped == 400 - len(expected)
    assert (d.low, d.high) == pytest.approx(tuple(np.percentile(expected, [2.5, 97.5])))
    # a difference of two |rho| of 1 is 0 here and 2e-16 in `spearman`'s arithmetic: <= 0 up to rounding
    assert d.at_most_zero == pytest.approx(np.mean(np.array(expected) <= 1e-9))
    observed = abs(spearman(a, target)[0]) - abs(spearman(b, target)[0])
    assert d.observed == pytest.approx(observed)


def test_bootstrap_of_a_clear_case_contains_the_difference_and_is_reproducible():
    target = list(range(12))
    perfect = [2.0 * t + 1 for t in target]  # rho = 1
    unrelated = [5, 11, 2, 8, 0, 9, 3, 7, 1, 10, 4, 6]  # rho = -0.056
    d = bootstrap_rho_difference(perfect, unrelated, target)
    assert d.observed == pytest.approx(1 - 0.055944, abs=1e-6)
    assert 0 < d.low <= d.observed <= d.high <= 1 and d.at_most_zero < 0.01
    assert (d.used, d.skipped, d.runs, d.seed) == (10_000, 0, 12, 0)
    assert bootstrap_rho_difference(perfect, unrelated, target) == d  # seed 0: the same numbers every time
    assert bootstrap_rho_difference(perfect, unrelated, target, seed=1) != d


def test_bootstrap_skips_and_counts_resamples_with_a_constant_side():
    target, a, b = [0.1, 0.4, 0.2, 0.3], [1.0, 4.0, 2.0, 3.0], [4.0, 3.0, 1.0, 2.0]
    d = bootstrap_rho_difference(a, b, target)
    draws = np.random.default_rng(0).integers(0, 4, size=(10_000, 4))
    constant = int((draws == draws[:, :1]).all(axis=1).sum())  # one run drawn four times
    assert constant > 0 and (d.skipped, d.used) == (constant, 10_000 - constant)
    row = f"| 6 | {d.observed:+.2f} | [{d.low:+.2f}, {d.high:+.2f}] | {d.at_most_zero:.3f} |"
    assert row + f" {10_000 - constant:,} of 10,000 | 4 |" in bootstrap_markdown([(6, d)])


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        ([1.0, 2.0, 3.0, math.nan, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0], "at least 4 runs, got 4"),
        ([1.0, 2.0, 3.0, math.nan, math.nan], [1.0, 2.0, 3.0, 4.0, 5.0], "at least 4 runs, got 3 and 5"),
        ([1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0], "undefined"),
        ([1.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0], "one value per run"),
    ],
)
def test_bootstrap_refusals(a, b, message):
    target = [0.1, 0.2, 0.3, 0.4, 0.5]
    if message == "at least 4 runs, got 4":  # four runs are enough
        assert bootstrap_rho_difference(a, b, target, resamples=10).runs == 5
        return
    with pytest.raises(ValueError, match=message):
        bootstrap_rho_difference(a, b, target)


def test_bootstrap_refuses_no_resamples_and_a_confidence_outside_0_1():
    x, target = [1.0, 2.0, 3.0, 4.0], [0.1, 0.3, 0.2, 0.4]
    for kwargs in ({"resamples": 0}, {"confidence": 1.0}):
        with pytest.raises(ValueError, match="resamples must be >= 1 and confidence in"):
            bootstrap_rho_difference(x, x, target, **kwargs)


def test_the_bootstrap_table_has_a_row_per_iteration_with_both_predictors_in_four_runs(five):
    text = predictors_report(five, [1, 6], target_from=10, window=2)
    # iteration 1: one point up to it, fewer than the window: no rows, no bootstrap row
    assert "| 1 |" not in text
    assert "| 6 | MI z-score (trajectory) | +1.00 | 0.017 | 5 |" in text
    assert f"| 6 | token entropy | +0.30 | {spearman_p(0.3, 5):.3f} | 5 |" in text
    predictors, bootstrap = text.split("\n\n")
    assert bootstrap.splitlines()[0] == (
        "| iteration | \\|ρ\\| of MI z-score (trajectory) − \\|ρ\\| of token entropy | bootstrap 95% interval (runs "
        "resampled, seed 0) | share of resamples <= 0 | resamples used | runs |"
    )
    (row,) = bootstrap.splitlines()[2:]
    assert row.startswith("| 6 | +0.70 | [") and row.endswith(" | 5 |")
    # without the window the entropy row is there at iteration 1, the MI z-score only in five runs at 1 and 6
    both = predictors_report(five, [1, 6])
    assert both.count("| iteration | metric | Spearman ρ with final val success | p | runs |") == 1
    rows = both.split("\n\n")[1].splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 6"] and rows[1].startswith("| 6 | +0.00 | [+0.00, +0.00] |")
    three = predictors_report(five[:3], [6])  # three runs: no bootstrap table
    assert "bootstrap" not in three and "| 6 | token entropy | -1.00 |" in three


def test_the_heading_says_the_target_and_the_window():
    assert predictors_heading() == "Early metrics as predictors of final success (across all runs above):"
    assert predictors_heading(150, 3) == (
        "Early metrics as predictors of mean validation success from step 150 (predictors: mean of their last 3 "
        "points up to the iteration; across all runs above):"
    )
    assert predictors_heading(window=2).startswith("Early metrics as predictors of final success (predictors: mean")


def test_compare_with_a_later_target_and_a_window_on_the_sweep(sweep, tmp_path, capsys):
    """Target from step 1: base 0.25 0.3 0.55, top_p 0.5 0.65 0.85 (ranks 1 2 4 3 5 6). Window 2 at iteration 2:
    entropy 2.5 3 3.5 in both points, retrieval acc 0.3 0.35 0.4 and 0.3 0.35 (top_p seed 2 has no MI); at
    iteration 1 a single point: every predictor NaN, no rows."""
    copy = shutil.copytree(sweep, tmp_path / "sweep")
    out = tmp_path / "out"
    argv = ["compare", str(copy), "--predictors-at", "all", "--predictors-target", "1", "--predictors-window", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "Early metrics as predictors of mean validation success from step 1 (predictors: mean of their last 2 "
        "points up to the iteration; across all runs above):\n\n"
        "| iteration | metric | Spearman ρ with mean val success from step 1 | p | runs |"
    ) in printed
    assert "| 1 |" not in printed
    assert "| 2 | token entropy | +0.72 | 0.178 | 6 |" in printed  # 12 / sqrt(16 * 17.5), as in the table above
    # x ranks 1.5 3.5 5 1.5 3.5, y ranks 1 2 4 3 5: sum dx dy = 5.5, sum dx^2 = 9, sum dy^2 = 10
    rho = 5.5 / math.sqrt(90)
    reach = sum(
        abs(np.corrcoef([1.5, 3.5, 5, 1.5, 3.5], pairing)[0, 1]) >= rho - 1e-9
        for pairing in itertools.permutations([1, 2, 4, 3, 5])
    )
    assert f"| 2 | MI retrieval acc | +{rho:.2f} | {reach / 120:.3f} | 5 |" in printed
    assert "Iteration" not in printed  # no run logged the trajectory MI z-score: no bootstrap line
    assert (out / "predictors.md").read_text() in printed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--predictors-at", "2", "--predictors-target", "3"],
            "--predictors-target 3: 6 of the 6 runs have no validation at or after step 3 (",
        ),
        (["--predictors-at", "2", "--predictors-target", "3"], "; give a step <= 2, the earliest last validation"),
        (["--predictors-at", "2", "--predictors-window", "0"], "--predictors-window 0: give a number of points >= 1"),
        (["--predictors-at", "2", "--predictors-target", "-1"], "--predictors-target -1: give a step >= 0"),
        (["--predictors-window", "2"], "--predictors-window changes the predictors table: give --predictors-at"),
        (["--predictors-target", "1"], "--predictors-target changes the predictors table: give --predictors-at"),
    ],
)
def test_predictor_options_are_refused_before_any_output(sweep, tmp_path, capsys, options, message):
    copy = shutil.copytree(sweep, tmp_path / "sweep")
    assert main(["compare", str(copy), *options, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "\n" not in captured.err.strip()
    assert not captured.out and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def five_stores(tmp_path_factory, empty_store):
    root = tmp_path_factory.mktemp("five")
    for i in range(5):
        tags = {"sweep": "fig8", "point": "fig8", "seed": str(i)}
        log_run(empty_store, root / f"run{i}", f"run{i}", tags, five_metrics(i))
    return root


def test_compare_prints_the_bootstrap_table_under_the_predictors(five_stores, tmp_path, capsys):
    copy = shutil.copytree(five_stores, tmp_path / "five")
    out = tmp_path / "out"
    options = ["--predictors-at", "6", "--predictors-target", "10", "--predictors-window", "2", "--out", str(out)]
    assert main(["compare", str(copy), *options]) == 0
    printed = capsys.readouterr().out
    assert "| 6 | MI z-score (trajectory) | +1.00 | 0.017 | 5 |\n| 6 | token entropy | +0.30 |" in printed
    row = [line for line in printed.splitlines() if line.startswith("| 6 | +0.70 | [")]
    assert len(row) == 1
    low, high = (float(v) for v in row[0].split(" | ")[2].strip("[]").split(", "))
    # the MI z-score ranks the runs as the target does in every resample: the difference is 1 - |rho entropy| >= 0
    assert 0 <= low <= 0.70 <= high <= 1
    draws = np.random.default_rng(0).integers(0, 5, size=(10_000, 5))
    constant = int((draws == draws[:, :1]).all(axis=1).sum())
    assert row[0].endswith(f" | {10_000 - constant:,} of 10,000 | 5 |")
    assert (out / "predictors.md").read_text().endswith(row[0] + "\n")
    assert main(["compare", str(copy), *options[:-1], str(tmp_path / "again")]) == 0  # seed 0: the same row
    assert row[0] in capsys.readouterr().out
