"""The comparison table against hand-computed numbers from the sweep in conftest.py."""

import csv
import io
import json
import math

import pytest

from ragen_lit.analysis.compare import build_table, choose_columns, render, to_dict
from ragen_lit.analysis.runs import find_stores, load_runs
from ragen_lit.errors import ConfigError

from .conftest import BASE, TOP_P


@pytest.fixture(scope="module")
def runs(sweep):
    return load_runs(find_stores([sweep]))


def row(table, label):
    return next(r for r in table.rows if r.label == label)


def test_runs_are_loaded_with_tags_and_histories(runs):
    assert len(runs) == 6
    first = next(r for r in runs if r.label == BASE and r.seed == "0")
    assert first.metrics["val/success"] == [(0, 0.1), (1, 0.3), (2, 0.2)]
    assert first.params["filter.strategy"] == "none" and first.tags["sweep"] == "rv"


def test_means_stds_and_n_by_hand(runs):
    table = build_table(runs)
    base, top = row(table, BASE), row(table, TOP_P)
    # final val success: base 0.2, 0.4, 0.6 -> mean 0.4, s = sqrt((0.04 + 0 + 0.04) / 2) = 0.2
    assert (base.cells["val_success_final"].mean, base.cells["val_success_final"].std) == pytest.approx((0.4, 0.2))
    # best: max of each seed's history = 0.3, 0.4, 0.6 -> mean 1.3/3 = 0.43333,
    # s² = ((-0.13333)² + (-0.03333)² + 0.16667²) / 2 = 0.046667 / 2 -> s = 0.152753
    assert base.cells["val_success_best"].mean == pytest.approx(1.3 / 3)
    assert base.cells["val_success_best"].std == pytest.approx(0.152753, abs=1e-6)
    # train success = mean of the last 3 rollout/success = 0.6 + 0.1*seed -> 0.6, 0.7, 0.8: mean 0.7, s 0.1
    assert (base.cells["train_success"].mean, base.cells["train_success"].std) == pytest.approx((0.7, 0.1))
    # kept ratio: base logged none (NaN, n 0); top_p: mean(0.5, 1.0) = 0.75 every seed, s = 0
    assert base.cells["kept_ratio"].n == 0 and math.isnan(base.cells["kept_ratio"].mean)
    assert (top.cells["kept_ratio"].mean, top.cells["kept_ratio"].std, top.cells["kept_ratio"].n) == (0.75, 0.0, 3)
    # rv_cv: mean(0.2, 0.4 + 0.3*seed) = 0.3, 0.45, 0.6 -> mean 0.45, s = 0.15
    assert (top.cells["rv_cv"].mean, top.cells["rv_cv"].std) == pytest.approx((0.45, 0.15))
    # MI retrieval acc: last = 0.4 + 0.1*seed, seed 2 of top_p has no MI -> 0.4, 0.5: mean 0.45, n 2
    assert (top.cells["mi_retrieval_acc"].mean, top.cells["mi_retrieval_acc"].n) == (pytest.approx(0.45), 2)
    # entropy: last = 2 + seed -> 2, 3, 4: mean 3, s 1; step time mean(10, 20) = 15
    assert (base.cells["token_entropy"].mean, base.cells["token_entropy"].std) == (3.0, 1.0)
    assert base.cells["step_time_s"].mean == 15.0


def test_difference_to_the_default_baseline_by_hand(runs):
    table = build_table(runs)
    assert table.baseline == BASE  # the label with strategy=none, though it is not listed first by name
    assert row(table, BASE).differences == {}
    d = row(table, TOP_P).differences["val_success_final"]
    # 0.7 - 0.4 = 0.3; se = sqrt(0.04/3 + 0.04/3) = 0.163299; ν = 4; t_{0.975,4} = 2.776445; half = 0.453392
    assert (d.delta, d.df) == pytest.approx((0.3, 4.0))
    assert (d.low, d.high) == pytest.approx((-0.153392, 0.753392), abs=1e-5)


def test_explicit_and_unknown_baseline(runs):
    d = row(build_table(runs, baseline=TOP_P), BASE).differences["val_success_final"]
    assert d.delta == pytest.approx(-0.3)
    with pytest.raises(ConfigError) as err:
        build_table(runs, baseline="nope")
    assert "'nope'" in str(err.value) and repr(BASE) in str(err.value) and "\n" not in str(err.value)


def test_markdown(runs):
    text = render(build_table(runs), "markdown")
    lines = text.splitlines()
    assert lines[0].startswith("| point | n | final val success | best val success |")
    assert lines[1].startswith("|---|")
    assert lines[2].startswith(f"| {BASE} | 3 | 0.4 ± 0.2 |") and lines[2].endswith("| baseline |")
    assert lines[3].startswith(f"| {TOP_P} | 3 | 0.7 ± 0.2 |") and lines[3].endswith("| +0.3 [-0.153, +0.753] |")
    assert "| – |" in lines[2]  # base has no kept ratio
    # MI retrieval acc of 2 of top_p's 3 seeds: 0.4, 0.5 -> s = sqrt(2 · 0.05² / 1) = 0.0707
    assert "| 0.45 ± 0.0707 (n=2) |" in lines[3]


