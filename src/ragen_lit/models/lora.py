"""Low-rank adapters (LoRA, through peft) on the policy and the critic's backbone: `model.lora.r > 0`.

`apply_lora` wraps a loaded model in peft's `PeftModel`: every targeted layer keeps its frozen base weight W
and gains trainable A [r, in] and B [out, r] (B starts at zero), so the layer computes W x + (alpha / r) B A x.
Only A and B require grad; the frozen base doubles as the KL reference (within peft's `disable_adapter()` the
model computes W x alone: no second copy of the model).
"""

from __future__ import annotations

from torch import nn

from ragen_lit.errors import ConfigError

ALL_LINEAR = "all-linear"  # peft's name for every linear layer except the vocabulary head
LORA_EXTRA_MESSAGE = "needs peft for LoRA: pip install 'ragen_lit[lora]'"


def linear_layer_names(model: nn.Module) -> list[str]:
    """The distinct last name segments of `model`'s linear layers (`q_proj`, `up_proj`, `lm_head`, …): what
    `model.lora.target_modules` may name."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})


def _check_targets(model: nn.Module, target_modules: list[str]) -> None:
    """Every name of `target_modules` must end some module name of `model` (peft's matching rule)."""
    if target_modules == [ALL_LINEAR]:
        return
    names = [name for name, _ in model.named_modules()]
    unknown = [t for t in target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if unknown:
        raise ConfigError(
            f"model.lora.target_modules={target_modules!r}: {type(model).__name__} has no module named "
            f"{', '.join(unknown)}; its linear layers are: {', '.join(linear_layer_names(model))} (or [all-linear])"
        )


def apply_lora(
    model: nn.Module, *, r: int, alpha: float, dropout: float, target_modules: list[str], causal_lm: bool
) -> nn.Module:
    """`model` wrapped in a peft `PeftModel` with one adapter ("default") of rank `r` on `target_modules`
    (`[all-linear]`: every linear layer but the vocabulary head); only the adapters require grad.

    `causal_lm`: the policy (peft's causal-LM wrapper, which passes generation arguments through) or a bare
    backbone (the critic's). Raises `ConfigError` without peft or for a name no module of `model` has."""
    try:
        import peft
    except ModuleNotFoundError as error:
        if error.name != "peft":
            raise
        raise ConfigError(f"model.lora.r={r} {LORA_EXTRA_MESSAGE}") from None
    targets = list(target_modules)
    _check_targets(model, targets)
    config = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else targets,
        task_type="CAUSAL_LM" if causal_lm else None,
    )
    return peft.get_peft_model(model, config)
