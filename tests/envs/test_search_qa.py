"""SearchQA: SQuAD scoring by hand, the action grammar, a two-hop episode on the bundled set, the search
limit, the NQ-open and HotpotQA fixtures (JSONL, JSON, parquet) with a user corpus, and one-line config errors."""

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
from ragen_lit.envs.search_qa import (
    SearchQAEnv,
    default_corpus_path,
    default_questions_path,
    exact_match,
    f1_score,
    load_search_data,
    normalize_answer,
)
from ragen_lit.envs.search_qa_synthetic import TEMPLATES, make_world, parse_question, read_relation

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NQ, CORPUS = str(FIXTURES / "nq_open.jsonl"), str(FIXTURES / "corpus.jsonl")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_search_qa_data.py"


def seed_of(env, question):
    return next(i for i, (q, _) in enumerate(env.data.questions) if q == question)


def step_ok(env, action):
    """step() plus the check that every observation stays inside the observation space."""
    result = env.step(action)
    assert result[0] in env.observation_space
    return result


@pytest.mark.parametrize(
    "text, expected",
    [("The  Avon!", "avon"), ("an Apple a day", "apple day"), ("Anne's theatre", "annes theatre"), ("1,987.", "1987")],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_and_f1_by_hand():
    assert exact_match("the avon", ["Avon"]) and exact_match("8", ["eight", "8"])
    assert not exact_match("the", ["The"]) and not exact_match("Avon river", ["Avon"])
    # "river avon" vs "avon": 1 common token, precision 1/2, recall 1 -> F1 2/3
    assert f1_score("River Avon", ["Avon"]) == pytest.approx(2 / 3)
    # the best of several golds: "new york city" vs "new york" -> p 2/3, r 1 -> 0.8
    assert f1_score("New York City", ["Big Apple", "New York"]) == pytest.approx(0.8)
    assert f1_score("paris", ["London"]) == 0.0 and f1_score("a", ["a"]) == 0.0


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("search[Zorvex Labs]", "search[Zorvex Labs]"),
        ("  Search [ Zorvex   Labs ] ", "search[Zorvex Labs]"),
        ("ANSWER[Tarnholt]", "answer[Tarnholt]"),
        ("answer[a [b] c]", "answer[a [b] c]"),
        ("search[]", None),
        ("answer[   ]", None),
        ("search Zorvex", None),
        ("finish[x]", None),
        ("look[x]", None),
        ("search[x] and more", None),
        ("", None),
    ],
)
def test_parse_action(text, parsed):
    assert SearchQAEnv().parse_action(text) == parsed


def test_two_hop_episode_on_the_bundled_set():
    env = SearchQAEnv()
    question = next(q for q, _ in env.data.questions if q.startswith("In which city was the founder of "))
    company = parse_question(question)[0]
    obs, info = env.reset(seed=seed_of(env, question))
    assert obs == f"Question: {question}\nSearches left: 3" and info == {"success": False, "action_valid": True}
    obs, reward, terminated, truncated, info = step_ok(env, f"search[{company}]")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, False, False)
    lines = obs.split("\n")
    assert lines[1:3] == ["Searches left: 2", f'Results for "{company}":'] and len(lines) == 6
    assert lines[3].startswith(f"[1] {company}: {company} is a company headquartered in ")
    founder = read_relation(company, lines[3], "founder")
    obs = step_ok(env, f"search[{founder}]")[0]
    city = read_relation(founder, obs.split("\n")[3], "birthplace")
    assert (city,) == env.gold_answers
    obs, reward, terminated, truncated, info = step_ok(env, f"answer[{city.upper()}.]")
    assert (reward, terminated, truncated, info) == (1.0, True, False, {"success": True, "action_valid": True})
    assert obs.endswith(f"Answered: {city.upper()}.")


