"""The rollout-engine contract: token ids in, sampled token ids (with log-probs) out.

Every engine (transformers in `hf.py`, vLLM in `vllm.py`) implements `Engine`. The agent loop only
talks to this protocol, so engines are interchangeable and the training sequence is always built
from the exact ids an engine sampled (token-in/token-out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class SamplingParams:
    """How to sample one batch of continuations."""

    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    stop_sequences: Sequence[Sequence[int]] = ()  # stop after any of these id sequences (kept in the output)
    stop_token_ids: Sequence[int] = ()  # e.g. EOS / <|im_end|> (kept in the output)
    seed: int | None = None


def validate_request(prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
    """The checks every engine runs on a `generate` call; returns the prompts as lists.

    Raises ValueError for sampling parameters out of range or an empty prompt (an engine has no
    position to sample from)."""
    if not isinstance(params.max_new_tokens, int) or params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {params.max_new_tokens!r}")
    if not params.temperature >= 0 or params.temperature == float("inf"):
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {params.temperature!r}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p!r}")
    if not isinstance(params.top_k, int) or params.top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 disables top-k), got {params.top_k!r}")
    if any(len(s) == 0 for s in params.stop_sequences):
        raise ValueError(f"stop_sequences must be non-empty id sequences, got {list(params.stop_sequences)!r}")
    prompts = [list(p) for p in prompts]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt must hold at least one token id; got an empty prompt")
    return prompts


@dataclass
class Generation:
    """One sampled continuation: `token_ids[i]` was sampled with log-prob `logprobs[i]` (under the
    sampling distribution after temperature, before top-p/top-k truncation)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (stop sequence/token) | "length"


@runtime_checkable
class Engine(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (prompts are unpadded token-id lists)."""
        ...

    def sync(self, model: torch.nn.Module) -> None:
        """Make the engine sample from `model`'s current weights."""
        ...

    def release(self) -> None:
        """The rollout is over: free what the engine can until the next `sync` (which always comes before
        the next `generate`)."""
        ...
