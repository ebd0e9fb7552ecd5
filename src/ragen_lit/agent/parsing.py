"""Parsing the assistant's turn `<think>reasoning</think><answer>A || B</answer>`.

The generation prompt already ends with `<think>`, so the text parsed here is the continuation only.
Malformed responses (missing or unordered tags) yield no reasoning and no actions; the rollout loop
then charges the format penalty (ragen2.md §2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ragen_lit.agent.prompts import ACTION_SEPARATOR, ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN

_RESPONSE = re.compile(
    r"^(?P<reasoning>.*?)"
    + re.escape(THINK_CLOSE)
    + r"\s*"
    + re.escape(ANSWER_OPEN)
    + r"(?P<answer>.*?)"
    + re.escape(ANSWER_CLOSE),
    re.DOTALL,
)


@dataclass
class ParsedResponse:
    reasoning: str | None  # text inside <think>…</think>, stripped; None if the format is broken
    answer: str | None  # text inside <answer>…</answer>, stripped
    actions: list[str] = field(default_factory=list)  # raw action strings, at most max_actions
    extra_actions: int = 0  # actions beyond max_actions that were dropped


def parse_response(text: str, max_actions: int) -> ParsedResponse:
    """Split a continuation into reasoning, answer and up to `max_actions` action strings.

    A nested `<think>` inside the reasoning means the model restarted its reasoning: the format is
    broken and nothing is parsed (the reference regex would accept it; we are stricter so the loss
    never rewards a stuttering template)."""
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    match = _RESPONSE.match(text)
    if match is None or THINK_OPEN in match.group("reasoning"):
        return ParsedResponse(reasoning=None, answer=None)
    reasoning = match.group("reasoning").strip()
    answer = match.group("answer").strip()
    parts = [p.strip() for p in answer.split(ACTION_SEPARATOR)] if answer else []
    parts = [p for p in parts if p]
    return ParsedResponse(
        reasoning=reasoning,
        answer=answer,
        actions=parts[:max_actions],
        extra_actions=max(0, len(parts) - max_actions),
    )
