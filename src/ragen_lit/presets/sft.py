"""Supervised warm start on trajectories: next-token cross-entropy on the sampled (assistant) tokens,
plus an auxiliary language-modelling loss on the context (prompt and environment) tokens. It trains the
tiny model from scratch (`tiny/build.py`) and warm-starts any causal LM (`training/warm_start.py`).

The batches are the rollout's own `token_ids` and `loss_mask`, so the model learns exactly the token
layout RL later samples and scores. The context tokens are largely predictable: grid rows follow from
the coordinate lines above them, and in later turns the goal, the holes and the grid repeat and the
new player cell is where the previous answer said it would lead. Scoring them too (weight
`context_weight`) teaches a small model trained from scratch to read the board, copy and track
positions much sooner than the assistant tokens alone: on the tiny model, with the same number of
SFT steps, FrozenLake validation success went from ~17% to ~44%. RL never trains on these tokens.
A pretrained LM reads the board already and trains on the sampled tokens alone (`context_weight = 0`).
Sequences are grouped by length before batching so that padding stays small.

The batches go to the model's device. The parameters stay in the model's dtype: train in float32 (AdamW's
small updates round away in bfloat16 parameters) and, on a GPU, compute in bfloat16 with `autocast_dtype`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ragen_lit.agent.trajectory import Trajectory, pad_trajectories


@dataclass
class SFTBatch:
    """Right-padded trajectories: `input_ids: [B, L] long`, `attention_mask: [B, L] bool` (real
    tokens) and `sampled: [B, L] bool` (the policy's tokens, the trajectories' `loss_mask`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    sampled: torch.Tensor


def sft_batch(
    trajectories: Sequence[Trajectory], pad_token_id: int, device: torch.device | str | None = None
) -> SFTBatch:
    """Stack `trajectories` into one right-padded `SFTBatch` on `device` (default: the CPU)."""
    return SFTBatch(*(tensor.to(device) for tensor in pad_trajectories(trajectories, pad_token_id)))


def sft_loss(model: torch.nn.Module, batch: SFTBatch, context_weight: float = 0.0) -> torch.Tensor:
    """Weighted mean next-token cross-entropy: weight 1 on sampled tokens, `context_weight` on the
    other real tokens. The output head runs only on the scored positions (with `context_weight = 0`
    about a quarter of them, which saves a sizeable part of a small model's step)."""
    hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    sampled = batch.sampled[:, 1:]
    scored = batch.attention_mask[:, 1:] if context_weight > 0 else sampled
    logits = model.get_output_embeddings()(hidden[:, :-1][scored])
    nll = torch.nn.functional.cross_entropy(logits.float(), batch.input_ids[:, 1:][scored], reduction="none")
    weights = torch.where(sampled[scored], 1.0, context_weight)
    return (weights * nll).sum() / weights.sum()


def length_grouped_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Indices cut into batches of similar lengths, in random order: shuffle, sort windows of
    `8 * batch_size` by length, cut each window into batches, shuffle the batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = 8 * batch_size
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def supervised_finetune(
    model: torch.nn.Module,
    trajectories: Sequence[Trajectory],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    pad_token_id: int,
    seed: int,
    context_weight: float = 0.0,
    warmup_steps: int = 10,
    autocast_dtype: torch.dtype | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train `model` in place for `steps` AdamW steps (linear warm-up, cosine decay to 10%) over
    `trajectories` (cycled in length-grouped batches) on the device of its parameters, the forward under
    `torch.autocast(autocast_dtype)` when one is given; returns the loss of every step. `on_step(step, loss)`
    is called after each step (step counts from 1)."""
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got steps={steps}, batch_size={batch_size}")
    if not trajectories:
        raise ValueError("supervised_finetune needs at least one trajectory")
    if context_weight < 0:
        raise ValueError(f"context_weight must be >= 0, got {context_weight}")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.98), weight_decay=0.01)

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    lengths = [len(t.token_ids) for t in trajectories]
    batches: list[list[int]] = []
    losses = []
    device = next(model.parameters()).device
    model.train()
    for step in range(steps):
        if not batches:
            batches = length_grouped_batches(lengths, batch_size, rng)
        batch = sft_batch([trajectories[i] for i in batches.pop()], pad_token_id, device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = sft_loss(model, batch, context_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if on_step is not None:
            on_step(step + 1, losses[-1])
    model.eval()
    return losses
