"""The model `evaluate` plays with, from the references `diagnose` and `export` take: a run folder (its newest
checkpoint) or one checkpoint, a model folder, a hub id or a preset name.

A run's policy is the checkpoint's weights on the base model the run started from
(`run.trained_policy.load_trained_policy`; a LoRA run's adapters merged in); anything else loads as `fit` loads its
policy (`models.load_policy`, the config's `model.dtype` and `model.attention`). Either is compiled where `fit`
compiles its policy (`model.compile`). `EvaluatedPolicy` is what `RolloutDataModule.run_rollouts` needs of a module,
so evaluation episodes run through the same engine and rollout loop as `fit`'s validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragen_lit.config import MODEL_PRESETS, ModelConfig
from ragen_lit.errors import ConfigError
from ragen_lit.run.checkpoints import SUFFIX

if TYPE_CHECKING:  # torch and the checkpoints are imported where a model loads: a refusal before that needs neither
    import torch

    from ragen_lit.agent.chat import ChatFormat

MODEL_FLAG = "--model"
KINDS = f"a run folder or checkpoint, a model folder, an HF id or one of {', '.join(MODEL_PRESETS)}"
"""what `--model` takes, for its errors"""


@dataclass
class EvaluatedPolicy:
    """A policy ready for `RolloutDataModule.run_rollouts` (`training.data.RolloutModule` without the training
    hooks, which rollouts do not call)."""

    policy: torch.nn.Module
    chat: ChatFormat
    pad_token_id: int
    model_path: str
    """the weights a vLLM engine starts from (the run's base model); the policy's own are synced into it"""
    device: torch.device
    description: str
    """what was loaded, for the report: the checkpoint and its iteration, or the model folder"""
    iteration: int | None = None
    """iterations the checkpoint had trained (None for a model that is not a run's)"""

    def inference_policy(self) -> torch.nn.Module:
        return self.policy


def run_config_of(model: str) -> Path | None:
    """run.json of the run `model` names (a run folder or one of its checkpoints), None for any other model. A file
    that is not a `*.ckpt`, or a checkpoint outside its run folder, is refused naming the file."""
    path = Path(model).expanduser()
    if not path.exists():  # a preset, an HF id or a missing folder (`model_overrides` says which)
        return None
    if path.is_file() and not path.name.endswith(SUFFIX):
        raise ConfigError(f"{MODEL_FLAG} {model!r}: a file that is not a checkpoint (*{SUFFIX}); give {KINDS}")
    from ragen_lit.run.checkpoints import find_checkpoint, is_run_or_checkpoint

    if not is_run_or_checkpoint(model):
        return None
    checkpoint = find_checkpoint(model, MODEL_FLAG)
    run_json = checkpoint.parent.parent / "run.json"
    if not run_json.is_file():
        raise ConfigError(
            f"{MODEL_FLAG} {model!r}: no run.json in {run_json.parent}; a checkpoint is read inside its run folder "
            "(<run>/checkpoints/*.ckpt), whose run.json holds the run's config and base model"
        )
    return run_json


def model_overrides(model: str) -> list[str]:
    """The `model.*` overrides that make a config's model section name `model` (not a run): a preset by name,
    anything else as `model.name=hf model.path=<model>`."""
    if model in MODEL_PRESETS:
        return [f"model.name={model}", "model.path=null"]
    path = Path(model).expanduser()
    looks_local = path.is_absolute() or model.startswith((".", "~")) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        what = "no such folder" if not path.exists() else "the folder holds no config.json (not an HF model folder)"
        raise ConfigError(f"{MODEL_FLAG} {model!r}: {what}; give {KINDS}")
    return ["model.name=hf", f"model.path={path.resolve() if looks_local else model}"]


def run_model(model: str) -> ModelConfig:
    """The model section of the run `model` names: its checkpoint's weights fit that base model only."""
    from ragen_lit.run.checkpoints import find_checkpoint
    from ragen_lit.run.trained_policy import run_model_config

    return run_model_config(find_checkpoint(model, MODEL_FLAG), MODEL_FLAG)[0]


def load_evaluated_policy(model: str, m: ModelConfig, accelerator: str, device: torch.device) -> EvaluatedPolicy:
    """Load `model` as the model section `m` names it (`model_overrides` / `run_model`), on `device`;
    `accelerator`: the config's `trainer.accelerator` (`model.dtype=auto` and `model.compile=null` depend on it)."""
    from ragen_lit.agent.chat import ChatFormat
    from ragen_lit.config.chat_templates import chat_template_source
    from ragen_lit.models import compile_layers, layer_units, load_policy, load_tokenizer, resolve_compile
    from ragen_lit.presets import resolve_model_path
    from ragen_lit.run.checkpoints import is_run_or_checkpoint
    from ragen_lit.run.trained_policy import load_trained_policy

    if is_run_or_checkpoint(model):
        trained = load_trained_policy(model, None, MODEL_FLAG)
        policy, tokenizer, model_path = trained.policy, trained.tokenizer, trained.base
        policy.config.use_cache = False  # as `load_policy` leaves it: the engines keep their own caches
        iteration = trained.progress.get("iteration")
        description = f"{trained.checkpoint} (base model {trained.base})"
    else:
        model_path = resolve_model_path(m)
        tokenizer = load_tokenizer(model_path, chat_template_source(m.chat_template))
        policy = load_policy(model_path, m.dtype, m.attention, accelerator)
        description, iteration = model_path, None
    try:
        chat = ChatFormat(tokenizer)
    except ValueError as err:
        raise ConfigError(f"{MODEL_FLAG} {model!r}: {err}") from None
    policy = policy.to(device).eval()
    # compiled as `fit` compiles its policy (`AgentRLModule.configure_model`): the same kernels, so on a GPU too the
    # episodes are sampled as the run's validation sampled them
    if resolve_compile(m.compile, accelerator) and (m.compile or layer_units(policy)):
        compile_layers(policy)
    return EvaluatedPolicy(policy, chat, int(tokenizer.pad_token_id), model_path, device, description, iteration)
