import json
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium
import pyarrow
import pyarrow.parquet
import pytest
from gymnasium.utils.env_checker import check_env

from ragen_lit.envs import make_env
from ragen_lit.envs.math_qa import MathQAEnv, default_data_path, load_questions, normalize_answer
from ragen_lit.envs.mathqa_synthetic import make_problems
from ragen_lit.envs.records import read_records

QUESTIONS = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "A pen costs $2. How much do 6 pens cost?", "answer": "$12"},
    {"question": "Half of 7 is?", "answer": 3.5},
]
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_mathqa_data.py"
# four records in MetaMathQA's format (meta-math/MetaMathQA: query, response ending "The answer is: …", type,
# original_question), written for these tests
METAMATHQA = Path(__file__).resolve().parent / "data" / "metamathqa_sample.jsonl"
METAMATHQA_ANSWERS = ["60", "25", "0.6", "900"]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return str(path)


@pytest.fixture
def data_path(tmp_path):
    return write_jsonl(tmp_path / "qa.jsonl", QUESTIONS)


@pytest.mark.parametrize(
    "text, expected",
    [
        (" 42 ", "42"),
        ("$1,250.00.", "1250"),
        ("3.0", "3"),
        ("3.50", "3.5"),
        ("-7.", "-7"),
        ("Twelve", "twelve"),
        ("1 000", "1000"),
        ("10", "10"),
        ("100", "100"),
        (12, "12"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_instance_is_the_seed_indexed_question(data_path):
    env = MathQAEnv(path=data_path)
    assert env.reset(seed=4)[0] == "A pen costs $2. How much do 6 pens cost?"
    assert env.gold_answer == "$12"
    assert env.reset(seed=2) == ("Half of 7 is?", {"success": False, "action_valid": True})


@pytest.mark.parametrize("answer, reward", [("12", 1.0), (" $12. ", 1.0), ("12.0", 1.0), ("13", 0.0), ("1 2x", 0.0)])
def test_single_attempt_reward(data_path, answer, reward):
    env = MathQAEnv(path=data_path)
    env.reset(seed=1)
    obs, got, terminated, truncated, info = env.step(answer)
    assert (got, terminated, truncated) == (reward, True, False)
    assert info == {"success": reward == 1.0, "action_valid": True}
    assert obs == "A pen costs $2. How much do 6 pens cost?"


def test_retries_halve_the_reward(data_path):
    env = MathQAEnv(path=data_path, max_attempts=3)
    env.reset(seed=0)
    assert env.step("4")[1:4] == (0.0, False, False)
    assert env.step("")[1:5] == (0.0, False, False, {"success": False, "action_valid": False})
    assert env.step("6")[1:4] == (0.0, False, False)
    assert env.step("5")[1:5] == (0.25, True, False, {"success": True, "action_valid": True})
    env.reset(seed=0)
    assert env.step("5")[1] == 1.0
    env.reset(seed=0)
    env.step("1")
    assert env.step("5")[1] == 0.5


def test_attempts_run_out(data_path):
    env = MathQAEnv(path=data_path, max_attempts=2)
    env.reset(seed=0)
    env.step("1")
    assert env.step("2")[1:5] == (0.0, True, False, {"success": False, "action_valid": True})
    assert env.max_attempts == 2


def test_parquet(tmp_path):
    path = tmp_path / "qa.parquet"
    pyarrow.parquet.write_table(
        pyarrow.table({"question": ["1 + 1?", "2 + 2?"], "answer": ["2", "4"], "x": [0, 1]}), path
    )
    env = MathQAEnv(path=str(path))
    assert env.questions == (("1 + 1?", "2"), ("2 + 2?", "4"))
    env.reset(seed=3)
    assert env.step("4")[1] == 1.0
    pyarrow.parquet.write_table(pyarrow.table({"query": ["1 + 1?"], "answer": ["2"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"env\.options\.path=.*its records have \['answer', 'query'\]$"):
        make_env("mathqa", path=str(tmp_path / "bad.parquet"))


def test_bad_files_give_clear_errors(tmp_path):
    cases = {
        "missing.jsonl": None,
        "no_answer.jsonl": '{"question": "1?"}\n',
        "not_json.jsonl": '{"question": "1?", "answer": "1"}\nnot json\n',
        "empty_question.jsonl": '{"question": " ", "answer": "1"}\n',
        "empty.jsonl": "\n",
        "data.csv": "question,answer\n",
    }
    messages = {
        "missing.jsonl": "an existing .jsonl or .parquet file",
        "no_answer.jsonl": r"its records have \['question'\]",
        "not_json.jsonl": "line 2",
        "empty_question.jsonl": "record 0 has an empty one",
        "empty.jsonl": "at least one question",
        "data.csv": "a .jsonl or .parquet file",
        "half.jsonl": r"records with question \+ answer \(record 1 has \['query', 'response'\]\)",
    }
    cases["half.jsonl"] = '{"question": "1?", "answer": "1"}\n{"query": "2?", "response": "The answer is: 2"}\n'
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=r"env\.options\.path=.*" + messages[name]):
            make_env("mathqa", path=str(tmp_path / name))


def test_custom_characters_stay_inside_the_observation_space(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "Wie viel ist π × 2 für Zoë?\tRunde.", "answer": "6"}])
    env = MathQAEnv(path=path)
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space


def test_bundled_set_matches_the_generator():
    records = [json.loads(line) for line in default_data_path().read_text(encoding="utf-8").splitlines()]
    assert records == make_problems(1000, 0)
    questions = load_questions().pairs
    assert len(questions) == 1000 and len({q for q, _ in questions}) == 1000
    assert load_questions() is load_questions()
    env = MathQAEnv()
    validation_questions = {env.reset(seed=seed)[0] for seed in MathQAEnv.validation_seeds}
    assert len(validation_questions) == 512


def test_generator_script_is_wired():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--count" in done.stdout, done.stderr[-2000:]


def test_gold_answers_of_the_bundled_set_score_one():
    env = MathQAEnv()
    for seed in range(0, 1000, 37):
        env.reset(seed=seed)
        assert env.step(env.gold_answer)[1] == 1.0


def test_options_are_validated():
    with pytest.raises(ValueError, match=r"env\.options\.max_attempts=0 is not allowed"):
        make_env("mathqa", max_attempts=0)


def test_gymnasium_make_and_env_checker():
    env = gymnasium.make("ragen_lit/MathQA-v0")
    assert env.reset(seed=0)[0].endswith("?")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_metamathqa_records_are_detected_and_answered_after_the_mark():
    env = make_env("mathqa", path=str(METAMATHQA))
    records, fields = read_records(str(METAMATHQA))
    assert fields == ["original_question", "query", "response", "type"]
    assert env.questions == tuple((r["query"], a) for r, a in zip(records, METAMATHQA_ANSWERS))
    assert env.reset(seed=6)[0].startswith("What is $\\frac{3}{4}$ of 0.8?")
    assert env.step("0.60")[1] == 1.0
    env.reset(seed=3)
    assert env.step("$900")[1] == 1.0
    assert make_env("mathqa", path=str(METAMATHQA), format="metamathqa").questions == env.questions


def test_metamathqa_as_parquet_and_as_a_json_array(tmp_path):
    records = [json.loads(line) for line in METAMATHQA.read_text(encoding="utf-8").splitlines()]
    parquet = tmp_path / "mmqa.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), parquet)
    array = tmp_path / "MetaMathQA-395K.json"  # how the hub ships it: one JSON array
    array.write_text(json.dumps(records, indent=1), encoding="utf-8")
    expected = tuple((r["query"], a) for r, a in zip(records, METAMATHQA_ANSWERS))
    assert MathQAEnv(path=str(parquet)).questions == expected
    assert MathQAEnv(path=str(array)).questions == expected


def test_format_option_and_files_that_fit_no_format(tmp_path, data_path):
    # the explicit format must match the records; a file of neither format names its fields in one line
    with pytest.raises(ValueError) as error:
        make_env("mathqa", path=data_path, format="metamathqa")
    message = str(error.value)
    assert message.startswith("env.options.format='metamathqa' is not allowed; expected records with query + response")
    assert data_path in message and "['answer', 'question']" in message and "\n" not in message
    with pytest.raises(ValueError, match=r"^env\.options\.format='gsm8k' is not allowed; expected one of auto, qa"):
        make_env("mathqa", path=data_path, format="gsm8k")
    other = write_jsonl(tmp_path / "other.jsonl", [{"problem": "1 + 1?", "solution": "2"}])
    with pytest.raises(ValueError) as error:
        make_env("mathqa", path=other)
    message = str(error.value)
    assert message == (
        f"env.options.path={other!r} is not allowed; expected records of a known format, question + answer "
        "(format=qa), query + response (format=metamathqa); its records have ['problem', 'solution']"
    )
    no_mark = write_jsonl(tmp_path / "no_mark.jsonl", [{"query": "1 + 1?", "response": "It is 2."}])
    with pytest.raises(ValueError, match=r"env\.options\.path=.*'The answer is: <answer>' \(record 0 has none\)"):
        make_env("mathqa", path=no_mark)
