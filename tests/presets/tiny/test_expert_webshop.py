"""The scripted WebShop shopper: instructions read by hand, its success rate through the real rollout
loop (near 1 without noise, clearly lower with it), and the tiny model's env list left as shipped."""

from __future__ import annotations

import random
import re

import pytest

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.parsing import parse_response
from ragen_lit.agent.rollout import EpisodeLimits, rollout
from ragen_lit.engines.base import SamplingParams
from ragen_lit.envs import make_env
from ragen_lit.presets.tiny.build import TINY_ENVS
from ragen_lit.presets.tiny.expert import ExpertEngine
from ragen_lit.presets.tiny.expert_webshop import Wish, read_instruction, webshop_reply
from ragen_lit.presets.tiny.tokenizer import byte_tokenizer

SEEDS = list(range(123, 223))  # the first 100 validation seeds


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(byte_tokenizer())


def success_rate(chat, epsilon, max_actions_per_turn=1, max_turns=9):
    expert = ExpertEngine(chat.tokenizer, epsilon=epsilon, seed=0)
    # byte-level ids: generous token limits, so that only the expert's play decides
    limits = EpisodeLimits(
        max_turns=max_turns,
        max_actions_per_turn=max_actions_per_turn,
        max_actions_per_episode=9,
        max_new_tokens=400,
        max_context_tokens=32768,
    )
    trajectories = rollout(expert, lambda: make_env("webshop"), SEEDS, SEEDS, chat, limits, SamplingParams())
    assert all(turn.valid for t in trajectories for turn in t.turns)
    return sum(t.success for t in trajectories) / len(trajectories), trajectories


@pytest.mark.parametrize(
    "instruction, wish",
    [
        (
            "I need a red cotton shirt, long sleeve, size: m, fit: slim fit, under $40",
            Wish("red cotton shirt", ["long sleeve"], {"size": "m", "fit": "slim fit"}, 40.0),
        ),
        (
            "Find me a pair of black boots, size: 9, width: wide, under $80",
            Wish("black boots", [], {"size": "9", "width": "wide"}, 80.0),
        ),
        ("I am looking for an orange mug", Wish("orange mug")),
    ],
)
def test_read_instruction(instruction, wish):
    assert read_instruction(instruction) == wish


def test_without_noise_the_expert_buys_the_right_product(chat):
    rate, trajectories = success_rate(chat, epsilon=0.0)
    assert rate >= 0.98
    first = trajectories[0]
    assert [turn.actions[0].split("[")[0] for turn in first.turns] == [
        "search",
        "click",
        *["click"] * (len(first.turns) - 3),
        "buy",
    ]


def test_noise_leaves_room_for_rl(chat):
    rate, trajectories = success_rate(chat, epsilon=0.3)
    assert 0.4 <= rate <= 0.85
    # a noisy purchase still earns partial credit: WebShop's reward is graded
    assert any(0.0 < t.reward < 1.0 for t in trajectories)


def test_options_and_buy_in_one_answer_when_turns_allow(chat):
    rate, trajectories = success_rate(chat, epsilon=0.0, max_actions_per_turn=3, max_turns=5)
    assert rate >= 0.98
    assert max(len(turn.actions) for t in trajectories for turn in t.turns) >= 2


def test_reply_goes_back_when_the_product_lacks_something():
    observation = (
        "WebShop\nInstruction: I need a grey cotton shirt, long sleeve, size: m, under $30\nPage: product P7\n"
        "Alder grey cotton shirt\nPrice: $25.00\nAttributes: grey, cotton, short sleeve\nOptions: size [s] [l]\n"
        "Selected: none\nActions: click[option value], click[back to results], click[back to search], buy"
    )
    reasoning, actions = webshop_reply(observation, observation, random.Random(0), epsilon=0.0)
    assert reasoning == "Wanted: grey cotton shirt. It lacks long sleeve, m; back to results."
    assert actions == ["click[back to results]"]


def test_visited_products_are_skipped_on_the_results_page():
    results = (
        'WebShop\nInstruction: I want a red mug, under $20\nPage: results for "red mug" (page 1 of 1, 2 products)\n'
        "1. [P1] Alder red ceramic mug $9.99\n2. [P2] Lumen red glass mug $12.99\nActions: click[result number or "
        "product id], click[back to search]"
    )
    prompt = "State:\nWebShop\nInstruction: I want a red mug, under $20\nPage: product P1\n...\n" + results
    assert webshop_reply(results, prompt, random.Random(0), 0.0) == (
        "Wanted: red mug. Result 2 matches the item at $12.99.",
        ["click[2]"],
    )
    assert webshop_reply(results, results, random.Random(0), 0.0)[1] == ["click[1]"]


def test_the_expert_clicks_numbers_and_never_writes_an_id(chat):
    # a number is one token for the tiny model, an id five to copy off the page (expert_webshop.py)
    _, trajectories = success_rate(chat, epsilon=0.3)
    replies = [
        chat.tokenizer.decode(t.token_ids[turn.prompt_end : turn.response_end])
        for t in trajectories
        for turn in t.turns
    ]
    assert any(re.search(r"click\[\d\]", reply) for reply in replies)
    assert not any(re.search(r"P\d{4}", reply) for reply in replies)


def test_replies_are_well_formed(chat):
    expert = ExpertEngine(chat.tokenizer, epsilon=0.5, seed=1)
    env = make_env("webshop")
    obs, _ = env.reset(seed=5)
    prompt = f"Turn 1:\nState:\n{obs}\nYou have 9 actions left."
    parsed = parse_response(expert.reply(prompt), max_actions=3)
    assert parsed.reasoning and parsed.actions and all(env.parse_action(a) for a in parsed.actions)


def test_the_tiny_model_env_list_is_unchanged():
    assert TINY_ENVS == ("countdown", "frozenlake", "mathqa", "sokoban")
