"""The coding env: answer extraction, fraction-passed reward and repair feedback, the bundled set, and
the DeepCoder / TACO / LiveCodeBench record shapes read from local files."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import pytest

from ragen_lit.envs import make_env
from ragen_lit.envs.coding import CodingEnv, extract_program, load_problems, passes, problem_from_record


def test_extract_program():
    assert extract_program("def f():\n    return 1") == "def f():\n    return 1"
    assert extract_program("Here:\n```python\n    x = 1\n    print(x)\n```\nthanks") == "x = 1\nprint(x)"
    for bad in ("", "   ", None, "def f(:", "I do not know", "x" * 30000):
        assert extract_program(bad) is None


def test_reference_solution_solves_and_ends(tmp_path):
    env = CodingEnv()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.problem.solution)
    assert reward == 1.0 and terminated and info == {"success": True, "action_valid": True}


def test_partial_program_then_repair_pays_the_improvement():
    env = CodingEnv(max_attempts=2)
    env.reset(seed=0)
    fn = env.problem.fn_name
    obs, reward, terminated, truncated, info = env.step(f"def {fn}(*args):\n    return None")
    assert 0.0 <= reward < 1.0 and not terminated and not truncated and not info["success"]
    assert "Your program passed" in obs and obs.startswith(env.problem.prompt)
    assert obs in env.observation_space
    first = env.best_fraction
    obs, reward, terminated, truncated, info = env.step(env.problem.solution)
    assert reward == pytest.approx(1.0 - first) and terminated and info["success"]


def test_feedback_shows_public_tests_and_hides_hidden_ones():
    record = {
        "prompt": "Write double(x).",
        "fn_name": "double",
        "public_tests": 1,
        "tests": [{"input": [1], "output": 2}, {"input": [5], "output": 10}],
    }
    problem = problem_from_record(record)
    assert [t.public for t in problem.tests] == [True, False]
    env = CodingEnv(feedback_tests=2)
    env.reset(seed=0)
    env.problem = problem
    obs, reward, *_ = env.step("def double(x):\n    return x * 3")
    assert reward == 0.0
    assert "Failed test: input [1]" in obs and "expected 2, got 3 (wrong answer)" in obs
    assert "A hidden test failed: wrong answer" in obs and "10" not in obs.split("Your program")[1]


def test_invalid_answers_cost_nothing_and_never_raise():
    env = CodingEnv()
    before = env.reset(seed=3)[0]
    for action in ("", "not python (", None, 7):
        obs, reward, terminated, truncated, info = env.step(action)
        assert (obs, reward, terminated, info["action_valid"]) == (before, 0.0, False, False)


def test_odd_output_stays_inside_the_observation_space():
    env = CodingEnv(max_attempts=2, feedback_tests=2)
    env.reset(seed=1)
    fn = env.problem.fn_name
    obs, *_ = env.step(f"def {fn}(*args):\n    return '\\u2603\\x00\\x1b[31m' * 500")
    assert obs in env.observation_space


def test_bundled_set_is_large_and_every_record_has_hidden_tests():
    problems = load_problems().problems
    assert len(problems) >= 500
    assert all(p.solution and p.fn_name and sum(not t.public for t in p.tests) >= 3 for p in problems)


def test_bad_config_names_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"^env\.options\.path=.*missing\.jsonl"):
        make_env("coding", path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match=r"^env\.options\.max_attempts=0"):
        make_env("coding", max_attempts=0)
    with pytest.raises(ValueError, match=r"^env\.options\.wall_seconds="):
        make_env("coding", wall_seconds=-1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match=r"^env\.options\.path=.*unknown record shape"):
        make_env("coding", path=str(bad))


# ------------------------------------------------------------------ record shapes (small fixtures)
STDIN_SUM = "a, b = map(int, input().split())\nprint(a + b)"
DEEPCODER_LCB_STDIN = {
    "problem": "Print the sum of two integers.",
    "tests": json.dumps(
        [
            {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
            {"input": "5 5\n", "output": "10\n", "testtype": "stdin"},
        ]
    ),
    "starter_code": "",
    "metadata": "{}",
}
DEEPCODER_LCB_FUNCTIONAL = {
    "problem": "Return the sum of a list and a number.",
    "tests": json.dumps([{"input": "[1, 2]\n3", "output": "6", "testtype": "functional"}]),
    "starter_code": "class Solution:\n    def addAll(self, nums: List[int], k: int) -> int:\n        ",
    "metadata": json.dumps({"func_name": "addAll"}),
}
DEEPCODER_PRIMEINTELLECT = {
    "problem": "Return x squared.",
    "tests": json.dumps([{"type": "function_call", "fn_name": "square", "input": [3], "output": [9]}]),
    "metadata": "{}",
}
DEEPCODER_TACO = {
    "problem": "Return x plus one.",
    "tests": json.dumps({"inputs": [[1], [2]], "outputs": [[2], [3]], "fn_name": "inc"}),
}
TACO = {
    "question": "Print the sum of two integers.",
    "solutions": json.dumps([STDIN_SUM]),
    "starter_code": "",
    "input_output": json.dumps({"inputs": ["1 2\n", "2 2\n"], "outputs": ["3\n", "4\n"]}),
    "difficulty": "EASY",
}


def _compressed(cases) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB = {
    "question_title": "add",
    "question_content": "Return the sum of a list and a number.",
    "platform": "leetcode",
    "starter_code": "class Solution:\n    def addAll(self, nums: List[int], k: int) -> int:\n        ",
    "public_test_cases": json.dumps([{"input": "[1, 2]\n3", "output": "6", "testtype": "functional"}]),
    "private_test_cases": _compressed([{"input": "[]\n0", "output": "0", "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "addAll"}),
}
ADD_ALL = "class Solution:\n    def addAll(self, nums, k):\n        return sum(nums) + k"


@pytest.mark.parametrize(
    "record, program, tests",
    [
        (DEEPCODER_LCB_STDIN, STDIN_SUM, 2),
        (DEEPCODER_LCB_FUNCTIONAL, ADD_ALL, 1),
        (DEEPCODER_PRIMEINTELLECT, "def square(x):\n    return x * x", 1),
        (DEEPCODER_TACO, "def inc(x):\n    return x + 1", 2),
        (TACO, STDIN_SUM, 2),
        (LCB, ADD_ALL, 2),
    ],
    ids=["deepcoder-stdin", "deepcoder-functional", "deepcoder-primeintellect", "deepcoder-taco", "taco", "lcb"],
)
def test_record_shapes_load_and_their_solutions_pass(tmp_path, record, program, tests):
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(record) + "\n")
    env = make_env("coding", path=str(path))
    env.reset(seed=0)
    assert len(env.problem.tests) == tests
    _, reward, terminated, _, info = env.step(program)
    assert reward == 1.0 and info["success"], env.last_run
    env.reset(seed=0)
    _, reward, *_ = env.step("print('nope')" if env.problem.fn_name is None else "def nothing():\n    pass")
    assert reward == 0.0


def test_parquet_records_load(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / "taco.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([TACO]), path)
    env = make_env("coding", path=str(path))
    env.reset(seed=0)
    assert env.step(STDIN_SUM)[1] == 1.0


def test_a_test_pickle_naming_a_class_is_refused(tmp_path):
    class Boom:
        def __reduce__(self):
            return (print, ("pwned",))

    record = dict(LCB, private_test_cases=base64.b64encode(zlib.compress(pickle.dumps(Boom()))).decode())
    path = tmp_path / "evil.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="refusing to load builtins.print"):
        make_env("coding", path=str(path))


def test_output_comparison_rules():
    problem = problem_from_record(DEEPCODER_TACO)
    test = problem.tests[0]
    assert passes(problem, test, "ok", 2) and passes(problem, test, "ok", [2])
    assert not passes(problem, test, "error", 2) and not passes(problem, test, "ok", True)
    stdio = problem_from_record(TACO)
    assert passes(stdio, stdio.tests[0], "ok", "3   \n\n") and not passes(stdio, stdio.tests[0], "ok", "4")
