"""Trajectories → padded training tensors (right padding; everything aligned on token positions).

Alignment: position t of every [B, T] tensor refers to token t. `loss_mask[b, t]` is True when token
t was sampled by the policy; log-probs, values, rewards and advantages all live on those positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragen_lit.agent.trajectory import Trajectory, pad_trajectories, right_pad
from ragen_lit.logprobs import on_device
from ragen_lit.shapes import round_up


def collate(
    trajectories: Sequence[Trajectory], pad_token_id: int, turn_level_rewards: bool = False
) -> dict[str, torch.Tensor]:
    """Pad `trajectories` into a batch dict.

    Rewards: the episode return sits on the last sampled token (docs/METHOD.md §5); with
    `turn_level_rewards` each turn's reward sits on that turn's last sampled token instead. The same end
    token carries the turn's anchor state for GiGPO (`turn_state_ids: [B, T] long`): equal ids mark equal
    env `state_key`s in this batch, -1 where the env gives none and on every other token."""
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    input_ids, attention_mask, loss_mask = pad_trajectories(trajectories, pad_token_id)
    sample_logprobs = right_pad([t.sample_logprobs for t in trajectories], 0.0, torch.float32)
    token_rewards = torch.zeros(input_ids.shape, dtype=torch.float32)
    turn_end_mask = torch.zeros(input_ids.shape, dtype=torch.bool)
    turn_state_ids = torch.full(input_ids.shape, -1, dtype=torch.long)
    state_ids: dict = {}  # state key -> its id, numbered in order of first appearance
    for b, traj in enumerate(trajectories):
        ends = [turn.response_end - 1 for turn in traj.turns if turn.response_end > turn.prompt_end]
        for end, turn in zip(ends, [t for t in traj.turns if t.response_end > t.prompt_end]):
            turn_end_mask[b, end] = True
            if turn.state_key is not None:
                turn_state_ids[b, end] = state_ids.setdefault(turn.state_key, len(state_ids))
            if turn_level_rewards:
                token_rewards[b, end] += turn.reward
        if not turn_level_rewards and ends:
            token_rewards[b, ends[-1]] += traj.reward
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "sample_logprobs": sample_logprobs,
        "token_rewards": token_rewards,
        "turn_end_mask": turn_end_mask,
        "turn_state_ids": turn_state_ids,
        "scores": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "group_ids": torch.tensor([t.group for t in trajectories], dtype=torch.long),
    }


def select_rows(batch: dict[str, torch.Tensor], rows: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
    """Rows `rows` of every tensor, trimmed to the longest remaining sequence."""
    rows = torch.as_tensor(rows, dtype=torch.long)
    out = {k: v[rows] for k, v in batch.items()}
    if out["attention_mask"].numel():
        length = int(out["attention_mask"].sum(-1).max().item()) if len(rows) else 0
        for k, v in out.items():
            if v.dim() == 2:
                out[k] = v[:, :length]
    return out


def length_order(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Row indices sorted by sequence length, longest first (stable: ties keep their order)."""
    return torch.argsort(batch["attention_mask"].sum(-1), descending=True, stable=True)


# `optim.pad_to_multiple=0` (auto) on a GPU: micro-batch widths rounded up to this, so that they repeat
GPU_PAD_MULTIPLE = 64


def planned_micro_batches(batch: dict[str, torch.Tensor], optim, device: torch.device):
    """`micro_batches` of `batch` as the `optim` section asks, its auto settings resolved for `device`."""
    rows = micro_batch_rows(optim.micro_batch_size, device)
    multiple = pad_multiple(optim.pad_to_multiple, optim.padding_free, device)
    return micro_batches(batch, rows, optim.micro_batch_tokens, optim.padding_free, multiple)


def micro_batch_rows(setting: int, device: torch.device) -> int:
    """Sequences per micro-batch (`optim.micro_batch_size`): the setting itself, or for 0 (auto) 16 on a GPU, where
    larger products keep it busier, and 8 on a CPU."""
    if setting:
        return setting
    return 16 if device.type == "cuda" else 8