def test_f1_and_em_rewards_and_success_is_exact_match():
    env = SearchQAEnv(reward="f1")
    env.reset(seed=seed_of(env, next(q for q, a in env.data.questions if q.startswith("Who founded"))))
    first_name = env.gold_answers[0].split()[0]
    reward, _, _, info = step_ok(env, f"answer[{first_name}]")[1:]
    assert reward == pytest.approx(2 / 3) and info["success"] is False
    env = SearchQAEnv(reward="em")
    env.reset(seed=0)
    assert step_ok(env, f"answer[{first_name}]")[1] == 0.0
    env.reset(seed=0)
    assert step_ok(env, f"answer[{env.gold_answers[0]}]")[1] == 1.0


def test_search_limit_passages_and_cut():
    env = SearchQAEnv(max_searches=2, top_k=2, passage_max_chars=20)
    assert env.max_actions_per_episode == 3
    env.reset(seed=5)
    obs = step_ok(env, "search[company]")[0]
    passages = obs.split("\n")[3:]
    assert len(passages) == 2 and all(p.endswith("...") and len(p.split(": ", 1)[1]) <= 23 for p in passages)
    step_ok(env, "search[zzzz qqqq]")
    assert env.render().endswith('Results for "zzzz qqqq": none') and env.searches_left == 0
    obs, reward, terminated, truncated, info = step_ok(env, "search[company]")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
    assert obs.endswith("Searches left: 0\nNo searches left.")
    env = SearchQAEnv(max_searches=0)
    env.reset(seed=1)
    assert step_ok(env, "search[x]")[2:4] == (False, True)


def test_invalid_actions_keep_the_state_and_never_raise():
    env = SearchQAEnv(max_searches=1)
    first = env.reset(seed=3)[0]
    for action in ["", "search", "answer[]", "42", "<answer>search[x]</answer>", "x" * 10_000, None, 7, b"search[x]"]:
        assert env.step(action) == (first, 0.0, False, False, {"success": False, "action_valid": False})
    assert env.num_actions == 0 and env.searches_left == 1


def test_nq_open_questions_over_a_user_corpus():
    env = make_env("search_qa", path=NQ, corpus_path=CORPUS)
    assert env.data.questions[2] == ("how many legs does a spider have", ("eight", "8"))
    assert len(env.data.passages) == 4
    env.reset(seed=1)
    obs = step_ok(env, "search[capital of Australia]")[0]
    assert obs.split("\n")[3] == "[1] Canberra: Canberra is the capital city of Australia."
    env.reset(seed=2)
    assert step_ok(env, "answer[8]")[1:3] == (1.0, True)


@pytest.mark.parametrize("name", ["hotpot_qa.json", "hotpot_qa_hf.jsonl", "hotpot_qa_hf.parquet"])
def test_hotpotqa_contexts_become_the_corpus(tmp_path, name):
    path = FIXTURES / name
    if name.endswith(".parquet"):
        records = [json.loads(line) for line in (FIXTURES / "hotpot_qa_hf.jsonl").read_text().splitlines()]
        path = tmp_path / name
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), path)
    env = SearchQAEnv(path=str(path))
    # Brackford and Lowmere appear in both questions' contexts: one passage each
    assert [p.title for p in env.data.passages] == ["Old Mill Museum", "Brackford", "Lowmere"]
    assert env.data.passages[1].text == "Brackford is a market town. The Avon flows through Brackford."
    env.reset(seed=0)
    assert step_ok(env, "search[Old Mill Museum]")[0].split("\n")[3].startswith("[1] Old Mill Museum: ")
    assert step_ok(env, "answer[Avon]")[1:5] == (1.0, True, False, {"success": True, "action_valid": True})
    # a corpus file adds to the contexts
    assert len(SearchQAEnv(path=str(path), corpus_path=CORPUS).data.passages) == 7


