"""Parsing the assistant's turn `<think>reasoning</think><answer>A || B</answer>`.

The generation prompt already ends with `<think>`, so the text parsed here is the continuation only.
Malformed responses (missing or unordered tags) yield no reasoning and no actions; the rollout loop
then charges the format penalty (docs/METHOD.md §2).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


def reasoning_token_count(decode, response_ids: Sequence[int], text: str) -> int | None:
    """How many of a turn's sampled tokens form its reasoning Z, as the policy sampled them: the tokens before the one
    in which `</think>` begins. `text` is `decode(response_ids)`; `decode` turns ids into text as it did.

    The diagnostics score these tokens themselves (docs/METHOD.md §3): re-encoding the parsed text can give another
    tokenization (the text is stripped, and a policy can sample any split of a string), which the policy may find
    far less likely than what it sampled. None when the response has no `</think>` or `</think>` begins inside a token
    that also carries reasoning text (no token boundary separates the two); the caller then re-encodes the text.
    Found with O(log n) decodes: decoded prefixes only grow with the number of tokens."""
    cut = text.find(THINK_CLOSE)
    if cut < 0:
        return None
    low, high = 0, len(response_ids)  # the largest count whose decoded prefix is at most `cut` characters long
    while low < high:
        middle = (low + high + 1) // 2
        if len(decode(response_ids[:middle])) <= cut:
            low = middle
        else:
            high = middle - 1
    return low if decode(response_ids[:low]) == text[:cut] else None
