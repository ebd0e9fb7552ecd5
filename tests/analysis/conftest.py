"""A hand-made sweep on disk: 2 grid points x 3 seeds, one sqlite MLflow store per run (the sweep layout),
plus a plain `fit` run (no tags) in a folder of its own. Every value is chosen so the tests can do the
arithmetic by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

BASE = "filter.strategy=none"
TOP_P = "filter.strategy=top_p,filter.value=0.9"

# val/success at steps 0, 1, 2 per seed: finals 0.2/0.4/0.6 (base) and 0.5/0.7/0.9 (top_p)
VAL = {
    BASE: [[0.1, 0.3, 0.2], [0.1, 0.2, 0.4], [0.1, 0.5, 0.6]],
    TOP_P: [[0.1, 0.5, 0.5], [0.1, 0.6, 0.7], [0.1, 0.8, 0.9]],
}


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """One freshly migrated empty store: copying it is much faster than migrating a new one per run."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("empty") / "mlruns.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def log_run(
    empty: Path, folder: Path, run_name: str, tags: dict[str, str], metrics: dict[str, list[tuple[int, float]]]
) -> None:
    from mlflow.tracking import MlflowClient

    folder.mkdir(parents=True)
    shutil.copy(empty, folder / "mlruns.db")
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlruns.db'}")
    experiment = client.create_experiment("ragen_lit", artifact_location=(folder / "artifacts").as_uri())
    run = client.create_run(experiment, run_name=run_name, tags=tags)
    client.log_param(run.info.run_id, "filter.strategy", tags.get("point", "none").split(",")[0].split("=")[-1])
    for key, history in metrics.items():
        for step, value in history:
            client.log_metric(run.info.run_id, key, value, step=step)
    client.set_terminated(run.info.run_id)


def point_metrics(point: str, seed: int) -> dict[str, list[tuple[int, float]]]:
    metrics = {
        "val/success": list(enumerate(VAL[point][seed])),
        # last three: 0.3 + 0.1*seed, 0.6 + 0.1*seed, 0.9 + 0.1*seed -> mean 0.6 + 0.1*seed
        "rollout/success": [(1, 0.0), (2, 0.3 + 0.1 * seed), (3, 0.6 + 0.1 * seed), (4, 0.9 + 0.1 * seed)],
        "actor/entropy": [(1, 3.0), (2, 2.0 + seed)],
        "time/iteration_s": [(1, 10.0), (2, 20.0)],
        "collapse/first_turn/cond_entropy": [(1, 6.0), (2, 5.0 + 0.5 * seed)],
        "collapse/first_turn/retrieval_acc": [(1, 0.2), (2, 0.4 + 0.1 * seed)],
        "collapse/first_turn/retrieval_chance": [(1, 0.25), (2, 0.25)],
        "collapse/first_turn/mi_est": [(1, 0.0), (2, 0.1 * seed)],
    }
    if point == TOP_P:
        metrics["filter/kept_ratio"] = [(1, 0.5), (2, 1.0)]
        metrics["filter/rv_cv"] = [(1, 0.2), (2, 0.4 + 0.3 * seed)]
        for q in range(1, 7):
            metrics[f"grad/task_norm/q{q}"] = [(1, float(q)), (2, float(q) + 1)]
            metrics[f"grad/reg_norm/q{q}"] = [(1, 0.1 * q)]
        if seed == 2:  # one seed without MI diagnostics: that cell has n=2
            for key in [k for k in metrics if k.startswith("collapse/")]:
                del metrics[key]
    return metrics


@pytest.fixture(scope="session")
def sweep(tmp_path_factory, empty_store) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    for point, slug in ((BASE, "none"), (TOP_P, "top_p-0.9")):
        for seed in range(3):
            tags = {"sweep": "rv", "point": point, "seed": str(seed)}
            log_run(empty_store, root / f"{slug}-seed{seed}", f"{slug}-seed{seed}", tags, point_metrics(point, seed))
    return root


@pytest.fixture(scope="session")
def solo(tmp_path_factory, empty_store) -> Path:
    """A plain `fit` run: no sweep tags, grouped by its run name."""
    root = tmp_path_factory.mktemp("solo")
    log_run(empty_store, root / "fit", "frozenlake-grpo", {}, {"val/success": [(0, 0.25), (2, 0.5)]})
    return root
