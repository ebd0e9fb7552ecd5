"""FSDP lock-step: every rank runs the same number of sharded forwards and backwards.

Under `trainer.strategy=fsdp` every forward/backward of a sharded model is a collective (all-gather of the
parameters, reduce-scatter of the gradients), so all ranks must run the same number of them although
their kept rows differ after filtering (a rank may keep none). `lockstep` pads a rank's micro-batches to
the maximum count over ranks with dummy micro-batches (one row of two pad tokens, the second scored).
Callers run the same forwards on a dummy and backpropagate `zero_loss` of their outputs: every parameter
then joins the reduce-scatter with an exactly zero gradient. Unsharded runs get their own micro-batches
only (no collective, no dummy).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ragen_lit.parallel.collectives import max_over_ranks

# the per-token tensors a prepared micro-batch carries besides ids and masks (a dummy holds zeros)
_PREPARED_KEYS = ("old_logprobs", "ref_logprobs", "advantages", "values", "returns")


def lockstep(
    micro_batches: Iterable[dict[str, torch.Tensor]], *, sharded: bool, pad_token_id: int, device: torch.device
) -> list[tuple[dict[str, torch.Tensor], bool]]:
    """`(micro-batch, is_real)` pairs: this rank's `micro_batches`, then, when `sharded`, as many dummies as
    the busiest rank has more. The count is a collective and comes before any sharded forward."""
    real = list(micro_batches)
    pairs = [(micro, True) for micro in real]
    if sharded:
        missing = max_over_ranks(len(real)) - len(real)
        if missing:
            pairs += [(dummy_micro_batch(pad_token_id, device), False)] * missing
    return pairs


def dummy_micro_batch(pad_token_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One row of two pad tokens, the second scored: the smallest micro-batch every forward accepts."""
    ids = torch.full((1, 2), pad_token_id, dtype=torch.long, device=device)
    zeros = torch.zeros(1, 2, device=device)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(1, 2, dtype=torch.bool, device=device),
        "loss_mask": torch.tensor([[False, True]], device=device),
        **{k: zeros for k in _PREPARED_KEYS},
    }


def zero_loss(output) -> torch.Tensor:
    """0 × (sum of every tensor in `output`): a loss on a dummy micro-batch whose backward gives every
    parameter used an exactly zero gradient."""
    tensors = [t for t in (output if isinstance(output, tuple) else (output,)) if torch.is_tensor(t)]
    return sum(t.sum() for t in tensors) * 0.0
