"""Find MLflow stores and load their runs into small typed records.

A comparison reads every `**/mlruns.db` under the folders it is given: a sweep's one store (`<sweep>/mlruns.db`, which
its runs write through the sweep's MLflow server), the stores of runs that keep their own
(`<sweep>/<point>-seed<k>/mlruns.db`: sweeps sent to other machines, and sweeps from before the shared store) and a
plain run's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ragen_lit.errors import ConfigError
from ragen_lit.run.store import STORE_NAME, sqlite_path, sqlite_uri

# the tag that marks `compare`'s own run, so a second comparison does not read the first one as a run
ROLE_TAG = "ragen_lit.role"
COMPARE_ROLE = "compare"
# the tag value of an evaluation (`python -m ragen_lit evaluate`): a row of its own, with no training curves
EVALUATION_ROLE = "evaluation"

History = list[tuple[int, float]]


@dataclass(frozen=True)
class RunRecord:
    """One MLflow run: `label` is its grid point (the `point` tag, or the run name for a plain `fit` run),
    `metrics` every logged key's history as (step, value) sorted by step, one value per step."""

    run_id: str
    name: str
    label: str
    seed: str
    store: str
    status: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, History] = field(default_factory=dict)


def store_folder(uri: str) -> Path | None:
    """The folder holding a sqlite store's database file; None for a tracking server."""
    path = sqlite_path(uri)
    return path.parent if path is not None else None


def find_stores(paths: Sequence[Path]) -> list[str]:
    """The sqlite URIs of every store under `paths` (a store file or any folder), shallowest first, so a
    sweep folder's own store (if any) comes before its runs' stores, then in natural order of their paths
    (`seed2` before `seed10`, so tables list a sweep's seeds in order); each store once."""
    found: list[str] = []
    for path in paths:
        if path.is_file():
            if path.name != STORE_NAME:
                raise ConfigError(f"{path} is a file but not an MLflow store: give a folder or a {STORE_NAME}")
            stores = [path]
        else:
            stores = sorted(path.rglob(STORE_NAME), key=lambda p: (len(p.parts), _natural(str(p))))
        found.extend(uri for uri in map(sqlite_uri, stores) if uri not in found)
    return found


def _natural(text: str) -> list[str | int]:
    """A sort key that orders the digit runs of `text` as numbers: "seed2" < "seed10"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def load_runs(uris: Sequence[str]) -> list[RunRecord]:
    """Every run of every experiment in the stores, in store order then start time; `compare` runs skipped."""
    from mlflow.tracking import MlflowClient

    records: list[RunRecord] = []
    for uri in uris:
        client = MlflowClient(tracking_uri=uri)
        experiment_ids = [e.experiment_id for e in client.search_experiments()]
        if not experiment_ids:
            continue
        for run in client.search_runs(experiment_ids, order_by=["attributes.start_time ASC"]):
            tags = dict(run.data.tags)
            if tags.get(ROLE_TAG) == COMPARE_ROLE:
                continue
            name = run.info.run_name or run.info.run_id
            records.append(
                RunRecord(
                    run_id=run.info.run_id,
                    name=name,
                    label=tags.get("point", name),
                    seed=tags.get("seed", ""),
                    store=uri,
                    status=run.info.status,
                    tags=tags,
                    params=dict(run.data.params),
                    metrics={key: _history(client, run.info.run_id, key) for key in sorted(run.data.metrics)},
                )
            )
    return records


def _history(client, run_id: str, key: str) -> History:
    # a resumed run may log a step twice: the later write wins, as it is the one the run went on from
    latest: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        if m.step not in latest or m.timestamp >= latest[m.step][0]:
            latest[m.step] = (m.timestamp, m.value)
    return [(step, value) for step, (_, value) in sorted(latest.items())]


def is_evaluation(run: RunRecord) -> bool:
    return run.tags.get(ROLE_TAG) == EVALUATION_ROLE


def select_runs(runs: list[RunRecord], selectors: Sequence[str]) -> list[RunRecord]:
    """Keep the runs whose id, run name or grid point is one of `selectors` (all runs when there is none)."""
    if not selectors:
        return runs
    for selector in selectors:
        if not any(selector in (r.run_id, r.name, r.label) for r in runs):
            raise ConfigError(f"'{selector}' is neither a path nor a run id, run name or point of the loaded runs")
    return [r for r in runs if {r.run_id, r.name, r.label} & set(selectors)]


def label_runs(runs: list[RunRecord]) -> list[RunRecord]:
    """When the runs come from several sweeps, prefix each swept run's label with its sweep, so equal points
    of two sweeps stay apart (runs outside any sweep keep their run name)."""
    sweeps = {r.tags["sweep"] for r in runs if r.tags.get("sweep")}
    if len(sweeps) < 2:
        return runs
    return [replace(r, label=f"{r.tags['sweep']}: {r.label}") if r.tags.get("sweep") else r for r in runs]
