"""The evaluate-replay store holds what the README and its NOTES.md quote: each fit's own validation in its MLflow
store beside the two evaluations of its last checkpoint, and the evaluation reports."""

import json
import re
import sqlite3
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "docs/results/evaluate-replay-h200.tar.xz"
PATHS = ("fast", "exact")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("replay")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(folder, filter="data")
    return folder / "evaluate-replay-h200"


def successes(store: Path, path: str) -> dict[str, list[float]]:
    """`val/success` of the fit's run and `eval/success` of each evaluation run, from the path's MLflow store."""
    db = sqlite3.connect(store / path / "mlruns.db")
    rows = db.execute(
        "select m.key, m.value from metrics m join runs r on r.run_uuid = m.run_uuid "
        "where m.key in ('val/success', 'eval/success') order by r.start_time, m.step"
    ).fetchall()
    found: dict[str, list[float]] = {}
    for key, value in rows:
        found.setdefault(key, []).append(value)
    return found


def reports(store: Path, path: str) -> list[dict]:
    return [json.loads((store / path / f"eval-{path}-{n}.json").read_text())["environments"][0] for n in (1, 2)]


@pytest.mark.parametrize("path", PATHS)
def test_the_store_holds_the_fit_and_both_evaluations(store, path):
    found = successes(store, path)
    (run_json,) = (store / path).glob("*/run.json")
    final = json.loads(run_json.read_text())["finished"]["summary"]["val_success_final"]
    assert found["val/success"][-1] == final
    first, second = reports(store, path)
    assert found["eval/success"] == [first["success"], second["success"]]
    assert first["successes"] == second["successes"], "two evaluations agree episode for episode"


def test_the_exact_path_replays_the_fit_and_the_notes_quote_the_store(store):
    notes = (store / "NOTES.md").read_text()
    for path in PATHS:
        fit = successes(store, path)["val/success"]
        evaluation = reports(store, path)[0]
        row = f"| {path} | {fit[0]:.4f} | {fit[-1]:.4f} | {evaluation['success']:.4f} | {evaluation['success']:.4f} |"
        assert row in notes
        episodes = len(evaluation["successes"])
        assert f"{round(fit[-1] * episodes)} against {round(sum(evaluation['successes']))} of {episodes} |" in notes
    assert reports(store, "exact")[0]["success"] == successes(store, "exact")["val/success"][-1]


def test_the_readme_quotes_the_store(store):
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    exact = reports(store, "exact")[0]["success"]
    fast_fit, fast_eval = successes(store, "fast")["val/success"][-1], reports(store, "fast")[0]["success"]
    assert f"on an H200, {exact:.3f} and {exact:.3f} over 256 episodes, store `evaluate-replay-h200`" in readme
    assert f"{fast_eval:.3f} against {fast_fit:.3f}" in readme
