"""The policy and critic a run trains, built as its config asks: loaded from the resolved model folder in
`model.dtype` with `model.attention`, gradient checkpointing (`model.gradient_checkpointing`), and under
`model.lora.r > 0` LoRA adapters on the policy and on the critic's backbone (its value head stays fully
trainable: a second full backbone to train would cost what LoRA saves); and which of their weights a checkpoint
holds (under LoRA not the frozen base weights, which are `model.path`'s)."""

from __future__ import annotations

import copy
import dataclasses

import torch

from ragen_lit.algos import uses_critic
from ragen_lit.config import ModelConfig, TrainerConfig
from ragen_lit.errors import ConfigError
from ragen_lit.models import apply_lora, load_critic, load_policy
from ragen_lit.models.critic import Critic


def build_models(
    m: ModelConfig, trainer: TrainerConfig, advantage: str, model_path: str
) -> tuple[torch.nn.Module, Critic | None]:
    """(policy, critic) as the `model` section `m` asks; the critic is None for an `algo.advantage` that needs none
    (`algos.uses_critic`)."""
    lora = m.lora
    accelerator = trainer.accelerator  # `model.dtype=auto` depends on it
    policy = load_policy(model_path, m.dtype, m.attention, accelerator)
    if m.gradient_checkpointing:
        # FSDP2 composes with non-reentrant checkpointing only; under LoRA the frozen embeddings' output needs no
        # grad, and a reentrant checkpoint would then give the adapters inside it none either
        if trainer.strategy == "fsdp" or lora.r > 0:
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            policy.gradient_checkpointing_enable()
    critic = (
        load_critic(m.critic_path or model_path, m.dtype, m.attention, accelerator) if uses_critic(advantage) else None
    )
    if lora.r > 0:
        adapters = dataclasses.asdict(lora)
        policy = apply_lora(policy, **adapters, causal_lm=True)
        if critic is not None:
            critic.backbone = apply_lora(critic.backbone, **adapters, causal_lm=False)
    return policy, critic


def frozen_keys(module: torch.nn.Module) -> set[str]:
    """State-dict keys of the parameters no optimizer steps (under LoRA the base weights, tied ones included)."""
    return {name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


def check_trainable_state(found: set[str], expected: set[str], lora_r: int) -> None:
    """A resumed checkpoint's keys (`found`) must be exactly the run's trainable ones (`expected`): loading is not
    strict under LoRA, so a missing or foreign tensor would otherwise pass silently. Raises ConfigError."""
    if found != expected:
        missing, unexpected = sorted(expected - found), sorted(found - expected)
        raise ConfigError(
            f"trainer.resume: the checkpoint does not hold this run's trainable weights (model.lora.r={lora_r}): "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}; resume with the run's own model.lora settings"
        )


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` in eval mode whose parameters take no gradient: the KL reference without LoRA."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
