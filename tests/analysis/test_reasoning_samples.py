"""scripts/reasoning_samples.py: what a run's first-turn reasonings say at an iteration, and how often."""

from __future__ import annotations

import json
import math

import mlflow
import pytest

import reasoning_samples


def write_rollouts(path, rows):
    path.write_text("".join(json.dumps({"prompt": "p", **row}) + "\n" for row in rows))


@pytest.fixture
def run_folder(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    mlflow.set_tracking_uri(store)
    with mlflow.start_run() as active:
        mlflow.log_metric("rollout/format_ok_rate", 0.75, step=1)
        mlflow.log_metric("rollout/format_ok_rate", 0.5, step=2)
    mlflow.set_tracking_uri(None)
    run = tmp_path / "sokoban-grpo-20261128-000000"
    (run / "rollouts").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"mlflow_run_id": active.info.run_id}))
    # iteration 1: one text for boards 7 and 8 (shared), another for board 9 alone
    rows = [("Player at (1, 2). I try Up.", 1, 7)] * 2 + [("Player at (1, 2). I try Up.", 1, 8)]
    rows += [("Player at (3, 4). I try Up.", 1, 9), ("later turn", 2, 9)]
    write_rollouts(
        run / "rollouts" / "iter_00000.jsonl",
        [{"reasoning": text, "turn": turn, "seed": seed} for text, turn, seed in rows],
    )
    # iteration 2: a text repeated on board 7 alone (not shared), another on boards 8 and 9 (shared)
    rows = [("Player zq zq.", 1, 7)] * 2 + [("Up up 33.", 1, 8), ("Up up 33.", 1, 9), ("zq later", 2, 9)]
    write_rollouts(
        run / "rollouts" / "iter_00001.jsonl",
        [{"reasoning": text, "turn": turn, "seed": seed} for text, turn, seed in rows],
    )
    # iteration 3: no word at all, boards named by `group` only, format rate not logged
    write_rollouts(
        run / "rollouts" / "iter_00002.jsonl",
        [{"reasoning": "(1, 2)", "turn": 1, "group": group} for group in (0, 1)],
    )
    return tmp_path, run


def test_first_turn_counts_skeletons_and_the_format_rate_of_that_step(run_folder):
    point, run = run_folder
    text = reasoning_samples.describe(run, 0, top=1, label="point")
    # 4 first turns (the turn-2 row left out), 2 distinct = 0.50; both share the skeleton "Player at (#, #). I try
    # Up." = 1.00; format rate of step 1 (rollout file 0), not step 2; the early vocabulary is this iteration's own
    # words = 1.00; the 3 rows of "Player at (1, 2). I try Up." cover boards 7 and 8, the other is board 9's alone:
    # 3 / 4 = 0.75
    assert text.splitlines()[0] == (
        "point, iteration 1: 4 first-turn reasonings, 0.50 distinct, top skeleton 1.00, 27 characters, "
        "valid format 0.75, early vocabulary 1.00, shared across boards 0.75"
    )
    assert text.splitlines()[1:] == ['     3 x "Player at (1, 2). I try Up."']
    assert reasoning_samples.run_folder(point) == run  # a sweep point holding one run


def test_a_later_iteration_measures_its_words_against_the_early_vocabulary(run_folder):
    _, run = run_folder
    text = reasoning_samples.describe(run, 1, top=1, label="point")
    # words: player zq zq (x 2), up up (x 2) = 10, of which player (2) and up (4) are early words (iteration 1:
    # player at i try up) = 6 / 10 = 0.60; "Up up 33." on boards 8 and 9 is shared (2 rows), "Player zq zq." on board
    # 7 only is not: 2 / 4 = 0.50; characters (13 + 13 + 9 + 9) / 4 = 11; two skeletons of 2 rows each = 0.50
    assert text.splitlines() == [
        "point, iteration 2: 4 first-turn reasonings, 0.50 distinct, top skeleton 0.50, 11 characters, "
        "valid format 0.50, early vocabulary 0.60, shared across boards 0.50",
        '     2 x "Player zq zq."',
    ]


def test_reasonings_without_words_or_a_logged_format_rate_print_a_dash(run_folder):
    _, run = run_folder
    # "(1, 2)" holds no word; boards 0 and 1 come from `group` (no `seed`): both rows shared
    assert reasoning_samples.describe(run, 2, top=0, label="point") == (
        "point, iteration 3: 2 first-turn reasonings, 0.50 distinct, top skeleton 1.00, 6 characters, "
        "valid format –, early vocabulary –, shared across boards 1.00"
    )


