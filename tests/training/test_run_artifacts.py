"""What a `fit` leaves in MLflow besides metrics: artifacts under `<output_dir>/artifacts` (never `./mlruns`),
and the run's own figures under `figures/`; a figure whose metrics are missing is skipped, not an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ragen_lit.cli import fit
from ragen_lit.config import load_config
from ragen_lit.training.run_figures import draw_run_figures

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
ALL_FIGURES = {"success.png", "kept_ratio_rv.png", "mi_vs_entropy.png", "gradient_buckets.png"}


def _history(n: int = 3) -> list[dict[str, float]]:
    return [
        {
            "iteration": i,
            "rollout/success": 0.1 * i,
            "filter/kept_ratio": 0.5,
            "filter/rv_cv": 0.3 + 0.1 * i,
            "collapse/first_turn/cond_entropy": 2.0 - 0.2 * i,
            "collapse/first_turn/retrieval_acc": 0.4 + 0.1 * i,
            "grad/task_norm/q1": 1.0,
            "grad/task_norm/q2": 2.0,
            "grad/reg_norm/q2": 0.5,
        }
        for i in range(1, n + 1)
    ]


def test_every_figure_is_drawn_from_a_full_history(tmp_path):
    written = draw_run_figures(_history(), {0: {"val/success": 0.0}, 3: {"val/success": 0.5}}, "run", tmp_path)
    assert {p.name for p in written} == ALL_FIGURES
    assert all(p.read_bytes().startswith(PNG) for p in written)


def test_missing_metrics_skip_their_figures_only(tmp_path):
    history = [{"iteration": 1, "rollout/success": 0.5, "filter/kept_ratio": 0.5}]
    assert {p.name for p in draw_run_figures(history, {}, "run", tmp_path)} == {"success.png", "kept_ratio_rv.png"}
    assert draw_run_figures([], {}, "run", tmp_path / "empty") == []


def test_the_gradient_figure_labels_its_buckets_with_their_mean_rv(monkeypatch):
    from ragen_lit import figures
    from ragen_lit.training.run_figures import gradient_figure

    history = [{**h, "grad/rv/q1": 0.01 * i, "grad/rv/q2": 0.2} for i, h in enumerate(_history(), start=1)]
    fig = gradient_figure(history, "run")
    labels = [tick.get_text() for tick in fig.axes[0].get_xticklabels()]
    assert labels == ["q1\n0.02", "q2\n0.2"]  # q1's RV: the mean of .01, .02, .03
    assert [t.get_text() for t in gradient_figure(_history(), "run").axes[0].get_xticklabels()] == ["q1", "q2"]
    with pytest.raises(ValueError):  # one RV per bucket
        figures.gradient_buckets({"run": [1.0, 2.0]}, {"run": [0.5, 0.5]}, [0.1])


def test_a_figure_that_fails_to_draw_only_warns(tmp_path, monkeypatch):
    from ragen_lit import figures

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(figures, "mi_entropy_plane", broken)
    with pytest.warns(UserWarning, match="mi_vs_entropy.png skipped: RuntimeError: boom"):
        written = {p.name for p in draw_run_figures(_history(), {}, "run", tmp_path)}
    assert written == ALL_FIGURES - {"mi_vs_entropy.png"}


@pytest.mark.slow
def test_fit_keeps_artifacts_under_its_output_dir_and_logs_its_figures(tmp_path, tiny_model_dir, monkeypatch):
    cwd, out = tmp_path / "elsewhere", tmp_path / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    cfg = load_config(
        str(ROOT / "conf" / "frozenlake.yaml"),
        [
            f"model.path={tiny_model_dir}",
            f"logging.output_dir={out}",
            "trainer.iterations=2",
            "trainer.threads=1",
            "rollout.groups=2",
            "rollout.group_size=4",
            "rollout.max_turns=2",
            "rollout.max_new_tokens=48",
            "validation.num_envs=4",
            "validation.every_n_iterations=1",
            "diagnostics.every_n_iterations=1",
            "diagnostics.num_samples=8",
            "diagnostics.gradient_buckets=true",
            "optim.num_minibatches=2",
            "optim.micro_batch_size=4",
        ],
    )
    fit(cfg)
    assert list(cwd.iterdir()) == []  # no ./mlruns, nothing else either
    assert len(list((out / "artifacts").glob("*/artifacts/summary.json"))) == 1

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
    experiment = client.get_experiment_by_name("ragen_lit")
    assert experiment.artifact_location == (out / "artifacts").resolve().as_uri()
    run = client.search_runs([experiment.experiment_id])[0]
    logged = {Path(f.path).name for f in client.list_artifacts(run.info.run_id, "figures")}
    assert logged == ALL_FIGURES
    local = Path(client.download_artifacts(run.info.run_id, "figures", str(tmp_path / "download")))
    assert all((local / name).read_bytes().startswith(PNG) for name in ALL_FIGURES)
