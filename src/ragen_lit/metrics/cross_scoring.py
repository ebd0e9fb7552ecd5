"""In-batch cross-scoring: the score matrices that the MI proxies are computed from (ragen2.md §3).

For R reasoning samples z_r and N prompts x_j, with the model teacher-forced on `[x_j | z_r]`:
`L_sum[r, j] = Σ_t log p(z_{r,t} | x_j, z_{r,<t})` and `L_tok[r, j] = L_sum[r, j] / |z_r|`.
All R·N pairs are packed, longest first, into forwards of at most `max_tokens_per_forward` padded
tokens, and log-probs come from `ragen_lit.logprobs.token_logprobs` restricted to the reasoning
positions, so the vocabulary head runs on at most `max_tokens_per_chunk` positions at a time.
In a distributed run every rank scores its own reasoning rows against all prompts: gather the
prompts first with `gather_prompts`.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ragen_lit.logprobs import token_logprobs


def cross_score(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    reasonings: Sequence[Sequence[int]],
    *,
    max_tokens_per_forward: int = 8192,
    pad_token_id: int = 0,
    max_tokens_per_chunk: int = 1024,
) -> tuple[Tensor, Tensor]:
    """Score every reasoning under every prompt (teacher forcing, no grad, model in its current mode).

    Args:
        model: HF causal LM (see `token_logprobs`).
        prompts: N token-id lists x_j, each ending where the reasoning starts (after `<think>`).
        reasonings: R non-empty token-id lists z_r (the text inside `<think>…</think>` only).
        max_tokens_per_forward: bound on the padded tokens (pairs × longest pair) of one forward;
            a pair longer than the bound gets a forward of its own.
        pad_token_id: id written into padding (masked out, never scored).
        max_tokens_per_chunk: most positions whose full-vocabulary logits exist at once.

    Returns:
        `(L_tok, L_sum)`, both [R, N] float32 on the model's device.
    """
    if len(prompts) == 0:
        raise ValueError("prompts must hold at least one prompt, got none")
    if max_tokens_per_forward < 1:
        raise ValueError(f"max_tokens_per_forward must be >= 1, got {max_tokens_per_forward}")
    for j, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompts[{j}] is empty; every prompt needs at least one token to condition on")
    for r, reasoning in enumerate(reasonings):
        if len(reasoning) == 0:
            raise ValueError(f"reasonings[{r}] is empty; filter out samples without reasoning before scoring")

    device = next(model.parameters()).device
    num_reasonings, num_prompts = len(reasonings), len(prompts)
    reasoning_lengths = torch.tensor([len(z) for z in reasonings], dtype=torch.float64, device=device)
    pair_lengths = [
        (len(prompts[j]) + len(reasonings[r]), r, j) for r in range(num_reasonings) for j in range(num_prompts)
    ]
    pair_lengths.sort(key=lambda item: -item[0])  # stable: ties keep (r, j) order

    seq_logprob = torch.zeros(num_reasonings, num_prompts, dtype=torch.float64, device=device)
    start = 0
    with torch.no_grad():
        while start < len(pair_lengths):
            longest = pair_lengths[start][0]
            stop = min(len(pair_lengths), start + max(1, max_tokens_per_forward // longest))
            pairs = [(r, j) for _, r, j in pair_lengths[start:stop]]
            input_ids, attention_mask, reasoning_mask = _pair_batch(
                prompts, reasonings, pairs, longest, pad_token_id, device
            )
            logprobs = token_logprobs(
                model, input_ids, attention_mask, score_mask=reasoning_mask, max_tokens_per_chunk=max_tokens_per_chunk
            ).logprobs
            rows = torch.tensor([r for r, _ in pairs], device=device)
            cols = torch.tensor([j for _, j in pairs], device=device)
            seq_logprob[rows, cols] = logprobs.double().sum(-1)
            start = stop
    token_logprob = seq_logprob / reasoning_lengths[:, None]
    return token_logprob.float(), seq_logprob.float()


def _pair_batch(
    prompts: Sequence[Sequence[int]],
    reasonings: Sequence[Sequence[int]],
    pairs: list[tuple[int, int]],
    length: int,
    pad_token_id: int,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded `[x_j | z_r]` rows: input ids [P, length] long, attention and reasoning masks [P, length] bool."""
    input_ids = torch.full((len(pairs), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(pairs), length, dtype=torch.bool)
    reasoning_mask = torch.zeros(len(pairs), length, dtype=torch.bool)
    for row, (r, j) in enumerate(pairs):
        prompt_length, total = len(prompts[j]), len(prompts[j]) + len(reasonings[r])
        input_ids[row, :total] = torch.tensor([*prompts[j], *reasonings[r]], dtype=torch.long)
        attention_mask[row, :total] = True
        reasoning_mask[row, prompt_length:total] = True
    return input_ids.to(device), attention_mask.to(device), reasoning_mask.to(device)


def gather_prompts(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """All ranks' prompts, concatenated in rank order (rank 0's first), on every rank.

    Without an initialised process group the prompts are returned unchanged. A row's true column in
    the gathered list is its local index plus the number of prompts held by lower ranks.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return prompts
    per_rank: list[list[list[int]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, [[int(token) for token in prompt] for prompt in prompts])
    return [prompt for rank_prompts in per_rank for prompt in rank_prompts]