def pad_multiple(setting: int, padding_free: bool, device: torch.device) -> int:
    """The multiple micro-batch widths are rounded up to (`optim.pad_to_multiple`): the setting itself, or for 0
    (auto) `GPU_PAD_MULTIPLE` on a GPU, where cuDNN attention plans per width, and 1 (off) on a CPU or with
    padding-free micro-batches."""
    if setting:
        return setting
    return GPU_PAD_MULTIPLE if device.type == "cuda" and not padding_free else 1


# the masks every micro-batch also carries as CPU copies, under "host_<name>" (see `micro_batches`)
HOST_MASKS = ("attention_mask", "loss_mask")


def micro_batches(
    batch: dict[str, torch.Tensor], size: int, max_tokens: int = 0, packed: bool = False, multiple: int = 1
):
    """Micro-batches taken in `length_order`, each cut to its longest row: rows of similar length share a
    micro-batch, so little compute goes to padding. Each holds `size` rows, or with `max_tokens` as many
    as one forward of at most that many tokens runs (`token_budget_bounds`; `packed`: a padding-free
    forward). Losses are normalised by the mini-batch totals, so how rows are grouped does not change the
    update. `multiple`: each micro-batch's width rounded up to a multiple of it (`optim.pad_to_multiple`),
    right-padded with zeros (masked) beyond the batch's own width.

    Every micro-batch also carries CPU copies of its `HOST_MASKS` (`host_attention_mask`, `host_loss_mask`), copied
    from the device once per call: the scoring passes read the padding layout and the scored positions from them
    (`logprobs.token_logprobs`'s `host_masks`), so that no forward makes the host wait for the device, which would
    leave the device idle until the host has queued the next kernels."""
    host = {k: batch[k].cpu() for k in HOST_MASKS if k in batch}  # the one wait for the device
    order = length_order(host)
    lengths = host["attention_mask"].sum(-1)[order].tolist()
    device_order = on_device(order, batch["attention_mask"].device)
    if max_tokens:  # the budget counts the rounded widths: a micro-batch stays within it after rounding
        bounds = token_budget_bounds([round_up(n, multiple) for n in lengths], max_tokens, packed)
    else:
        bounds = [(start, min(start + size, len(order))) for start in range(0, len(order), size)]
    for start, stop in bounds:
        part = {k: v[device_order[start:stop]] for k, v in batch.items()}
        part.update({f"host_{k}": v[order[start:stop]] for k, v in host.items()})
        length = int(lengths[start])  # longest first: the slice's first row is its longest
        width = round_up(length, multiple)
        yield {k: (_to_width(v, width) if v.dim() == 2 else v) for k, v in part.items()}


def _to_width(values: torch.Tensor, width: int) -> torch.Tensor:
    """`values` [B, T] cut or right-padded with zeros to [B, width]."""
    if width <= values.shape[1]:
        return values[:, :width]
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def token_budget_bounds(lengths: Sequence[int], max_tokens: int, packed: bool) -> list[tuple[int, int]]:
    """(start, stop) slices of `lengths` (sorted longest first) whose forward runs at most `max_tokens`
    tokens: the sum of the lengths when `packed` (padding-free), count × the longest otherwise. A row
    longer than the budget makes a slice of its own."""
    bounds, start = [], 0
    while start < len(lengths):
        stop, tokens = start + 1, lengths[start]
        while stop < len(lengths):
            tokens = tokens + lengths[stop] if packed else (stop + 1 - start) * lengths[start]
            if tokens > max_tokens:
                break
            stop += 1
        bounds.append((start, stop))
        start = stop
    return bounds


def merge_micro_batches(parts: Sequence[torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The inverse of `micro_batches(batch, ·)` for one per-token output: every micro-batch's rows padded
    back to the batch's width and put back in the batch's row order.

    parts: [b_i, t_i] per micro-batch, in `micro_batches` order -> [B, T]."""
    width = batch["input_ids"].shape[1]
    rows = torch.cat([_to_width(part, width) for part in parts])
    return torch.empty_like(rows).index_copy_(0, length_order(batch), rows)
