"""`python -m ragen_lit compare` end to end on copies of the hand-made stores, and the shared figures."""

import json
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest

from ragen_lit import figures
from ragen_lit.analysis import plots
from ragen_lit.analysis.runs import RunRecord
from ragen_lit.cli import main
from ragen_lit.figures import collapse as collapse_figures

from .conftest import BASE, TOP_P

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5_000, path


@pytest.fixture
def sweep_copy(sweep, tmp_path):
    """compare writes into the store and beside it: keep the shared fixture untouched."""
    return shutil.copytree(sweep, tmp_path / "sweep")


@pytest.mark.slow
def test_compare_cli_writes_table_figures_and_a_compare_run(sweep_copy, capsys):
    assert main(["compare", str(sweep_copy), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in data["rows"]] == [BASE, TOP_P] and data["baseline"] == BASE
    out = sweep_copy / "compare"
    for name in ("val_success.png", "mi_vs_entropy.png", "kept_ratio_rv.png", "gradient_buckets.png"):
        assert_png(out / name)
    assert json.loads((out / "compare.json").read_text()) == data

    from mlflow.tracking import MlflowClient

    # the first store found (sorted: none-seed0) holds the compare run; its artifacts live beside the store
    store = sweep_copy / "none-seed0"
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlruns.db'}")
    experiment = client.get_experiment_by_name("compare")
    assert experiment.artifact_location == (store / "artifacts").as_uri()
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "compare" and run.data.tags["baseline"] == BASE
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"val_success.png", "compare.json"}

    # a second comparison does not read the first one's run as a training run
    assert main(["compare", str(sweep_copy), "--format", "csv", "--baseline", TOP_P]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1].startswith(f"{BASE},3,")


