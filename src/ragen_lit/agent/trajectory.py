"""What one episode leaves behind: the exact token ids fed and sampled, and per-turn bookkeeping."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Turn:
    prompt_end: int  # token_ids[:prompt_end] is this turn's prompt X (ends with the opening <think>)
    response_end: int  # token_ids[prompt_end:response_end] were sampled by the policy
    reasoning: str | None  # text inside <think>…</think> (None when the format was broken)
    actions: list[str]  # canonical actions that were executed
    reward: float  # env rewards of this turn plus the format penalty
    valid: bool  # at least one valid action
    state_key: Hashable | None = None  # the env's `state_key()` when this turn's prompt was shown (GiGPO's anchor)
    # token_ids[prompt_end:reasoning_end] are the reasoning's sampled tokens (None: no token boundary before </think>)
    reasoning_end: int | None = None


@dataclass
class Trajectory:
    group: int  # prompt identity: rollouts of one group share the env seed
    seed: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)  # True exactly on sampled (assistant) tokens
    sample_logprobs: list[float] = field(default_factory=list)  # engine's log-prob per token (0 where not sampled)
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0  # episode return: sum of turn rewards incl. format penalties
    success: bool = False
    num_actions: int = 0
    truncated_context: bool = False

    def append(self, ids, sampled: bool, logprobs=None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([sampled] * len(ids))
        self.sample_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def right_pad(rows: Sequence[Sequence], fill: int | float | bool, dtype: torch.dtype) -> torch.Tensor:
    """Rows of unequal length as one `[B, T]` tensor of `dtype` (T = the longest row), `fill` after
    each row's end."""
    padded = torch.full((len(rows), max(len(row) for row in rows)), fill, dtype=dtype)
    for b, row in enumerate(rows):
        padded[b, : len(row)] = torch.tensor(row, dtype=dtype)
    return padded


def pad_trajectories(
    trajectories: Sequence[Trajectory], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad the trajectories' tokens: `input_ids: [B, T] long` (`pad_token_id` after each end),
    `attention_mask: [B, T] bool` (True on real tokens) and `loss_mask: [B, T] bool` (True on sampled
    tokens), T the longest trajectory. Position t of every row is token t of its trajectory."""
    input_ids = right_pad([t.token_ids for t in trajectories], pad_token_id, torch.long)
    lengths = torch.tensor([len(t.token_ids) for t in trajectories])
    attention_mask = torch.arange(input_ids.shape[1]) < lengths[:, None]
    loss_mask = right_pad([t.loss_mask for t in trajectories], False, torch.bool)
    return input_ids, attention_mask, loss_mask


def rollout_metrics(trajectories: Sequence[Trajectory], prefix: str = "rollout") -> dict[str, float]:
    """The per-episode and per-turn rates `fit` logs for a batch of episodes (`<prefix>/success`, `/format_ok_rate`,
    `/valid_turn_rate`, ...), as means over the episodes or their turns."""
    n = max(len(trajectories), 1)
    turns = [turn for t in trajectories for turn in t.turns]
    sampled = sum(sum(t.loss_mask) for t in trajectories)
    return {
        f"{prefix}/success": sum(t.success for t in trajectories) / n,
        f"{prefix}/reward": sum(t.reward for t in trajectories) / n,
        f"{prefix}/num_turns": len(turns) / n,
        f"{prefix}/num_actions": sum(t.num_actions for t in trajectories) / n,
        f"{prefix}/valid_turn_rate": sum(turn.valid for turn in turns) / max(len(turns), 1),
        f"{prefix}/format_ok_rate": sum(turn.reasoning is not None for turn in turns) / max(len(turns), 1),
        f"{prefix}/response_tokens": sampled / max(len(turns), 1),
        f"{prefix}/sequence_tokens": sum(len(t.token_ids) for t in trajectories) / n,
    }
