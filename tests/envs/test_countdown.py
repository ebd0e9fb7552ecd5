import json
import warnings
from fractions import Fraction
from pathlib import Path

import gymnasium
import pyarrow
import pyarrow.parquet
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.envs import make_env
from ragen_lit.envs.countdown import CountdownEnv, generate_instance, safe_evaluate, score_answer, solve

# four records in the Countdown-Tasks format (Jiayi-Pan/Countdown-Tasks-3to4: target, nums), written for these tests
TASKS = Path(__file__).resolve().parent / "data" / "countdown_tasks_sample.jsonl"

HOSTILE_ANSWERS = [
    "__import__('os').system('true')",
    "(1).__class__.__bases__",
    "open('/etc/passwd').read()",
    "a + b",
    "2 ** 10",
    "9**9**9**9",
    "9" * 200,
    "1+" * 5000 + "1",
    "-" * 199 + "1",
    "1 / 0",
    "4 / (3 - 3)",
    "True + 1",
    "1.5 + 2",
    "1j",
    "'a' * 10",
    "lambda: 1",
    "[3, 4]",
    "3 // 4",
    "3 % 4",
    "~3",
    "+3",
    "3 << 4",
    "1 if 3 else 4",
    "3; 4",
    "f'{3}'",
    "\x00",
    "",
]


def test_safe_evaluate_exact_values_and_literals():
    assert safe_evaluate("(6 - 2) * 5 + 4") == (Fraction(24), [6, 2, 5, 4])
    assert safe_evaluate("6 / (1 - 3 / 4)") == (Fraction(24), [6, 1, 3, 4])
    assert safe_evaluate(" -3 + 10 ") == (Fraction(7), [3, 10])
    assert safe_evaluate("8 × 3 ÷ 2 − 1") == (Fraction(11), [8, 3, 2, 1])
    assert safe_evaluate("(((7)))") == (Fraction(7), [7])


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS)
def test_hostile_answers_are_rejected(answer):
    with pytest.raises(ValueError):
        safe_evaluate(answer)
    assert score_answer(answer, [3, 4], 12) == 0.0


@pytest.mark.parametrize(
    "answer, reward",
    [
        ("(6 - 2) * 5 + 4", 1.0),
        ("4 + 5 * (6 - 2)", 1.0),
        ("6 * 5 - 2 - 4", 1.0),  # another correct expression
        ("6 * 5 + 2 + 4", 0.1),  # right numbers, value 36
        ("6 * 4", 0.0),  # numbers missing
        ("6 * 4 + 5 - 2 + 2", 0.0),  # a number used twice
        ("(6 - 2) * 5 + 4 = 24", 0.0),  # not an expression
    ],
)
def test_score_answer(answer, reward):
    assert score_answer(answer, [6, 2, 5, 4], 24) == reward


def test_division_is_exact():
    assert score_answer("8 / (3 - 8 / 3)", [3, 3, 8, 8], 24) == 1.0


def test_env_episode_with_a_correct_answer():
    env = CountdownEnv.from_instance([3, 4, 6, 1], 24)
    obs, info = env.reset(seed=0)
    assert obs == "Target: 24\nNumbers: [3, 4, 6, 1]"
    assert info == {"success": False, "action_valid": True}
    obs, reward, terminated, truncated, info = env.step(" 6 / (1 - 3 / 4) ")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info == {"success": True, "action_valid": True}
    with pytest.raises(RuntimeError):
        env.step("1")


def test_env_wrong_value_and_hostile_answers_end_the_episode():
    env = CountdownEnv.from_instance([3, 4, 6, 1], 24)
    env.reset(seed=0)
    assert env.step("3 + 4 + 6 + 1")[1:5] == (0.1, True, False, {"success": False, "action_valid": True})
    env.reset(seed=0)
    assert env.step("__import__('os')")[1:5] == (0.0, True, False, {"success": False, "action_valid": True})


def test_empty_answer_is_the_only_invalid_action():
    env = CountdownEnv.from_instance([3, 4], 7)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("  \n ")
    assert (reward, terminated, truncated, info["action_valid"]) == (0.0, False, False, False)
    assert env.step("3 + 4")[1] == 1.0


def test_solve():
    assert solve([1, 1, 1], 100) is None
    for numbers, target in ([3, 3, 8, 8], 24), ([5], 5), ([7, 2], 5), ([25, 50, 75, 100], 3):
        expression = solve(numbers, target)
        assert score_answer(expression, numbers, target) == 1.0


