"""A scripted expert behind the `Engine` protocol: the teacher of the tiny model's SFT warm start.

`ExpertEngine.generate` decodes each prompt, reads the last `State:` block (the current observation)
and answers like a model would: `reasoning</think><answer>A || B</answer>` (the prompt already ends
with `<think>`). Running it through the real `rollout` loop therefore yields trajectories with
exactly the token layout RL later trains on.

The reasoning describes the situation, so it depends on the input (the MI diagnostics need that):
for FrozenLake the player and goal, the holes around the player, the moves that would fall in a
hole, and where the chosen moves lead. The plan follows a shortest safe path (breadth-first search);
with probability `epsilon` per turn it is one uniformly random move instead, said as such
("I try Up: …"), which leaves the imitating policy imperfect and gives RL something to fix.
Sokoban (BFS solver), Countdown (exhaustive solver) and MathQA (gold answer) get short replies in
the same format, so the tiny model follows the format on every env. Coding gets the bundled problem's
reference program, except, with probability `epsilon` on a first attempt, a plausible wrong one (it
returns its first argument) that the next attempt repairs from the feedback. SearchQA is played like an agent
would: it reads the question's chain of relations, searches the entity it needs next, reads the fact off
that entity's passage (any passage the episode has shown so far) and answers once the chain is resolved;
with probability `epsilon` per search it searches the question as asked instead, which can waste a search.
WebShop pages go to the scripted shopper of `tiny/expert_webshop.py`.
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Sequence

import torch

from ragen_lit.agent.prompts import assistant_response
from ragen_lit.engines.base import Generation, SamplingParams
from ragen_lit.envs.base import format_cell, format_cells
from ragen_lit.envs.coding import load_problems
from ragen_lit.envs.countdown import solve as solve_countdown
from ragen_lit.envs.frozenlake import MOVES as LAKE_MOVES
from ragen_lit.envs.frozenlake import step_cell
from ragen_lit.envs.math_qa import load_questions
from ragen_lit.envs.search_qa_synthetic import RELATIONS, parse_question, read_relation
from ragen_lit.envs.sokoban import Room
from ragen_lit.envs.sokoban import solve as solve_sokoban
from ragen_lit.envs.webshop import HEADER as WEBSHOP_HEADER
from ragen_lit.presets.tiny.expert_webshop import webshop_reply

Cell = tuple[int, int]
_STATE = "State:\n"
_STATE_END = "\nYou have "
_ACTIONS_LEFT = re.compile(r"You have (\d+) actions left")
_ACTIONS_PER_TURN = re.compile(r"You can make up to (\d+) actions per turn")
_COUNTDOWN = re.compile(r"^Target: (-?\d+)\nNumbers: \[([\d, ]*)\]$")
_SEARCH_QA = re.compile(r"^Question: (?P<question>.*)\nSearches left: (?P<left>\d+)(?:\n|$)")
_PASSAGE = re.compile(r"^\[\d+\] (?P<title>.*?): (?P<text>.*)$", re.MULTILINE)


def last_state(prompt: str) -> str:
    """The observation of the last user turn: the text between its `State:` line and `You have`."""
    start = prompt.rfind(_STATE)
    if start < 0:
        raise ValueError("the prompt holds no 'State:' block; the expert answers ragen_lit env prompts only")
    start += len(_STATE)
    end = prompt.rfind(_STATE_END)
    return prompt[start:end] if end > start else prompt[start:]


def all_states(prompt: str) -> list[str]:
    """The observations of every user turn so far, in order."""
    states = []
    start = prompt.find(_STATE)
    while start >= 0:
        start += len(_STATE)
        end = prompt.find(_STATE_END, start)
        states.append(prompt[start:end] if end >= 0 else prompt[start:])
        start = prompt.find(_STATE, start)
    return states


def action_budget(prompt: str) -> int:
    """How many actions the next answer may hold: the per-turn limit of the system prompt (1 when it
    states none), capped by the actions left in the episode."""
    per_turn = _ACTIONS_PER_TURN.search(prompt)
    limit = int(per_turn.group(1)) if per_turn else 1
    left = _ACTIONS_LEFT.findall(prompt)
    return max(1, min(limit, int(left[-1]))) if left else limit


# ------------------------------------------------------------------------------------ FrozenLake
def parse_lake(observation: str) -> tuple[list[str], Cell, Cell]:
    """`(tiles, player, goal)` from a FrozenLake observation's grid: tiles are rows of `F` (frozen),
    `H` (hole) and `G` (goal)."""
    rows = observation.split("Grid:\n", 1)[-1].split("\n")
    tiles, player, goal = [], None, None
    for r, row in enumerate(rows):
        line = []
        for c, symbol in enumerate(row):
            if symbol in "PX√":
                player = (r, c)
            if symbol in "G√":
                goal = (r, c)
            line.append("H" if symbol in "OX" else "G" if symbol in "G√" else "F")
        tiles.append("".join(line))
    if player is None or goal is None or any(len(row) != len(tiles) for row in tiles):
        raise ValueError(f"not a FrozenLake observation (square grid with a player and a goal): {observation!r}")
    return tiles, player, goal


def distances_to(tiles: Sequence[str], goal: Cell) -> dict[Cell, int]:
    """Moves from every safe cell to `goal` (breadth-first search backwards; moves are reversible)."""
    size = len(tiles)
    distance = {goal: 0}
    frontier = deque([goal])
    while frontier:
        cell = frontier.popleft()
        for action in LAKE_MOVES:
            nxt = step_cell(cell, action, size)
            if nxt not in distance and tiles[nxt[0]][nxt[1]] != "H":
                distance[nxt] = distance[cell] + 1
                frontier.append(nxt)
    return distance


def best_move(tiles: Sequence[str], player: Cell, goal: Cell, distance: dict[Cell, int]) -> str:
    """A first move of a shortest safe path; among several, the one along the axis with the larger
    remaining gap to the goal (a rule simple enough for a tiny model to imitate)."""
    rows_apart, cols_apart = abs(goal[0] - player[0]), abs(goal[1] - player[1])
    vertical = "Down" if goal[0] >= player[0] else "Up"
    horizontal = "Right" if goal[1] >= player[1] else "Left"
    preference = [vertical, horizontal] if rows_apart >= cols_apart else [horizontal, vertical]
    preference += [a for a in LAKE_MOVES if a not in preference]
    for action in preference:
        nxt = step_cell(player, action, len(tiles))
        if distance.get(nxt, -1) == distance[player] - 1:
            return action
    raise ValueError(f"no safe move from {player} towards {goal}")


def lake_reply(observation: str, max_actions: int, rng: random.Random, epsilon: float) -> tuple[str, list[str]]:
    """Reasoning and actions for one FrozenLake turn (see the module docstring)."""
    tiles, player, goal = parse_lake(observation)
    size = len(tiles)
    near = [
        (r, c)
        for r in range(player[0] - 1, player[0] + 2)
        for c in range(player[1] - 1, player[1] + 2)
        if 0 <= r < size and 0 <= c < size and (r, c) != player and tiles[r][c] == "H"
    ]
    text = f"Player at {format_cell(player)}, goal at {format_cell(goal)}. Holes near: {format_cells(near)}."
    for action in LAKE_MOVES:
        nxt = step_cell(player, action, size)
        if nxt != player and tiles[nxt[0]][nxt[1]] == "H":
            text += f" {action} hits a hole."
    distance = distances_to(tiles, goal)
    if rng.random() < epsilon or player not in distance:
        action = rng.choice(list(LAKE_MOVES))
        nxt = step_cell(player, action, size)
        if nxt == player:
            return text + f" I try {action}: it hits the wall.", [action]
        outcome = ", a hole" if tiles[nxt[0]][nxt[1]] == "H" else ""
        return text + f" I try {action}: it leads to {format_cell(nxt)}{outcome}.", [action]
    actions, cell = [], player
    while len(actions) < max_actions and cell != goal:
        action = best_move(tiles, cell, goal, distance)
        cell = step_cell(cell, action, size)
        text += f" {action} leads to {format_cell(cell)}." if not actions else f" Then {action} to {format_cell(cell)}."
        actions.append(action)
    return text, actions


# ------------------------------------------------------------------------ Sokoban, Countdown, MathQA
def sokoban_reply(observation: str, max_actions: int, rng: random.Random, epsilon: float) -> tuple[str, list[str]]:
    """Reasoning and actions for one Sokoban turn: the next moves of a shortest solution."""
    rows = observation.split("Grid:\n", 1)[-1].split("\n")
    room = Room.from_grid(rows)
    text = (
        f"Player at {format_cell(room.player)}. Boxes: {format_cells(sorted(room.boxes))}. "
        f"Targets: {format_cells(sorted(room.targets))}."
    )
    plan = None if rng.random() < epsilon else solve_sokoban(rows)
    if not plan:
        action = rng.choice(["Up", "Down", "Left", "Right"])
        return text + f" I try {action}.", [action]
    actions = plan[:max_actions]
    moves = f"{len(plan)} move" + ("s" if len(plan) != 1 else "")
    return text + f" Solved in {moves}; next {' then '.join(actions)}.", actions


def countdown_reply(observation: str) -> tuple[str, list[str]] | None:
    """The reply to a Countdown instance, None if `observation` is not one."""
    match = _COUNTDOWN.match(observation)
    if match is None:
        return None
    target, numbers = int(match.group(1)), [int(n) for n in match.group(2).split(",") if n.strip()]
    expression = solve_countdown(numbers, target)
    if expression is None:
        expression = " + ".join(str(n) for n in numbers)
        return f"Target {target} from {', '.join(map(str, numbers))}. No exact solution; I use all numbers once.", [
            expression
        ]
    return f"Target {target} from {', '.join(map(str, numbers))}. {expression} = {target}.", [expression]


# -------------------------------------------------------------------------------------------- SearchQA
def search_qa_reply(prompt: str, rng: random.Random, epsilon: float) -> tuple[str, list[str]] | None:
    """Reasoning and the action for one SearchQA turn (see the module docstring); None if the current
    observation is not a SearchQA one."""
    state = _SEARCH_QA.match(last_state(prompt))
    if state is None:
        return None
    question, searches_left = state.group("question"), int(state.group("left"))
    left = _ACTIONS_LEFT.findall(prompt)
    can_search = searches_left > 0 and (not left or int(left[-1]) > 1)
    passages: dict[str, str] = {}
    for observation in all_states(prompt):
        for match in _PASSAGE.finditer(observation):
            passages.setdefault(match.group("title"), match.group("text"))
    parsed = parse_question(question)
    if parsed is None:  # not a generated question: search it, then answer with the best passage's title
        last = _PASSAGE.search(last_state(prompt))
        if last is None and can_search:
            return "I search the question as asked.", [f"search[{question[:150]}]"]
        title = last.group("title") if last else "unknown"
        return f"The best passage is about {title}.", [f"answer[{title}]"]
    entity, chain = parsed
    nouns = [RELATIONS[relation].noun for relation in chain]
    # the plan until a fact is known, then only the latest fact: short replies that still depend on the input
    text = f"I need the {nouns[0]} of {entity}" + "".join(f", then the {noun}" for noun in nouns[1:]) + "."
    for relation in chain:
        value = read_relation(entity, passages[entity], relation) if entity in passages else None
        if value is None:
            if not can_search:
                return text + f" No searches left; I guess {entity}.", [f"answer[{entity}]"]
            if rng.random() < epsilon:
                return text + " I search the question as asked.", [f"search[{question}]"]
            return text + f" I search {entity}.", [f"search[{entity}]"]
        text = f"The {RELATIONS[relation].noun} of {entity} is {value}."
        entity = value
    return text + f" The answer is {entity}.", [f"answer[{entity}]"]


class ExpertEngine:
    """An `Engine` that plays every ragen_lit env by script (see the module docstring).

    Args:
        tokenizer: decodes the prompts and encodes the replies (any tokenizer with the atomic tags).
        epsilon: probability, per FrozenLake/Sokoban turn, that the plan is one random move (per SearchQA
            search, that the question is searched as asked).
        seed: seeds the random moves; the same calls in the same order give the same replies.
    """

    def __init__(self, tokenizer, epsilon: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        self.tokenizer = tokenizer
        self.epsilon = float(epsilon)
        self.rng = random.Random(seed)
        self._gold_answers: dict[str, str] | None = None
        self._programs: dict[str, tuple[str, str]] | None = None

    def sync(self, model: torch.nn.Module) -> None:
        """The expert has no weights; nothing to sync."""

    def release(self) -> None:
        """The expert holds no memory between rollouts; nothing to free."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One scripted reply per prompt, cut at `params.max_new_tokens`; log-probs are 0 (the reply is
        certain under the expert)."""
        generations = []
        for prompt in prompts:
            text = self.reply(self.tokenizer.decode(list(prompt), skip_special_tokens=False))
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            reason = "stop" if len(ids) <= params.max_new_tokens else "length"
            ids = ids[: params.max_new_tokens]
            generations.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=reason))
        return generations

    def reply(self, prompt: str) -> str:
        """The response text (reasoning through `</answer>`) to a rendered prompt."""
        observation = last_state(prompt)
        max_actions = action_budget(prompt)
        if observation.startswith("Board size:") and "\nGoal: " in observation:
            reasoning, actions = lake_reply(observation, max_actions, self.rng, self.epsilon)
        elif observation.startswith("Board size:") and "\nBoxes: " in observation:
            reasoning, actions = sokoban_reply(observation, max_actions, self.rng, self.epsilon)
        elif observation.startswith(WEBSHOP_HEADER + "\nInstruction: "):
            reasoning, actions = webshop_reply(observation, prompt, self.rng, self.epsilon)
        else:
            reasoning, actions = (
                search_qa_reply(prompt, self.rng, self.epsilon)
                or countdown_reply(observation)
                or self._coding_reply(observation)
                or self._math_reply(observation)
            )
        return assistant_response(reasoning, actions)

    def _coding_reply(self, observation: str) -> tuple[str, list[str]] | None:
        """The reply to a bundled coding problem (None if `observation` is not one)."""
        if self._programs is None:
            self._programs = {p.prompt: (p.fn_name, p.solution) for p in load_problems().problems if p.solution}
        prompt, _, feedback = observation.partition("\n\nYour program passed")
        known = self._programs.get(prompt.strip())
        if known is None:
            return None
        fn_name, solution = known
        if not feedback and self.rng.random() < self.epsilon:
            return f"The task asks for `{fn_name}`. I try returning the input.", [
                f"def {fn_name}(*args):\n    return args[0]"
            ]
        start = f"The last program passed {feedback.split(' tests.')[0].strip()}; " if feedback else ""
        return f"{start}The task asks for `{fn_name}`. I write it directly.", [solution.strip()]

    def _math_reply(self, question: str) -> tuple[str, list[str]]:
        if self._gold_answers is None:
            self._gold_answers = dict(load_questions().pairs)
        answer = self._gold_answers.get(question.strip())
        if answer is None:
            return "I do not know this question; I guess 0.", ["0"]
        return f"The question asks for one number. The answer is {answer}.", [answer]