def test_a_run_without_rollouts_of_iteration_1_has_no_early_vocabulary_share(run_folder):
    _, run = run_folder
    (run / "rollouts" / "iter_00000.jsonl").unlink()
    # iteration 2 as in the test above, every statistic but the early-vocabulary share unchanged
    assert reasoning_samples.describe(run, 1, top=0, label="point") == (
        "point, iteration 2: 4 first-turn reasonings, 0.50 distinct, top skeleton 0.50, 11 characters, "
        "valid format 0.50, early vocabulary –, shared across boards 0.50"
    )


def test_the_format_rate_comes_from_the_store_run_json_names(run_folder):
    """A sweep's run records its sweep's store in run.json, not beside the run: the rate is read there, and is missing
    (a dash) once neither that store nor one beside the run is there."""
    root, run = run_folder
    store = root / "sweep" / "mlruns.db"
    store.parent.mkdir()
    (root / "mlruns.db").rename(store)
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**record, "tracking_uri": f"sqlite:///{store}"}))
    assert reasoning_samples.format_ok_rate(run, 1) == 0.75
    store.unlink()
    assert reasoning_samples.format_ok_rate(run, 1) is None


def test_early_vocabulary_share_counts_word_occurrences_and_ignores_digits_and_punctuation():
    # words: go up to | up left ("UP2left": the digit separates two words); go, up, up of 5 in the vocabulary
    assert reasoning_samples.early_vocabulary_share(["Go up to (2, 3)!", "UP2left"], {"up", "go"}) == 3 / 5
    assert reasoning_samples.early_vocabulary_share(["up up up", "left"], {"up"}) == 3 / 4  # token-weighted
    assert reasoning_samples.early_vocabulary_share(["Up."], {"up"}) == 1.0
    assert math.isnan(reasoning_samples.early_vocabulary_share(["(1, 2) -> 3.", ""], {"up"}))
    assert math.isnan(reasoning_samples.early_vocabulary_share([], {"up"}))


def test_shared_across_boards_needs_two_different_boards():
    rows = [
        {"reasoning": "A", "seed": 1},
        {"reasoning": "A", "seed": 1},  # repeated within board 1 only: not shared
        {"reasoning": "B", "seed": 1},
        {"reasoning": "B", "seed": 2},  # over boards 1 and 2: both rows shared
        {"reasoning": "C", "seed": 3},
    ]
    assert reasoning_samples.shared_across_boards(rows) == 2 / 5
    # the seed names the board, not the group (one group may hold several seeds' rows, or the reverse)
    assert reasoning_samples.shared_across_boards([{"reasoning": "A", "seed": 1, "group": g} for g in (0, 1)]) == 0.0
    assert math.isnan(reasoning_samples.shared_across_boards([]))


def test_shared_across_boards_falls_back_to_the_group():
    rows = [{"reasoning": "A", "group": 0}, {"reasoning": "A", "group": 1}, {"reasoning": "B", "group": 0}]
    assert reasoning_samples.shared_across_boards(rows) == 2 / 3
    with pytest.raises(ValueError, match="neither `seed` nor `group`"):
        reasoning_samples.shared_across_boards([{"reasoning": "A"}])


def test_a_row_without_seed_or_group_names_its_file(run_folder):
    _, run = run_folder
    write_rollouts(
        run / "rollouts" / "iter_00003.jsonl",
        [{"reasoning": "x", "turn": 2}, {"reasoning": "Up.", "turn": 1, "trajectory": 0}],
    )
    with pytest.raises(SystemExit, match=r"iter_00003.jsonl line 2 has neither `seed` nor `group`"):
        reasoning_samples.describe(run, 3, top=1, label="run")


def test_summary_prints_one_markdown_row_per_run_and_iteration(run_folder, capsys):
    _, run = run_folder
    assert reasoning_samples.main([str(run), "--iterations", "0", "1", "2", "--summary"]) == 0
    assert capsys.readouterr().out == (
        "| run | iteration | first-turn reasonings | distinct | early vocabulary | shared across boards | characters "
        "| valid format |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {run} | 1 | 4 | 0.50 | 1.00 | 0.75 | 27 | 0.75 |\n"
        f"| {run} | 2 | 4 | 0.50 | 0.60 | 0.50 | 11 | 0.50 |\n"
        f"| {run} | 3 | 2 | 0.50 | – | 1.00 | 6 | – |\n"
    )


def test_a_missing_iteration_names_the_saved_ones(run_folder):
    _, run = run_folder
    with pytest.raises(
        SystemExit,
        match=r"iter_00048.jsonl does not exist \(saved iterations: "
        r"\['iter_00000.jsonl', 'iter_00001.jsonl', 'iter_00002.jsonl'\]",
    ):
        reasoning_samples.describe(run, 48, top=1, label="run")
