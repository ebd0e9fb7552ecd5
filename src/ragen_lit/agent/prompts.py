"""Chat messages the agent sees: the system instruction and one user message per turn.

Format follows the reference's "full" multi-turn mode (docs/METHOD.md §2): the system message
states the task and the action set; every user message carries the previous turn's reward (from turn
2 on), a warning if the previous turn had no valid action, the current state and the output format.
The assistant answers `<think>…</think><answer>A || B</answer>`; the generation prompt ends with the
opening `<think>` so that X (the prompt) ends exactly where the reasoning Z starts (docs/METHOD.md §2).
"""

from __future__ import annotations

from collections.abc import Sequence

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
ACTION_SEPARATOR = "||"
INVALID_ACTION_WARNING = "No valid action provided previously. Environment state remains the same. Please try again.\n"


def system_prompt(instruction: str, actions: Sequence[str] | None, max_actions_per_turn: int) -> str:
    """The system message: task instruction, then the action set (if the env has a discrete one)."""
    text = "You're a helpful assistant. " + instruction.strip() + "\n"
    if actions:
        text += "Your available actions are: " + ", ".join(actions) + ".\n"
        if max_actions_per_turn > 1:
            text += f'You can make up to {max_actions_per_turn} actions per turn, separated by "{ACTION_SEPARATOR}".\n'
    return text


def user_message(
    turn: int,
    observation: str,
    actions_left: int,
    previous_reward: float | None = None,
    previous_invalid: bool = False,
    max_response_tokens: int | None = None,
) -> str:
    """The user message that opens turn `turn` (1-based)."""
    text = ""
    if previous_reward is not None:
        text += f"Reward: {format_reward(previous_reward)}\n"
    if previous_invalid:
        text += INVALID_ACTION_WARNING
    text += f"Turn {turn}:\nState:\n{observation.rstrip()}\n"
    text += f"You have {actions_left} actions left. Always output: {THINK_OPEN} [your thoughts] {THINK_CLOSE} "
    text += f"{ANSWER_OPEN} [your answer] {ANSWER_CLOSE} with no extra text."
    if max_response_tokens:
        text += f" Max response length: {max_response_tokens} tokens."
    return text + "\n"


def format_reward(reward: float) -> str:
    """Rewards are printed with at most 2 decimals and no trailing zeros (`1`, `-0.1`, `0.9`)."""
    text = f"{reward:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def assistant_response(reasoning: str, actions: Sequence[str]) -> str:
    """The canonical response text (used by scripted experts); the generation prompt already holds
    the opening `<think>`, so the continuation starts with the reasoning itself."""
    return f"{reasoning.strip()}{THINK_CLOSE}{ANSWER_OPEN}{f' {ACTION_SEPARATOR} '.join(actions)}{ANSWER_CLOSE}"
