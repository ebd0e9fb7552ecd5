"""`python -m ragen_lit compare` end to end on copies of the hand-made stores, and the shared figures."""

import json
import math
import shutil

import numpy as np
import pytest

from ragen_lit import figures
from ragen_lit.cli import main

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
