"""Where an evaluation is kept: its JSON report, and one MLflow run per environment.

The MLflow run goes to the evaluated run's own store and experiment (recorded in its run.json), or, for a model that
is not a run's, to the config's (`logging.tracking_uri`, default `<logging.output_dir>/mlruns.db`); an explicit
`logging.tracking_uri=` override wins in both cases. It is tagged `ragen_lit.role=evaluation`, with the `point`
(`compare`'s row label) `<the run's point or run name> (<evaluation_label>)` and the run's `seed` and `sweep`, so
that `compare` puts it on its own row beside the training runs; its metrics are `eval/*` (`EnvEvaluation.metrics`) at
the step of the checkpoint's iteration, its params the resolved config and the evaluation's settings, and the JSON
report is its artifact `evaluation.json`.

The report's path and the stores are checked before any work (`check_report_path`, `check_store`), and the report is
written before anything is logged (`log_evaluations`): MLflow never holds an evaluation whose report is missing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ragen_lit.analysis.runs import EVALUATION_ROLE, ROLE_TAG
from ragen_lit.config import Config, LoggingConfig, flat_dict
from ragen_lit.errors import ConfigError, RunError

if TYPE_CHECKING:  # the checks before any work import no torch
    from ragen_lit.evaluation.policy import EvaluatedPolicy
    from ragen_lit.evaluation.report import EnvEvaluation

REPORT_FOLDER = "evaluations"
ARTIFACT = "evaluation.json"
_PARAM_BATCH = 100  # MLflow takes at most this many params per call
_METRIC_BATCH = 1000  # and this many metrics: K samples log 3 K pass@k metrics (value and interval)


def report_path(out: str | None, run_json: Path | None, logging: LoggingConfig) -> tuple[Path, str]:
    """(the report's path, the setting that names it, for errors): `--out`, or `<run folder>/evaluations/
    eval-<time>.json` for a run, `<logging.output_dir>/evaluations/...` otherwise."""
    if out is not None:
        return Path(out).expanduser(), f"--out {out}"
    stamp = f"eval-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if run_json is not None:
        return run_json.parent / REPORT_FOLDER / stamp, f"--model {run_json.parent} (its report, without --out)"
    key = f"logging.output_dir={logging.output_dir!r} (the report's folder without --out)"
    return Path(logging.output_dir) / REPORT_FOLDER / stamp, key


def check_report_path(path: Path, key: str) -> None:
    """The report `path` can be written (`key`: the setting that names it): not a folder, not under a file, in a
    folder that exists or can be made and takes a new file. Writes nothing."""
    from ragen_lit.run.store import check_folder

    if path.is_dir():
        raise ConfigError(f"{key}: a folder; give the JSON file to write (e.g. {path / 'evaluation.json'})")
    above = next(folder for folder in path.parents if folder.exists())
    if not above.is_dir():
        raise ConfigError(f"{key}: {above} is a file, not a folder; give a path whose folders are folders")
    check_folder(path.parent, key)  # a new file can be made there (the probe leaves no trace)


def store_of(logging: LoggingConfig, run_json: Path | None, overrides: list[str]) -> str:
    """The MLflow tracking URI of the evaluation (module docstring); `run_json`: the evaluated run's record, if any.
    Makes no folder: the default store's is made when the evaluation is logged."""
    from ragen_lit.run.store import default_store, sqlite_uri

    explicit = any(o.split("=", 1)[0] == "logging.tracking_uri" for o in overrides)
    if run_json is not None and not explicit:
        try:
            return json.loads(run_json.read_text())["tracking_uri"]
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError(f"--model: {run_json} does not name the run's MLflow store ({err})") from None
    return logging.tracking_uri or sqlite_uri(default_store(logging))


def check_store(uri: str) -> None:
    """An sqlite store `uri` can be written and, where it exists, reads as a database (`fit`'s check of its store);
    other stores are left to MLflow. Writes nothing."""
    from ragen_lit.run.store import check_sqlite_store, sqlite_path

    path = sqlite_path(uri)
    if path is not None:
        check_sqlite_store(path, f"MLflow store {uri}")


def _source_run(client, run_json: Path | None) -> tuple[str | None, dict[str, str], str | None, str | None]:
    """(MLflow run id, tags, run name, experiment id) of the run recorded in `run_json`, where its store holds it."""
    if run_json is None:
        return None, {}, None, None
    run_id = json.loads(run_json.read_text()).get("mlflow_run_id")
    try:
        run = client.get_run(run_id)
    except Exception:  # the run lives in another store (a user-given tracking URI): the evaluation stands alone
        return run_id, {}, run_json.parent.name, None
    return run_id, dict(run.data.tags), run.info.run_name, run.info.experiment_id


def evaluation_label(result: EnvEvaluation, iteration: int | None) -> str:
    """What tells one evaluation of a run from another: the environment, the checkpoint's iteration, the episodes, the
    samples and the temperature, e.g. `evaluation on frozenlake at iteration 20: 64 episodes x 4, T=1`. Evaluations
    that agree on all of it (the seeds of one grid point, each at its end) share a `compare` row; a run's other
    checkpoints or settings get rows of their own instead of passing for more seeds."""
    at = f" at iteration {iteration}" if iteration is not None else ""
    return f"evaluation on {result.env}{at}: {len(result.seeds)} episodes x {result.samples}, T={result.temperature:g}"


def log_evaluation(
    cfg: Config, result: EnvEvaluation, model: str, run_json: Path | None, evaluated: EvaluatedPolicy, uri: str
) -> tuple[str, str]:
    """One finished MLflow run holding `result`, with `cfg`, the config it was played with, as its params; returns
    (tracking URI, run id)."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from ragen_lit.run.provenance import commit_tags
    from ragen_lit.run.store import ensure_experiment, tracking_uri

    client = MlflowClient(tracking_uri=uri)
    source_id, source_tags, source_name, experiment_id = _source_run(client, run_json)
    if experiment_id is None:
        if uri == tracking_uri(cfg.logging):  # the default store keeps its artifacts under logging.output_dir
            ensure_experiment(cfg.logging)  # as `fit` does
        experiment = client.get_experiment_by_name(cfg.logging.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(cfg.logging.experiment)
    base = source_tags.get("point") or source_name or model
    tags = {
        ROLE_TAG: EVALUATION_ROLE,
        "point": f"{base} ({evaluation_label(result, evaluated.iteration)})",
        "ragen_lit.evaluated_model": str(Path(model).expanduser().resolve()) if source_id else model,
        "ragen_lit.evaluated_weights": evaluated.description,
        **{key: source_tags[key] for key in ("seed", "sweep") if key in source_tags},
    }
    if source_id:
        tags["ragen_lit.evaluated_run_id"] = source_id
    tags.update(commit_tags())
    run = client.create_run(experiment_id, run_name=f"eval-{source_name or result.env}", tags=tags)
    run_id = run.info.run_id
    params = {**flat_dict(cfg), "evaluate.samples": result.samples, "evaluate.temperature": result.temperature}
    params.update({"evaluate.sampling_seed": result.sampling_seed, "evaluate.episodes": len(result.seeds)})
    items = [Param(key, str(value)) for key, value in params.items()]
    for start in range(0, len(items), _PARAM_BATCH):
        client.log_batch(run_id, params=items[start : start + _PARAM_BATCH])
    step, now = evaluated.iteration or 0, int(time.time() * 1000)
    metrics = [Metric(k, v, now, step) for k, v in result.metrics().items()]
    for start in range(0, len(metrics), _METRIC_BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + _METRIC_BATCH])
    client.log_dict(run_id, result.to_json(), ARTIFACT)
    client.set_terminated(run_id, "FINISHED")
    return uri, run_id


def log_evaluations(
    path: Path,
    model: str,
    run_json: Path | None,
    evaluated: EvaluatedPolicy,
    results: list[tuple[Config, EnvEvaluation]],
    stores: list[str],
) -> list[tuple[str, str]]:
    """Write the JSON report, then log one MLflow run per environment (`log_evaluation`) and write the report again
    with their ids; returns the (tracking URI, run id) of each. A store that refuses the runs is a RunError naming
    the report, which is kept."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    record = report_record(model, evaluated, [result for _, result in results])
    write_report(path, record)
    logged = []
    for (cfg, result), uri in zip(results, stores, strict=True):
        try:
            logged.append(log_evaluation(cfg, result, model, run_json, evaluated, uri))
        except (MlflowException, SQLAlchemyError, OSError) as err:
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise RunError(
                f"the report is written to {path}, but the MLflow store {uri} refused the evaluation run: {first_line}"
            ) from err
    record["mlflow"] = [{"tracking_uri": uri, "run_id": run_id} for uri, run_id in logged]
    write_report(path, record)
    return logged


def report_record(model: str, evaluated: EvaluatedPolicy, results: list[EnvEvaluation]) -> dict:
    """The JSON report: what was evaluated, where and when, each environment's result; `mlflow` (the runs that log
    it) empty until they are logged."""
    from ragen_lit.run.provenance import source_commit

    commit = source_commit()
    return {
        "model": model,
        "weights": evaluated.description,
        "iteration": evaluated.iteration,
        "device": str(evaluated.device),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": commit[0] if commit else None,
        "commit_dirty": commit[1] if commit else None,
        "environments": [result.to_json() for result in results],
        "mlflow": [],
    }


def write_report(path: Path, record: dict) -> None:
    """The JSON report, written whole or not at all (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=2))
    os.replace(partial, path)