def test_csv_parses(runs):
    rows = list(csv.DictReader(io.StringIO(render(build_table(runs), "csv"))))
    assert [r["point"] for r in rows] == [BASE, TOP_P]
    assert float(rows[0]["val_success_final_mean"]) == pytest.approx(0.4)
    assert int(rows[1]["mi_retrieval_acc_n"]) == 2
    assert rows[0]["delta_val_success_final"] == ""  # the baseline row has no difference
    assert float(rows[1]["delta_val_success_final_low"]) == pytest.approx(-0.153392, abs=1e-5)
    assert rows[0]["n_unfinished"] == "0"


def test_json_round_trips(runs):
    table = build_table(runs)
    data = json.loads(render(table, "json"))
    assert data == json.loads(json.dumps(to_dict(table)))
    top = data["rows"][1]
    assert top["values"]["val_success_final"]["runs"] == pytest.approx([0.5, 0.7, 0.9])
    assert top["values"]["mi_retrieval_acc"]["runs"][2] is None
    assert data["rows"][0]["values"]["kept_ratio"]["mean"] is None
    assert top["differences"]["val_success_final"]["df"] == pytest.approx(4.0)
    assert data["rows"][0]["differences"] == {} and data["differences"][0]["key"] == "val_success_final"


def test_metric_choice(runs):
    columns = choose_columns(["kept_ratio", "rollout/success:max"], runs)
    assert [c.key for c in columns] == ["kept_ratio", "rollout/success:max"]
    # max rollout/success of base seed 1 = 0.9 + 0.1 = 1.0
    assert row(build_table(runs, columns=columns), BASE).values["rollout/success:max"][1] == pytest.approx(1.0)
    # steady-state step time: iteration 0 (10 s, the warm-up) left out of mean(10, 20)
    steady = choose_columns(["time/iteration_s:mean_after_first"], runs)
    assert row(build_table(runs, columns=steady), BASE).cells["time/iteration_s:mean_after_first"].mean == 20.0
    for bad in ("nope", "rollout/success:median"):
        with pytest.raises(ConfigError, match=f"unknown metric '{bad}'"):
            choose_columns([bad], runs)


def test_reducers_at_a_step_first_and_the_mean_over_validations(runs):
    columns = choose_columns(["val/success:at1", "val/success:first", "val_success_mean", "rollout/success:at9"], runs)
    base = row(build_table(runs, columns=columns), BASE)
    assert base.values["val/success:at1"] == pytest.approx([0.3, 0.2, 0.5])  # the validation at iteration 1
    assert base.values["val/success:first"] == pytest.approx([0.1, 0.1, 0.1])  # before any update
    # mean over the three validations: (0.1+0.3+0.2)/3, (0.1+0.2+0.4)/3, (0.1+0.5+0.6)/3
    assert base.values["val_success_mean"] == pytest.approx([0.2, 0.7 / 3, 0.4])
    assert all(math.isnan(v) for v in base.values["rollout/success:at9"])  # no run logged step 9
    for bad in ("val/success:at", "val/success:at-1", "val/success:atx"):
        with pytest.raises(ConfigError, match="at<step>"):
            choose_columns([bad], runs)


def test_differences_of_several_columns_by_hand(runs):
    """Robustness of a headline difference: Δ of final, best, mean-over-validations and train success, each with
    its own Welch interval."""
    columns = choose_columns(["val_success_final", "val_success_best", "val_success_mean", "train_success"], runs)
    table = build_table(runs, columns=columns, differences=columns)
    d = row(table, TOP_P).differences
    assert d["val_success_final"].delta == pytest.approx(0.3)
    # best: top_p 0.5 0.7 0.9 (mean 0.7) vs base 0.3 0.4 0.6 (mean 1.3/3)
    assert d["val_success_best"].delta == pytest.approx(0.7 - 1.3 / 3)
    # mean over validations: top_p (0.1+0.5+0.5)/3, (0.1+0.6+0.7)/3, (0.1+0.8+0.9)/3 -> mean 4.3/9; base 2.5/9
    assert d["val_success_mean"].delta == pytest.approx(4.3 / 9 - 2.5 / 9)
    assert d["train_success"].delta == pytest.approx(0.0)  # both 0.6 + 0.1*seed
    text = render(table, "markdown")
    for title in ("final val success", "best val success", "mean val success", "train success (last 3)"):
        assert f"Δ {title} vs baseline [95% CI]" in text
    assert text.splitlines()[2].endswith("| baseline | baseline | baseline | baseline |")


def test_plain_fit_run_is_grouped_by_name_and_has_no_interval(runs, solo):
    both = runs + load_runs(find_stores([solo]))
    table = build_table(both)
    d = row(table, "frozenlake-grpo").differences["val_success_final"]
    assert d.delta == pytest.approx(0.5 - 0.4) and math.isnan(d.low)
    assert "(no interval: n < 2)" in render(table, "markdown")
