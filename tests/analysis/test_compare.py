"""The comparison table against hand-computed numbers from the sweep in conftest.py."""

import csv
import io
import json
import math
import shutil

import pytest

from ragen_lit.analysis.collapse import read_run
from ragen_lit.analysis.compare import build_table, choose_columns, render, to_dict
from ragen_lit.analysis.compare_blocks import collapse_by_block, factors
from ragen_lit.analysis.runs import find_stores, load_runs
from ragen_lit.cli import main
from ragen_lit.errors import ConfigError

from .conftest import BASE, TOP_P, log_run


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


def test_stores_come_in_natural_order_of_their_seeds(tmp_path):
    for seed in (10, 2, 1):
        folder = tmp_path / f"filter.strategy-none-seed{seed}"
        folder.mkdir()
        (folder / "mlruns.db").touch()
    found = find_stores([tmp_path])
    assert [uri.split("seed")[1].split("/")[0] for uri in found] == ["1", "2", "10"]


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


# A 2x2 grid: two algorithms x two filter strategies, 3 seeds a point but 2 for PPO without the filter. Per run: the
# final val/success and the train success (one rollout/success value, so its mean over the last 3 is that value).
GRPO_NONE, GRPO_TOP = "algo.name=grpo,filter.strategy=none", "algo.name=grpo,filter.strategy=top_p"
PPO_NONE, PPO_TOP = "algo.name=ppo,filter.strategy=none", "algo.name=ppo,filter.strategy=top_p"
GRID = {
    GRPO_NONE: ([0.2, 0.4, 0.6], [0.4, 0.5, 0.6]),
    GRPO_TOP: ([0.5, 0.7, 0.9], [0.4, 0.5, 0.6]),
    PPO_NONE: ([0.5, 0.7], [0.4, 0.6]),
    PPO_TOP: ([0.1, 0.2, 0.3], [0.6, 0.7, 0.8]),
}
# Welch with n = 3 against n = 2: a = s²/3, b = s0²/2, ν = (a + b)² / (a²/2 + b²/1); t_{0.975, ν} from its tables
T_975_32_19 = 5.176232  # ν = 32/19 = 1.684211 (s² = 0.01 against s0² = 0.02: a = 1/300, b = 1/100)


@pytest.fixture(scope="module")
def grid(tmp_path_factory, empty_store):
    root = tmp_path_factory.mktemp("grid")
    for point, (finals, trains) in GRID.items():
        for seed, (final, train) in enumerate(zip(finals, trains, strict=True)):
            name = f"{point.replace('=', '-').replace(',', '_')}-seed{seed}"
            tags = {"sweep": "grid", "point": point, "seed": str(seed)}
            metrics = {"val/success": [(0, 0.1), (2, final)], "rollout/success": [(2, train)]}
            log_run(empty_store, root / name, name, tags, metrics)
    return root


@pytest.fixture(scope="module")
def grid_runs(grid):
    return load_runs(find_stores([grid]))


FINAL_AND_TRAIN = ["val_success_final", "train_success"]


def blocked(runs, baseline=None):
    columns = choose_columns(FINAL_AND_TRAIN, runs)
    return build_table(runs, baseline, columns, columns)


def test_a_factor_level_splits_the_grid_into_blocks_each_against_its_own_point(grid_runs):
    table = blocked(grid_runs, "filter.strategy=none")
    assert [(b.name, b.baseline, b.labels) for b in table.blocks] == [
        ("algo.name=grpo", GRPO_NONE, (GRPO_NONE, GRPO_TOP)),
        ("algo.name=ppo", PPO_NONE, (PPO_NONE, PPO_TOP)),
    ]
    assert table.baseline == "filter.strategy=none" and not table.automatic
    assert [r.label for r in table.rows] == [GRPO_NONE, GRPO_TOP, PPO_NONE, PPO_TOP]
    assert row(table, GRPO_NONE).differences == {} and row(table, PPO_NONE).differences == {}
    grpo, ppo = row(table, GRPO_TOP).differences, row(table, PPO_TOP).differences
    # GRPO, final: 0.7 - 0.4 = 0.3, se = sqrt(0.04/3 + 0.04/3), ν = 4, t_{0.975,4} = 2.776445 (as the one-factor sweep)
    final = grpo["val_success_final"]
    assert (final.delta, final.df, final.low, final.high) == pytest.approx((0.3, 4.0, -0.153392, 0.753392), abs=1e-5)
    # GRPO, train: 0.5 - 0.5 = 0, se = sqrt(0.01/3 + 0.01/3) = 0.0816497 -> ± 2.776445 · 0.0816497 = 0.226696
    assert grpo["train_success"].delta == pytest.approx(0.0, abs=1e-12)
    assert (grpo["train_success"].low, grpo["train_success"].high) == pytest.approx((-0.226696, 0.226696), abs=1e-5)
    # PPO, final: 0.2 - 0.6 = -0.4 against PPO's own none (not GRPO's 0.4), s² = 0.01 (n 3) vs 0.02 (n 2):
    # se = sqrt(1/300 + 1/100) = sqrt(1/75) = 0.115470, ν = 32/19, half = 5.176232 · 0.115470 = 0.597700
    final = ppo["val_success_final"]
    assert (final.delta, final.df) == pytest.approx((-0.4, 32 / 19))
    half = T_975_32_19 * math.sqrt(1 / 75)
    assert (final.low, final.high) == pytest.approx((-0.4 - half, -0.4 + half), abs=1e-6)
    assert (final.low, final.high) == pytest.approx((-0.997700, 0.197700), abs=1e-5)
    # PPO, train: 0.7 - 0.5 = 0.2, the same variances and so the same se, ν and half width
    train = ppo["train_success"]
    assert (train.delta, train.df, train.low, train.high) == pytest.approx(
        (0.2, 32 / 19, -0.397700, 0.797700), abs=1e-5
    )