def test_compare_cli_markdown_out_folder_and_run_selection(sweep_copy, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["compare", str(sweep_copy), "none-seed1", "top_p-0.9-seed2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    # one run per point: no std and no interval
    assert f"| {BASE} | 1 | 0.4 |" in text and "(no interval: n < 2)" in text
    assert (out / "compare.md").read_text() == text
    assert_png(out / "val_success.png")
    # two diagnostics points per run: too few for a start, so the raw MI-entropy paths and no collapse curves
    assert_png(out / "mi_vs_entropy.png")
    assert not (out / "collapse_curves.png").exists()


def test_no_gradient_figure_without_grad_metrics(solo, tmp_path, capsys):
    copy = shutil.copytree(solo, tmp_path / "solo")
    assert main(["compare", str(copy)]) == 0
    assert "| frozenlake-grpo | 1 | 0.5 | 0.5 | – |" in capsys.readouterr().out
    assert sorted(p.name for p in (copy / "compare").glob("*.png")) == ["val_success.png"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--baseline", "nope"], "unknown baseline 'nope'"),
        (["--format", "xml"], "unknown --format 'xml': use one of markdown, csv, json"),
        (["--metrics", "bogus"], "unknown metric 'bogus'"),
        (["no-such-run"], "'no-such-run' is neither a path nor a run id, run name or point"),
    ],
)
def test_bad_input_is_one_line(sweep, args, message, capsys):
    assert main(["compare", str(sweep), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_no_store_and_unknown_path(tmp_path, capsys):
    assert main(["compare", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: no MLflow store (mlruns.db) under {tmp_path}\n"
    assert main(["compare", str(tmp_path / "typo")]) == 2
    assert "is not a path" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["store", "folder"])
def test_a_corrupt_store_is_one_line_and_nothing_is_written(tmp_path, capsys, where):
    store = tmp_path / "run" / "mlruns.db"
    store.parent.mkdir()
    store.write_bytes(b"not an sqlite database " * 64)
    target = store if where == "store" else tmp_path
    assert main(["compare", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: compare: the MLflow store {store} is not a readable sqlite database (file is not a database); "
        "move it away\n"
    )
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["run", "run/mlruns.db"]


def test_seed_band_by_hand():
    # step 0: runs 1 and 3 -> mean 2, s = sqrt(((1-2)² + (3-2)²) / 1) = sqrt(2); step 1: one run -> no std
    steps, means, stds = figures.seed_band([[(0, 1.0), (1, 2.0)], [(0, 3.0)]])
    assert steps.tolist() == [0.0, 1.0] and means.tolist() == [2.0, 2.0]
    assert stds[0] == pytest.approx(math.sqrt(2)) and np.isnan(stds[1])


def test_single_run_figures(tmp_path):
    """The form the end of `fit` uses: one run's curves, no grouping."""
    assert_png(figures.save_png(figures.success_curves({"run": [(0, 0.25), (1, 0.25), (2, 0.5)]}), tmp_path / "a.png"))
    plane = figures.mi_entropy_plane({"run": [([6.4, 6.7], [0.0, 0.67])]})
    assert_png(figures.save_png(plane, tmp_path / "b.png"))
    bars = figures.gradient_buckets({"run": [1.0, 2.0, math.nan]}, {"run": [0.1, 0.2, 0.3]})
    assert_png(figures.save_png(bars, tmp_path / "c.png"))


# ---- the template-collapse figures: hand-made runs of 7 diagnostics points (steps 1..7), chance 0.25 ----
# With a start of 3 points and levels over 3, the levels are defined at the 6th and 7th points (steps 6 and 7).

STEPS = list(range(1, 8))


def diagnostics_run(label, name, acc, cond, token, alarm=None):
    """A run whose first-turn diagnostics and token entropy were logged at `STEPS` (token entropy also at the
    steps between, which the figures must not read)."""
    metrics = {
        "collapse/first_turn/retrieval_acc": list(zip(STEPS, acc)),
        "collapse/first_turn/retrieval_chance": [(s, 0.25) for s in STEPS],
        "collapse/first_turn/cond_entropy": list(zip(STEPS, cond)),
        "actor/entropy": sorted([*zip(STEPS, token), *((s + 100, 99.0) for s in STEPS)]),
    }
    if alarm is not None:
        metrics["collapse/alarm"] = [(s, float(s >= alarm)) for s in STEPS]
    return RunRecord(name, name, label, "0", "", "FINISHED", metrics=metrics)


# A: retrieval's level 0.5 / 0.25 = 2 at both levels; H(Z|X) start 2, levels 4/2 = 2 then (4+4+1)/3/2 = 1.5
RUN_A = ("a", [1, 1, 1, 0.5, 0.5, 0.5, 0.5], [2, 2, 2, 4, 4, 4, 1], [1] * 7)
# B: retrieval 1/0.25 = 4; H(Z|X) start 1, levels 1 then 2; token entropy start 1, level 3: above the band at step 6
RUN_B = ("b", [1] * 7, [1, 1, 1, 1, 1, 1, 4], [1, 1, 1, 3, 3, 3, 3])
# C: H(Z|X) start 2, level 1 / 2 = 0.5 at step 6: below the band
RUN_C = ("c", [1] * 7, [2, 2, 2, 1, 1, 1, 1], [1] * 7)


@pytest.fixture
def diagnosed():
    return {
        "p": [diagnostics_run("p", *RUN_A), diagnostics_run("p", *RUN_B, alarm=7)],
        "q": [diagnostics_run("q", *RUN_C), RunRecord("x", "x", "q", "1", "", "FINISHED")],
    }


def test_seed_quantiles_by_hand():
    # step 0: 1, 3, 5 -> quartiles 2, 3, 4; step 1: the NaN is left out -> 2, 2, 2; step 2: only NaN -> NaN
    curves = [[(0, 1.0), (1, 2.0), (2, math.nan)], [(0, 3.0), (1, math.nan)], [(0, 5.0)]]
    steps, low, middle, high = collapse_figures.seed_quantiles(curves)
    assert steps.tolist() == [0.0, 1.0, 2.0]
    assert (low[:2].tolist(), middle[:2].tolist(), high[:2].tolist()) == ([2.0, 2.0], [3.0, 2.0], [4.0, 2.0])
    assert np.isnan([low[2], middle[2], high[2]]).all()


def test_log_limits_hold_every_positive_value_and_the_reference_levels():
    assert collapse_figures.log_limits([0.5, 4.0, -1.0, math.nan, 0.0], (2.0,), margin=2.0) == (0.25, 8.0)
    assert collapse_figures.log_limits([3.0], (0.8, 2.0), margin=2.0) == (0.4, 6.0)


def test_collapse_series_by_hand():
    run = diagnostics_run("p", "r", [1, 0.5, math.nan, 0.25], [2, 2, 2, 6], [1, 2, 3, 4])
    series = plots.collapse_series(run)
    # retrieval over chance 0.25 where it is finite; H(Z|X) over its start 2; token entropy over (1+2+3)/3 = 2,
    # at the diagnostics steps only (not the 99s logged between them)
    assert series["retrieval"] == [(1, 4.0), (2, 2.0), (4, 1.0)]
    assert series["cond_entropy"] == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 3.0)]
    assert series["token_entropy"] == [(1, 0.5), (2, 1.0), (3, 1.5), (4, 2.0)]
    # fewer than 3 points: no start, no stream
    assert plots.over_start([(1, 1.0), (2, 2.0)]) == [] and plots.over_start([(1, 0.0)] * 3) == []


def test_end_points_and_median_paths_by_hand(diagnosed):
    # (H(Z|X) level / start, retrieval level / chance, token entropy level / start) at step 7
    assert plots.end_points(diagnosed) == {"p": [(1.5, 2.0, 1.0), (2.0, 4.0, 3.0)], "q": [(0.5, 4.0, 1.0)]}
    # p at step 6: A (2, 2), B (1, 4); at step 7: A (1.5, 2), B (2, 4) -> the medians of two runs are their means
    assert plots.median_paths(diagnosed) == {"p": ([1.5, 1.75], [3.0, 3.0]), "q": ([0.5, 0.5], [4.0, 4.0])}
    assert plots.end_points({"p": [RunRecord("x", "x", "p", "0", "", "FINISHED")]}) == {"p": []}


def test_firings_go_on_the_panel_of_the_stream_that_fired(diagnosed):
    from ragen_lit.analysis.collapse import read_run

    (a, b), (c, _) = diagnosed["p"], diagnosed["q"]
    assert plots.firings(read_run(a)) == {"retrieval": [], "cond_entropy": [], "token_entropy": []}
    # B: its alarm at 7; token entropy above the band at 6 fires the two-sided monitor only
    assert plots.firings(read_run(b)) == {
        "retrieval": [("alarm", 7)],
        "cond_entropy": [],
        "token_entropy": [("entropy two-sided", 6)],
    }
    # C: H(Z|X) below the band at 6 fires both entropy monitors
    assert plots.firings(read_run(c)) == {
        "retrieval": [],
        "cond_entropy": [("entropy falls", 6), ("entropy two-sided", 6)],
        "token_entropy": [],
    }


def test_collapse_figures_are_written_with_levels_and_skipped_without(diagnosed, tmp_path):
    names = [p.name for p in plots.write_figures(diagnosed, tmp_path / "with")]
    assert names == ["mi_vs_entropy.png", "collapse_curves.png"]
    for name in names:
        assert_png(tmp_path / "with" / name)
    # two diagnostics points: no start, so no curves; the plane falls back to the raw (entropy, retrieval) paths
    short = {
        label: [replace(r, metrics={k: h[:2] for k, h in r.metrics.items()}) for r in runs]
        for label, runs in diagnosed.items()
    }
    assert [p.name for p in plots.write_figures(short, tmp_path / "short")] == ["mi_vs_entropy.png"]
    bare = {"p": [RunRecord("x", "x", "p", "0", "", "FINISHED", metrics={"actor/entropy": [(1, 1.0)]})]}
    assert plots.write_figures(bare, tmp_path / "bare") == []


def test_regime_plane_limits_hold_every_point():
    ends = {"p": [(0.01, 30.0, 1.0), (5e2, 0.1, 3.0)], "empty": [], "q": [(1.0, 0.0, 0.1)]}
    fig = collapse_figures.regime_plane(ends, {"p": ([1.0, 0.01], [12.0, 30.0])})
    (ax,) = fig.axes
    (xlo, xhi), (ylo, yhi) = ax.get_xlim(), ax.get_ylim()
    assert xlo < 0.01 and xhi > 5e2 and ylo < 0.1 and yhi > 30.0
    # with nothing far out, the limits still show every region: 2.5x beyond the band, 4x beyond the MI line
    (ax,) = collapse_figures.regime_plane({"p": [(1.0, 3.0)]}).axes
    assert ax.get_xlim()[0] < 0.8 / 2.5 and ax.get_xlim()[1] > 2.0 * 2.5
    assert ax.get_ylim()[0] < 2.0 / 4 and ax.get_ylim()[1] > 2.0 * 4


def test_a_wide_plane_keeps_its_tick_labels_and_region_names_apart():
    """An end point four decades below the band: ticks at the powers of ten alone, and the narrow regions (template
    collapse, entropy blow-up) named upwards instead of across."""
    (ax,) = collapse_figures.regime_plane({"p": [(1e-4, 1.2), (1.0, 5.0)]}).axes
    ticks = [v for v in ax.xaxis.get_majorticklocs() if ax.get_xlim()[0] <= v <= ax.get_xlim()[1]]
    assert ticks and all(np.isclose(np.log10(v), round(np.log10(v))) for v in ticks)
    rotated = {text.get_text() for text in ax.texts if text.get_rotation() == 90}
    assert rotated == {"template collapse", "entropy blow-up"}
    # a plane of ordinary width writes every name across, with ticks at 1, 2 and 5 x the powers of ten
    (ax,) = collapse_figures.regime_plane({"p": [(1.0, 3.0)]}).axes
    assert not [text for text in ax.texts if text.get_rotation() == 90]
    assert any(np.isclose(v, 2.0) for v in ax.xaxis.get_majorticklocs())


def test_collapse_curves_draws_a_panel_per_stream_and_a_row_per_point(tmp_path):
    panels = [
        ("retrieval / chance", {"p": [[(1, 4.0), (6, 0.0)]], "none": []}, [("alarm", "p", 6), ("alarm", "p", 6)]),
        ("H(Z|X) / start", {"p": [[(1, 1.0), (6, 0.5)], [(1, 1.0), (6, 3.0)]]}, [("entropy falls", "p", 6)]),
        ("token entropy / start", {}, []),
    ]
    fig = collapse_figures.collapse_curves(panels, ["none", "p"], monitor_counts={"alarm": (2, 2)})
    assert len(fig.axes) == 3 and [ax.get_yscale() for ax in fig.axes] == ["log"] * 3
    # the two alarms at one step are one marker with "2" beside it; the empty panel says so
    assert "2" in [t.get_text() for t in fig.axes[0].texts]
    assert "not logged" in [t.get_text() for t in fig.axes[2].texts]
    legends = [[t.get_text() for t in legend.get_texts()] for legend in fig.legends]
    assert legends[0] == ["p (n=2)"] and legends[1][0] == "alarm fired (2/2 runs)"
    assert_png(figures.save_png(fig, tmp_path / "curves.png"))
