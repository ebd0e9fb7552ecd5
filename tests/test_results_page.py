"""docs/REPRODUCTION.md's tables are what `compare` prints from the stores committed next to it.

Each case extracts one store of docs/results/ and builds the table `compare` prints for one sweep (the same
functions, without the figures); every one of its rows must appear verbatim on the page. A number edited by
hand, a table pasted from another store, or a change to `compare` that would re-draw the page differently
fails here.
"""

import tarfile
from pathlib import Path

import pytest

from ragen_lit.analysis.compare import build_table, choose_columns, to_markdown
from ragen_lit.analysis.runs import find_stores, label_runs, load_runs

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "REPRODUCTION.md"

# (e)'s compute columns, as the page's `compare --metrics` prints them
BUDGET = (
    "time/iteration_s:mean_after_first time/generation_s:mean_after_first time/prepare_s:mean_after_first "
    "time/update_s:mean_after_first kept_ratio memory/update_peak_gib:max memory/generation_peak_gib:max "
    "rollout/sequence_tokens:mean"
).split()

# (store in docs/results, sweep folder(s) inside it, baseline point, --metrics or None) for tables printed in
# full on the page
TABLES = [
    ("tiny-cpu-intel.tar.xz", "tiny/cpu-sokoban", "filter.strategy=none", None),
    ("tiny-cpu-intel.tar.xz", "tiny/cpu-quartile", "filter.quartile=1", None),
    ("smollm2-sokoban-8seeds-h200.tar.xz", "smol-sokoban-8", "filter.strategy=none", None),
    ("tiny-ppo-sokoban-cpu.tar.xz", "tiny-ppo-sokoban-cpu", "filter.strategy=none", None),
    ("tiny-ppo-frozenlake-cpu.tar.xz", "tiny-ppo-frozenlake-cpu", "filter.strategy=none", None),
    ("gigpo-sokoban-cpu-amd.tar.xz", "gigpo-sokoban-cpu", "algo=grpo", None),
    ("gigpo-frozenlake-cpu-amd.tar.xz", "gigpo-frozenlake-cpu", "algo=grpo", None),
    ("budget-smollm2-h200.tar.xz", "budget/ppo-*", "ppo-8x16: filter.strategy=none", BUDGET),
    ("budget-smollm2-h200.tar.xz", "budget/grpo-*", "grpo-8x16: filter.strategy=none", BUDGET),
]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("results")
    for store in {store for store, *_ in TABLES}:
        with tarfile.open(ROOT / "docs" / "results" / store) as archive:
            archive.extractall(folder / store, filter="data")
    return folder


def table_rows(sweeps: list[Path], baseline: str, metrics: list[str] | None) -> list[str]:
    runs = [r for r in label_runs(load_runs(find_stores(sweeps))) if r.status == "FINISHED"]
    assert runs, f"no finished runs under {sweeps}"
    text = to_markdown(build_table(runs, baseline, choose_columns(metrics, runs)))
    return [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| point")]


@pytest.mark.parametrize("store, sweep, baseline, metrics", TABLES, ids=[t[1] for t in TABLES])
def test_page_table_redraws_from_its_store(extracted, store, sweep, baseline, metrics):
    page = PAGE.read_text()
    sweeps = sorted((extracted / store).glob(sweep))  # a glob names several sweeps, as `compare budget/ppo-*` does
    assert sweeps, f"{sweep} matches nothing in {store}"
    rows = table_rows(sweeps, baseline, metrics)
    assert len(rows) >= 2  # a baseline and at least one point against it
    missing = [row for row in rows if row not in page]
    assert not missing, f"{sweep}: rows compare prints that the page does not show:\n" + "\n".join(missing)


def test_every_local_link_of_the_page_exists():
    page = PAGE.read_text()
    targets = [part.split(")")[0] for part in page.split("](")[1:]]
    local = [t for t in targets if not t.startswith(("http://", "https://", "#"))]
    assert local, "the page links its figures"
    assert [t for t in local if not (PAGE.parent / t).exists()] == []