def test_bad_files_give_one_line_naming_the_key(tmp_path):
    def write(name, text):
        (tmp_path / name).write_text(text, encoding="utf-8")
        return str(tmp_path / name)

    cases = [
        ({"path": str(tmp_path / "missing.jsonl")}, "path", "an existing .jsonl, .json or .parquet file"),
        ({"corpus_path": str(tmp_path / "missing.jsonl")}, "corpus_path", "an existing"),
        ({"path": NQ}, "corpus_path", "has no context"),
        ({"path": write("q.csv", "question,answer\n"), "corpus_path": CORPUS}, "path", "a .jsonl, .json or .parquet"),
        (
            {"path": write("q1.jsonl", '{"question": "x"}\n'), "corpus_path": CORPUS},
            "path",
            r"record 0 has \['question'\]",
        ),
        ({"path": write("q2.jsonl", '{"question": "x", "answer": []}\n'), "corpus_path": CORPUS}, "path", "record 0"),
        ({"path": write("q3.jsonl", '{"question": "x", "answer": "y"}\n{\n'), "corpus_path": CORPUS}, "path", "line 2"),
        (
            {"path": write("q4.json", '{"question": "x"}'), "corpus_path": CORPUS},
            "path",
            r"record 0 has \['question'\]",
        ),
        ({"path": write("q5.jsonl", "\n"), "corpus_path": CORPUS}, "path", "at least one question"),
        ({"path": write("q6.jsonl", '{"question": "x", "answer": "y", "context": 3}\n')}, "path", "HotpotQA context"),
        ({"path": NQ, "corpus_path": write("c1.jsonl", '{"id": 1, "text": "x"}\n')}, "corpus_path", "'title'"),
        (
            {"path": NQ, "corpus_path": write("c2.jsonl", '{"id": 1, "title": "t", "text": " "}\n')},
            "corpus_path",
            "non-empty",
        ),
    ]
    for options, key, message in cases:
        with pytest.raises(ValueError, match=rf"^env\.options\.{key}=.*{message}") as caught:
            make_env("search_qa", **options)
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "option, value",
    [
        ("max_searches", -1),
        ("top_k", 0),
        ("passage_max_chars", 0),
        ("reward", "bleu"),
        ("k1", -1),
        ("b", 2.0),
        ("k1", "x"),
    ],
)
def test_bad_options_name_the_key(option, value):
    with pytest.raises(ValueError, match=rf"^env\.options\.{option}={value!r} is not allowed"):
        make_env("search_qa", **{option: value})


def test_bundled_set_matches_the_generator_and_is_small():
    corpus, questions = make_world(0)
    assert [json.loads(line) for line in default_corpus_path().read_text().splitlines()] == corpus
    assert [json.loads(line) for line in default_questions_path().read_text().splitlines()] == questions
    assert default_corpus_path().stat().st_size + default_questions_path().stat().st_size < 300_000
    assert {q["hops"] for q in questions} == {1, 2, 3}
    assert len({q["question"] for q in questions}) == len(questions) == 1200
    assert load_search_data() is load_search_data()
    env = SearchQAEnv()
    assert len({env.reset(seed=seed)[0] for seed in SearchQAEnv.validation_seeds}) == 512


def test_every_bundled_question_is_answered_by_following_its_chain():
    """Search the entity, read the relation off the first passage, repeat: every gold answer is reached
    with exactly `hops` searches."""
    env = SearchQAEnv(passage_max_chars=1000)
    records = [json.loads(line) for line in default_questions_path().read_text().splitlines()]
    for seed, record in enumerate(records):
        env.reset(seed=seed)
        entity, chain = parse_question(record["question"])
        assert len(chain) == record["hops"]
        for relation in chain:
            first = step_ok(env, f"search[{entity}]")[0].split("\n")[3]
            assert first.startswith(f"[1] {entity}: ")
            entity = read_relation(entity, first, relation)
        assert step_ok(env, f"answer[{entity}]")[1:3] == (1.0, True), record


def test_parse_question_prefers_the_longer_chain():
    assert parse_question("In which country is Lifo Labs headquartered?") == ("Lifo Labs", ("hq", "country"))
    assert parse_question("In which country is Ziskex?") == ("Ziskex", ("country",))
    assert parse_question("What is 2 + 2?") is None
    assert len(TEMPLATES) == 12


def test_generator_script_is_wired(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seed", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    corpus, questions = make_world(1)
    assert [json.loads(line) for line in (tmp_path / "search_qa_questions.jsonl").read_text().splitlines()] == questions
    assert len(corpus) == 300


def test_gymnasium_make_and_env_checker():
    env = gymnasium.make("ragen_lit/SearchQA-v0")
    assert env.reset(seed=0)[0].startswith("Question: ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
