"""Whether an optimizer step can move low-precision weights at all.

bfloat16 keeps 8 significant bits: around a weight w the representable values are |w| * 2^-8 to 2^-7 apart,
so an update smaller than half that gap rounds back to w. AdamW's first steps have size ~lr per element
(|m_hat / sqrt(v_hat)| ~ 1), so with bfloat16 weights ~0.02 an actor_lr of 1e-6 (the paper's) or 1e-5 leaves
almost every weight where it was: training silently does nothing. Float32 weights with bf16 compute
(`model.dtype=float32 trainer.precision=bf16-mixed`) keep the update."""

from __future__ import annotations

from collections.abc import Iterable

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)
# `stalled_update_warning` speaks when an optimizer step leaves more than this share of the weights unchanged
STALLED_UPDATE_WARNING = 0.5


@torch.no_grad()
def stalled_update_fraction(params: Iterable[torch.Tensor], step: float) -> float:
    """Share of the elements of `params` that an update of +`step` leaves unchanged once stored in their
    own dtype (w + step rounds back to w). Float32/float64 tensors count as never stalled (their 24+ bits
    hold any step a learning rate makes at the weights' scale); 0.0 for no elements."""
    stalled = total = 0
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 shard: this rank's elements
        total += local.numel()
        if local.dtype in LOW_PRECISION:
            stalled += int(((local.float() + step).to(local.dtype) == local).sum())
    return stalled / total if total else 0.0


def stalled_update_warning(model: torch.nn.Module, lr: float, role: str, key: str) -> str | None:
    """The warning for `model` (the `role` in a run, trained at learning rate `lr` set by `optim.<key>`) when an
    AdamW step of that size leaves more than `STALLED_UPDATE_WARNING` of its trainable weights unchanged, naming
    the fix; None otherwise."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    fraction = stalled_update_fraction(trainable, lr)
    if fraction <= STALLED_UPDATE_WARNING:
        return None
    dtype = str(trainable[0].dtype).removeprefix("torch.")
    return (
        f"the {role}'s weights are {dtype}: an AdamW step of optim.{key}={lr:g} leaves {100 * fraction:.0f}% of them "
        "unchanged (it rounds away); train float32 weights with bf16 compute: model.dtype=float32 "
        "trainer.precision=bf16-mixed"
    )
