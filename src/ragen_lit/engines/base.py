"""The rollout-engine contract: token ids in, sampled token ids (with log-probs) out.

Every engine (transformers in `hf.py`, vLLM in `vllm.py`) implements `Engine`. The agent loop only
talks to this protocol, so engines are interchangeable and the training sequence is always built
from the exact ids an engine sampled (token-in/token-out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

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