def test_generated_instances_are_solvable_deterministic_and_distinct():
    instances = set()
    for seed in range(150):
        numbers, target = generate_instance(seed)
        assert (numbers, target) == generate_instance(seed)
        assert len(numbers) in (3, 4) and all(1 <= n <= 99 for n in numbers) and 1 <= target <= 100
        assert score_answer(solve(numbers, target), numbers, target) == 1.0
        instances.add((tuple(numbers), target))
    assert len(instances) == 150
    env = CountdownEnv()
    assert env.reset(seed=5)[0] == "Target: {1}\nNumbers: {0}".format(*generate_instance(5))


def test_small_number_options():
    for seed in range(30):
        numbers, target = generate_instance(seed, max_number=9, max_target=20)
        assert max(numbers) <= 9 and 1 <= target <= 20
    with pytest.raises(ValueError, match=r"env\.options\.max_number=0 is not allowed"):
        make_env("countdown", max_number=0)


@settings(max_examples=40, deadline=None)
@given(numbers=st.lists(st.integers(1, 20), min_size=1, max_size=4), target=st.integers(-50, 200))
def test_any_solution_found_scores_one(numbers, target):
    expression = solve(numbers, target)
    if expression is not None:
        assert score_answer(expression, numbers, target) == 1.0


@settings(max_examples=200, deadline=None)
@given(answer=st.text(max_size=300))
def test_any_text_scores_zero_point_one_or_one(answer):
    assert score_answer(answer, [3, 4, 6, 1], 24) in (0.0, 0.1, 1.0)


def test_from_instance_rejects_bad_numbers():
    with pytest.raises(ValueError, match="numbers="):
        CountdownEnv.from_instance([], 3)
    with pytest.raises(ValueError, match="numbers="):
        CountdownEnv.from_instance([0, 3], 3)
    with pytest.raises(ValueError, match="target="):
        CountdownEnv.from_instance([1, 3], 3.5)


def test_gymnasium_make_and_env_checker():
    env = gymnasium.make("ragen_lit/Countdown-v0")
    assert env.reset(seed=0)[0].startswith("Target: ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_countdown_tasks_records_pose_the_seed_indexed_instance():
    records = [json.loads(line) for line in TASKS.read_text(encoding="utf-8").splitlines()]
    env = make_env("countdown", path=str(TASKS))
    for seed in (0, 5, 10, 123, 10003):
        obs, _ = env.reset(seed=seed)
        record = records[seed % len(records)]
        assert obs == f"Target: {record['target']}\nNumbers: {record['nums']}" and obs in env.observation_space
        assert (env.numbers, env.target) == (record["nums"], record["target"])
        assert env.step(solve(record["nums"], record["target"]))[1] == 1.0
    assert make_env("countdown", path=str(TASKS), format="countdown_tasks").instances == env.instances


def test_countdown_tasks_as_parquet(tmp_path):
    records = [json.loads(line) for line in TASKS.read_text(encoding="utf-8").splitlines()]
    path = tmp_path / "train-00000-of-00001.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), path)
    env = CountdownEnv(path=str(path))
    assert env.instances == tuple((tuple(r["nums"]), r["target"]) for r in records)
    env.reset(seed=2)
    assert env.step("68 / 2 + 9 - 4")[1] == 1.0


def test_countdown_files_that_fit_no_format_are_refused_in_one_line(tmp_path):
    other = tmp_path / "game24.jsonl"
    other.write_text('{"numbers": [1, 2, 3, 4], "answer": 24}\n', encoding="utf-8")
    with pytest.raises(ValueError) as error:
        make_env("countdown", path=str(other))
    assert str(error.value) == (
        f"env.options.path={str(other)!r} is not allowed; expected records of a known format, target + nums "
        "(format=countdown_tasks); its records have ['answer', 'numbers']"
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"target": 3, "nums": [1, 2]}\n{"target": 3, "nums": [1, -2]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"^env\.options\.path=.*\(record 1 has target=3, nums=\[1, -2\]\)$"):
        make_env("countdown", path=str(bad))
    with pytest.raises(ValueError, match=r"^env\.options\.path=.*an existing \.jsonl or \.parquet file$"):
        make_env("countdown", path=str(tmp_path / "missing.parquet"))
    with pytest.raises(ValueError, match=r"^env\.options\.format='tinyzero' is not allowed"):
        make_env("countdown", path=str(TASKS), format="tinyzero")
