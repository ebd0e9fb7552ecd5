"""Early metrics as predictors of final success (Fig. 8): Spearman's ρ by hand on the hand-made sweep."""

import math
import shutil

import pytest
from scipy.stats import t as student_t

from ragen_lit.analysis.predictors import logged_steps, predictor_table, spearman, value_at
from ragen_lit.analysis.runs import find_stores, load_runs
from ragen_lit.cli import main


@pytest.fixture(scope="module")
def runs(sweep):
    return load_runs(find_stores([sweep]))


def test_spearman_by_hand_with_ties():
    # x ranks (ties share the mean rank): 1.5 3.5 5.5 1.5 3.5 5.5; y ranks: 1 2 4 3 5 6
    # rho = sum(dx dy) / sqrt(sum dx^2 sum dy^2) = 12 / sqrt(16 * 17.5)
    rho, p, n = spearman([2, 3, 4, 2, 3, 4], [0.2, 0.4, 0.6, 0.5, 0.7, 0.9])
    assert n == 6 and rho == pytest.approx(12 / math.sqrt(16 * 17.5))
    t = rho * math.sqrt((n - 2) / (1 - rho**2))
    assert p == pytest.approx(2 * student_t.sf(t, n - 2))


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
    assert "| 2 | token entropy | +0.72 | 0.109 | 6 |" in printed
    assert "MI z-score" not in printed  # logged by no run: no row
    assert (out / "predictors.md").read_text() in printed


def test_predictors_at_every_iteration(sweep, tmp_path, capsys):
    """`all`: a block per iteration the predictors were logged at (1 and 2 here), each as `--predictors-at N`."""
    copy = shutil.copytree(sweep, tmp_path / "sweep")
    assert main(["compare", str(copy), "--predictors-at", "all", "--out", str(tmp_path / "out")]) == 0
    table = (tmp_path / "out" / "predictors.md").read_text()
    assert "| 2 | token entropy | +0.72 | 0.109 | 6 |" in table
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