def test_the_other_level_as_baseline(grid_runs):
    table = blocked(grid_runs, "filter.strategy=top_p")
    assert [b.baseline for b in table.blocks] == [GRPO_TOP, PPO_TOP]
    assert row(table, PPO_NONE).differences["val_success_final"].delta == pytest.approx(0.4)
    assert row(table, PPO_TOP).differences == {}
    # the algorithm as the level: a block per filter strategy, PPO against GRPO within each
    by_filter = blocked(grid_runs, "algo.name=grpo")
    assert [(b.name, b.baseline) for b in by_filter.blocks] == [
        ("filter.strategy=none", GRPO_NONE),
        ("filter.strategy=top_p", GRPO_TOP),
    ]
    assert row(by_filter, PPO_TOP).differences["val_success_final"].delta == pytest.approx(0.2 - 0.7)


def test_markdown_of_blocks(grid_runs):
    columns = choose_columns(["val_success_final"], grid_runs)
    text = render(build_table(grid_runs, "filter.strategy=none", columns, columns), "markdown")
    assert text == (
        "algo.name=grpo:\n"
        "\n"
        "| point | n | final val success | Δ final val success vs baseline [95% CI] |\n"
        "|---|---|---|---|\n"
        f"| {GRPO_NONE} | 3 | 0.4 ± 0.2 | baseline |\n"
        f"| {GRPO_TOP} | 3 | 0.7 ± 0.2 | +0.3 [-0.153, +0.753] |\n"
        "\n"
        "algo.name=ppo:\n"
        "\n"
        "| point | n | final val success | Δ final val success vs baseline [95% CI] |\n"
        "|---|---|---|---|\n"
        f"| {PPO_NONE} | 2 | 0.6 ± 0.141 | baseline |\n"
        f"| {PPO_TOP} | 3 | 0.2 ± 0.1 | -0.4 [-0.998, +0.198] |\n"
        "\n"
        "mean ± sample std over seeds; baseline: the point with filter.strategy=none in each block; Δ = mean "
        "difference with a Welch 95% interval; –: not logged\n"
    )


def test_csv_and_json_name_each_point_s_block(grid_runs):
    table = blocked(grid_runs, "filter.strategy=none")
    rows = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert next(csv.reader(io.StringIO(render(table, "csv"))))[:3] == ["block", "point", "n_runs"]
    assert [(r["block"], r["point"]) for r in rows] == [
        ("algo.name=grpo", GRPO_NONE),
        ("algo.name=grpo", GRPO_TOP),
        ("algo.name=ppo", PPO_NONE),
        ("algo.name=ppo", PPO_TOP),
    ]
    assert rows[2]["delta_val_success_final"] == "" and rows[2]["seeds"] == "0 1"
    assert float(rows[3]["delta_val_success_final"]) == pytest.approx(-0.4)
    assert float(rows[3]["delta_train_success_high"]) == pytest.approx(0.797700, abs=1e-5)
    data = json.loads(render(table, "json"))
    assert [r["block"] for r in data["rows"]] == ["algo.name=grpo"] * 2 + ["algo.name=ppo"] * 2
    assert data["rows"][3]["differences"]["val_success_final"]["df"] == pytest.approx(32 / 19)
    assert data["baseline"] == "filter.strategy=none" and data["automatic"] is False
    assert data["blocks"][1] == {"block": "algo.name=ppo", "baseline": PPO_NONE, "points": [PPO_NONE, PPO_TOP]}


