"""The actor's and the critic's AdamW optimisers and learning-rate schedules, from the `optim` config.

Under LoRA only the adapters (and the critic's value head) require gradients, so only they are optimised. Both
schedules follow `algos.schedule.lr_factor` over the run's planned optimizer steps (iterations × PPO epochs ×
mini-batches). A model whose low-precision weights the configured step cannot move gets one warning
(`models.precision.stalled_update_warning`): e.g. bfloat16 weights at the paper's 1e-6, where training would
silently change nothing.
"""

from __future__ import annotations

import functools
import logging

import torch

from ragen_lit.algos import lr_factor
from ragen_lit.config import OptimConfig
from ragen_lit.models.precision import stalled_update_warning

log = logging.getLogger(__name__)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def adamw_kernel(choice: str, params: list[torch.nn.Parameter]) -> dict[str, bool]:
    """`torch.optim.AdamW`'s keywords for `optim.adamw_kernel`. auto: fused when the weights are plain tensors on a GPU
    (the foreach step took 2.2-2.6% of the update's device time in the multi-turn bench's profiles, the fused one
    1.3%), else PyTorch's own choice: the per-tensor loop on a CPU, and FSDP's sharded weights, where the fused
    kernel has not been measured."""
    if choice == "auto":
        plain_gpu = bool(params) and params[0].device.type == "cuda" and type(params[0].data) is torch.Tensor
        return {"fused": True} if plain_gpu else {}
    return {choice: True}


def build_optimizers(
    optim: OptimConfig, planned_steps: int, policy: torch.nn.Module, critic: torch.nn.Module | None
) -> tuple[list[torch.optim.Optimizer], list[torch.optim.lr_scheduler.LambdaLR]]:
    """([actor AdamW, critic AdamW if there is a critic], their LambdaLR schedules), in that order."""
    schedule = functools.partial(
        lr_factor,
        warmup_steps=optim.warmup_steps,
        total_steps=planned_steps,
        decay=optim.lr_decay,
        min_ratio=optim.min_lr_ratio,
    )
    optimizers, schedulers = [], []
    for model, lr in ((policy, optim.actor_lr), (critic, optim.critic_lr)):
        if model is None:
            continue
        params = trainable(model)
        optimizer = torch.optim.AdamW(
            params,
            lr=lr,
            betas=tuple(optim.betas),
            weight_decay=optim.weight_decay,
            **adamw_kernel(optim.adamw_kernel, params),
        )
        optimizers.append(optimizer)
        schedulers.append(torch.optim.lr_scheduler.LambdaLR(optimizer, schedule))
    return optimizers, schedulers


def warn_stalled_updates(optim: OptimConfig, policy: torch.nn.Module, critic: torch.nn.Module | None) -> None:
    """One warning per model whose weights an AdamW step of its learning rate cannot move."""
    for role, model, key, lr in (
        ("policy", policy, "actor_lr", optim.actor_lr),
        ("critic", critic, "critic_lr", optim.critic_lr),
    ):
        if model is None:
            continue
        message = stalled_update_warning(model, lr, role, key)
        if message:
            log.warning(message)
