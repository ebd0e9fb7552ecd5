"""The scripted expert: hand-checked FrozenLake reasoning, solved maps through the real rollout loop,
and well-formed replies on every env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.parsing import parse_response
from ragen_lit.agent.rollout import EpisodeLimits, rollout
from ragen_lit.engines.base import SamplingParams
from ragen_lit.envs import make_env
from ragen_lit.envs.countdown import CountdownEnv
from ragen_lit.envs.frozenlake import FrozenLakeEnv
from ragen_lit.envs.search_qa import SearchQAEnv
from ragen_lit.envs.sokoban import SokobanEnv
from ragen_lit.presets.tiny.expert import ExpertEngine, action_budget, best_move, distances_to, last_state, parse_lake
from ragen_lit.presets.tiny.tokenizer import byte_tokenizer

# Start (0, 0), goal (3, 3), holes (1, 1), (1, 3), (2, 3), (3, 0).
LAKE = ["SFFF", "FHFH", "FFFH", "HFFG"]
SOLVABLE_LAKES = [
    LAKE,
    ["FFFF", "FHHF", "FHGF", "SHFF"],  # a 9-move detour: the whole budget of 5 turns x 2 actions
    ["SF", "FG"],
    ["GFF", "FHF", "FFS"],  # goal up and to the left
]


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(byte_tokenizer())


def play(chat, env, epsilon=0.0, seed=0, max_new_tokens=400):
    # Byte-level ids: a reply is ~100 ids, an episode a few thousand.
    expert = ExpertEngine(chat.tokenizer, epsilon=epsilon, seed=seed)
    limits = EpisodeLimits(max_new_tokens=max_new_tokens, max_context_tokens=16384)
    return rollout(expert, lambda: env, [0], [0], chat, limits, SamplingParams())[0]


def test_parse_lake_reads_the_grid():
    observation = (
        "Board size: 3 rows x 3 cols (zero-indexed).\nPlayer: (1, 0)\nGoal: (2, 2)\nHoles: (0, 1)\nGrid:\n_O_\nP__\n__G"
    )
    assert parse_lake(observation) == (["FHF", "FFF", "FFG"], (1, 0), (2, 2))


def test_parse_lake_refuses_other_text():
    with pytest.raises(ValueError, match="FrozenLake"):
        parse_lake("Target: 24\nNumbers: [2, 3, 4]")


def test_distances_and_best_move_by_hand():
    tiles = ["FFFF", "FHFH", "FFFH", "HFFG"]
    distance = distances_to(tiles, (3, 3))
    assert distance[(0, 0)] == 6 and distance[(3, 2)] == 1 and (1, 1) not in distance
    # 3 rows and 3 cols apart: the vertical move is preferred and lies on a shortest path.
    assert best_move(tiles, (0, 0), (3, 3), distance) == "Down"
    # From (1, 0) Right is the bigger gap but falls in the hole (1, 1): Down instead.
    assert best_move(tiles, (1, 0), (3, 3), distance) == "Down"
    assert best_move(tiles, (3, 2), (3, 3), distance) == "Right"


def test_reasoning_describes_the_situation_turn_by_turn(chat):
    trajectory = play(chat, FrozenLakeEnv.from_grid(LAKE))
    assert trajectory.success
    assert [turn.reasoning for turn in trajectory.turns] == [
        "Player at (0, 0), goal at (3, 3). Holes near: (1, 1). Down leads to (1, 0). Then Down to (2, 0).",
        "Player at (2, 0), goal at (3, 3). Holes near: (1, 1), (3, 0). Down hits a hole. "
        "Right leads to (2, 1). Then Right to (2, 2).",
        "Player at (2, 2), goal at (3, 3). Holes near: (1, 1), (1, 3), (2, 3). Right hits a hole. "
        "Down leads to (3, 2). Then Right to (3, 3).",
    ]
    assert [turn.actions for turn in trajectory.turns] == [["Down", "Down"], ["Right", "Right"], ["Down", "Right"]]


@pytest.mark.parametrize("grid", SOLVABLE_LAKES)
def test_expert_without_noise_solves_hand_made_maps(chat, grid):
    trajectory = play(chat, FrozenLakeEnv.from_grid(grid))
    assert trajectory.success
    assert all(turn.valid for turn in trajectory.turns)


def test_replies_parse_into_the_executed_actions(chat):
    trajectory = play(chat, FrozenLakeEnv.from_grid(LAKE))
    for turn in trajectory.turns:
        text = chat.tokenizer.decode(trajectory.token_ids[turn.prompt_end : turn.response_end])
        parsed = parse_response(text, max_actions=2)
        assert parsed.reasoning == turn.reasoning
        assert parsed.actions == turn.actions
        assert text.endswith("</answer>")


def test_noise_plays_one_random_move_and_says_so(chat):
    trajectory = play(chat, FrozenLakeEnv.from_grid(SOLVABLE_LAKES[1]), epsilon=1.0, seed=3)
    for turn in trajectory.turns:
        assert " I try " in turn.reasoning
        assert len(turn.actions) == 1
    falls = [t for t in trajectory.turns if t.reasoning.endswith(", a hole.")]
    assert not falls or trajectory.turns[-1] is falls[0]


def test_same_seed_same_episode(chat):
    first = play(chat, make_env("frozenlake"), epsilon=0.5, seed=11)
    second = play(chat, make_env("frozenlake"), epsilon=0.5, seed=11)
    assert first.token_ids == second.token_ids


def test_sokoban_reply_by_hand(chat):
    trajectory = play(chat, SokobanEnv.from_grid(["#####", "#PXO#", "#####"]))
    assert trajectory.success
    assert (
        trajectory.turns[0].reasoning
        == "Player at (1, 1). Boxes: (1, 2). Targets: (1, 3). Solved in 1 move; next Right."
    )


def test_countdown_and_mathqa_are_answered(chat):
    countdown = play(chat, CountdownEnv.from_instance([2, 3, 4], 24))
    assert countdown.success and countdown.turns[0].reasoning.startswith("Target 24 from 2, 3, 4.")
    mathqa = play(chat, make_env("mathqa"))
    assert mathqa.success and mathqa.turns[0].reasoning.startswith("The question asks for one number.")


def test_coding_is_solved_and_a_wrong_first_attempt_is_repaired(chat):
    solved = play(chat, make_env("coding"), max_new_tokens=2000)
    assert solved.success and solved.reward == 1.0 and "I write it directly" in solved.turns[0].reasoning
    repaired = play(chat, make_env("coding", max_attempts=2), epsilon=1.0, max_new_tokens=2000)
    assert repaired.success and len(repaired.turns) == 2
    assert "I try returning the input" in repaired.turns[0].reasoning
    assert repaired.turns[1].reasoning.startswith("The last program passed")


def test_action_budget_reads_the_prompt():
    per_turn = 'You can make up to 2 actions per turn, separated by "||".\n'
    assert action_budget(per_turn + "You have 10 actions left.") == 2
    assert action_budget(per_turn + "You have 10 actions left. ... You have 1 actions left.") == 1
    assert action_budget("You have 5 actions left.") == 1


def test_last_state_takes_the_latest_turn():
    prompt = "Turn 1:\nState:\nA\nYou have 2 actions left.\nTurn 2:\nState:\nB\nC\nYou have 1 actions left."
    assert last_state(prompt) == "B\nC"
    with pytest.raises(ValueError, match="State"):
        last_state("no state here")


def test_generate_cuts_at_max_new_tokens(chat):
    env = FrozenLakeEnv.from_grid(LAKE)
    trajectory = play(chat, env, max_new_tokens=5)
    assert trajectory.turns[0].response_end - trajectory.turns[0].prompt_end == 5


def test_bad_epsilon_is_refused():
    with pytest.raises(ValueError, match="epsilon"):
        ExpertEngine(byte_tokenizer(), epsilon=1.5)


# ------------------------------------------------------------------------------------------------- SearchQA
WORLD = [
    ("Zorvex Labs", "Zorvex Labs is a company headquartered in Merrowick. It was founded by Alda Voss in 1987."),
    ("Alda Voss", "Alda Voss works as a chemist. Alda Voss was born in Tarnholt."),
    ("Tarnholt", "Tarnholt is a city in Valdoria. It has a market."),
    ("Merrowick", "Merrowick is a city in Ostria. It has a harbour."),
]


def search_env(tmp_path, question, answer, **options):
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": question, "answer": answer}) + "\n")
    corpus = [json.dumps({"id": str(i), "title": title, "text": text}) for i, (title, text) in enumerate(WORLD)]
    (tmp_path / "c.jsonl").write_text("\n".join(corpus) + "\n")
    return SearchQAEnv(path=str(tmp_path / "q.jsonl"), corpus_path=str(tmp_path / "c.jsonl"), **options)


def test_search_qa_reply_follows_the_chain_by_hand(chat, tmp_path):
    env = search_env(tmp_path, "Which country is the birthplace of the founder of Zorvex Labs?", "Valdoria")
    trajectory = play(chat, env)
    assert trajectory.success and trajectory.reward == 1.0
    assert [turn.reasoning for turn in trajectory.turns] == [
        "I need the founder of Zorvex Labs, then the birthplace, then the country. I search Zorvex Labs.",
        "The founder of Zorvex Labs is Alda Voss. I search Alda Voss.",
        "The birthplace of Alda Voss is Tarnholt. I search Tarnholt.",
        "The country of Tarnholt is Valdoria. The answer is Valdoria.",
    ]
    assert [turn.actions for turn in trajectory.turns] == [
        ["search[Zorvex Labs]"],
        ["search[Alda Voss]"],
        ["search[Tarnholt]"],
        ["answer[Valdoria]"],
    ]


def test_search_qa_reply_guesses_when_the_searches_run_out(chat, tmp_path):
    env = search_env(
        tmp_path, "Which country is the birthplace of the founder of Zorvex Labs?", "Valdoria", max_searches=2
    )
    trajectory = play(chat, env)
    assert not trajectory.success and trajectory.turns[-1].actions == ["answer[Tarnholt]"]
    assert trajectory.turns[-1].reasoning.endswith("No searches left; I guess Tarnholt.")
    assert all(turn.valid for turn in trajectory.turns)


def test_search_qa_noise_searches_the_question(chat, tmp_path):
    question = "In which city is Zorvex Labs headquartered?"
    trajectory = play(chat, search_env(tmp_path, question, "Merrowick"), epsilon=1.0)
    assert trajectory.turns[0].actions == [f"search[{question}]"]
    # the question's results hold the company's passage: the fact is read from there
    assert trajectory.success and len(trajectory.turns) == 2


def test_search_qa_other_questions_get_a_well_formed_reply(chat):
    fixtures = Path(__file__).resolve().parents[2] / "envs" / "fixtures"
    env = SearchQAEnv(path=str(fixtures / "nq_open.jsonl"), corpus_path=str(fixtures / "corpus.jsonl"))
    trajectory = play(chat, env)
    assert [turn.actions for turn in trajectory.turns] == [
        ["search[who wrote the novel moby dick]"],
        ["answer[Moby-Dick]"],
    ]


@pytest.mark.parametrize("epsilon, low, high", [(0.0, 1.0, 1.0), (0.3, 0.6, 0.98)])
def test_search_qa_expert_success_rate_on_the_bundled_set(chat, epsilon, low, high):
    """Without noise the expert answers every bundled question (1 to 3 searches); with noise it wastes searches
    and sometimes runs out, which leaves the imitating policy something to learn."""
    expert = ExpertEngine(chat.tokenizer, epsilon=epsilon, seed=0)
    seeds = list(range(200))
    limits = EpisodeLimits(max_new_tokens=400, max_context_tokens=16384)
    trajectories = rollout(expert, lambda: make_env("search_qa"), seeds, seeds, chat, limits, SamplingParams())
    success = sum(t.success for t in trajectories) / len(trajectories)
    assert low <= success <= high, success
    assert all(turn.valid for t in trajectories for turn in t.turns)