def test_without_a_baseline_a_multi_factor_grid_is_blocked_by_filter_strategy_none(grid_runs):
    table = blocked(grid_runs)
    assert table.automatic and table.baseline == "filter.strategy=none"
    assert [b.baseline for b in table.blocks] == [GRPO_NONE, PPO_NONE]
    assert row(table, PPO_TOP).differences["val_success_final"].delta == pytest.approx(-0.4)
    text = render(table, "markdown")
    assert (
        "baseline: the point with filter.strategy=none in each block (by default: every block has exactly one);" in text
    )
    assert json.loads(render(table, "json"))["automatic"] is True
    # a block without a point at filter.strategy=none: one table against the first point with strategy=none, as before
    partial = blocked([r for r in grid_runs if r.label != PPO_NONE])
    assert not partial.blocks and partial.baseline == GRPO_NONE
    assert row(partial, PPO_TOP).differences["val_success_final"].delta == pytest.approx(0.2 - 0.4)
    assert not render(partial, "markdown").startswith("algo.name")


def test_a_full_point_label_keeps_one_table_and_one_baseline(grid_runs):
    table = blocked(grid_runs, PPO_NONE)
    assert not table.blocks and table.baseline == PPO_NONE
    assert row(table, GRPO_TOP).differences["val_success_final"].delta == pytest.approx(0.7 - 0.6)
    text = render(table, "markdown")
    assert text.startswith("| point | n |") and "algo.name=grpo:" not in text
    assert f"baseline: {PPO_NONE};" in text
    assert render(table, "csv").startswith("point,n_runs,")
    data = to_dict(table)
    assert "blocks" not in data and "block" not in data["rows"][0]


def test_a_block_without_the_level_is_refused(grid_runs):
    without = [r for r in grid_runs if r.label != PPO_NONE]
    with pytest.raises(ConfigError) as err:
        blocked(without, "filter.strategy=none")
    assert str(err.value) == (
        "baseline 'filter.strategy=none': the block 'algo.name=ppo' has no point at that level "
        "(its filter.strategy levels: top_p)"
    )


@pytest.mark.parametrize("level", ["filter.strategy=top_k", "algo.name=sac", "env.name=sokoban"])
def test_an_unknown_level_is_refused_with_the_levels_there_are(grid_runs, level):
    with pytest.raises(ConfigError) as err:
        blocked(grid_runs, level)
    assert str(err.value) == (
        f"unknown baseline '{level}': neither a point nor a factor's level "
        "(the levels: algo.name: grpo, ppo; filter.strategy: none, top_p)"
    )
    # not a single level: a point that is not there, named with the points there are
    with pytest.raises(ConfigError, match=r"unknown baseline 'algo.name=sac,filter.strategy=none': the points are"):
        blocked(grid_runs, "algo.name=sac,filter.strategy=none")


def test_labels_parse_into_a_sweep_and_factors():
    assert factors(GRPO_NONE) == ("", {"algo.name": "grpo", "filter.strategy": "none"})
    assert factors("rv: filter.strategy=none,x=[1,2]") == ("rv", {"filter.strategy": "none", "x": "[1,2]"})
    assert factors("frozenlake-grpo") == ("frozenlake-grpo", {})
    assert factors("base") == ("base", {})


def test_collapse_outcomes_against_each_block_s_baseline(grid_runs):
    table = blocked(grid_runs, "filter.strategy=none")
    text = collapse_by_block([read_run(r) for r in grid_runs], table.blocks)
    outcomes = text.split("\n\n")[1].splitlines()
    assert [line.split(" | ")[0][2:] for line in outcomes[2:]] == [GRPO_NONE, GRPO_TOP, PPO_NONE, PPO_TOP, "all"]
    # no run lost MI: each point's shares are 0 against its block's baseline, the baselines marked
    assert "| baseline | – | baseline | – |" in outcomes[2] and "| baseline | – | baseline | – |" in outcomes[4]
    assert "| +0 [" in outcomes[5] and outcomes[6].endswith("| – | – | – | – |")


def test_compare_cli_prints_a_table_per_block(grid, tmp_path, capsys):
    copy = shutil.copytree(grid, tmp_path / "grid")
    args = ["compare", str(copy), "--baseline", "filter.strategy=none", "--metrics", "val_success_final", "--collapse"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("algo.name=grpo:\n\n| point |") and "\nalgo.name=ppo:\n\n| point |" in out
    assert f"| {PPO_TOP} | 3 | 0.2 ± 0.1 | -0.4 [-0.998, +0.198] |" in out
    assert "Template collapse, run by run" in out
    assert main(["compare", str(copy), "--baseline", "algo.name=sac"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown baseline 'algo.name=sac'") and err.count("\n") == 1
