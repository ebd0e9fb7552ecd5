"""The trained policy in a run's checkpoint, and `python -m ragen_lit export`, which writes it as a transformers
folder. Which checkpoint a run folder stands for is `run.checkpoints`' rule; how `fit` writes them,
`run.checkpoint_writer`.

A checkpoint is Lightning's: its `state_dict` holds the policy under `policy.`, the critic under `critic.` (not
exported: it is a value head, not a language model) and no frozen reference. A LoRA run's (`model.lora.r > 0`)
holds the adapters and no frozen base weight; its policy here is the base model with the adapters merged in. Under
`trainer.strategy=fsdp` a checkpoint is a distributed-checkpoint folder (`last.ckpt/`: `meta.pt` and one shard file
per rank), read here in one process.

A checkpoint holds weights only; the architecture, tokenizer (with its chat template, or the run's
`model.chat_template` where it set one) and generation settings come from the base model the run started from
(`model.path` or `model.name` in the `run.json` of its run folder), which must still be loadable.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ragen_lit.config import LoraConfig, ModelConfig
from ragen_lit.config.chat_templates import chat_template_source
from ragen_lit.errors import ConfigError
from ragen_lit.models import apply_lora, load_tokenizer
from ragen_lit.models.folders import empty_target, write_model_folder
from ragen_lit.presets import resolve_model_path
from ragen_lit.run.checkpoints import find_checkpoint, is_sharded_checkpoint

POLICY_PREFIX = "policy."
EXPORT_INFO = "ragen_lit_export.json"  # provenance written next to the exported model


def policy_state(checkpoint: Path, what: str) -> tuple[dict, dict]:
    """(policy state dict without the `policy.` prefix, {"epoch", "global_step", "iteration"}) of a Lightning
    checkpoint (`iteration`: the RL iterations it had trained).

    Tensors are memory-mapped from a single file; a sharded folder is gathered into one temporary file first.
    Raises `ConfigError` for a file that is not a ragen_lit checkpoint."""
    if is_sharded_checkpoint(checkpoint):
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            full = Path(tmp) / "full.pt"
            try:
                dcp_to_torch_save(checkpoint, full)
            except Exception as err:  # torch.distributed.checkpoint wraps every reader failure in its own types
                raise ConfigError(
                    f"{what} {str(checkpoint)!r}: cannot read this sharded checkpoint ({_first_line(err)})"
                ) from None
            return _policy_part(_load(full, checkpoint, what), checkpoint, what)
    return _policy_part(_load(checkpoint, checkpoint, what), checkpoint, what)


def _load(file: Path, checkpoint: Path, what: str) -> dict:
    import pickle
    import zipfile

    import torch

    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        raise ConfigError(
            f"{what} {str(checkpoint)!r}: not a checkpoint torch can read ({_first_line(err)}); give a run folder "
            "or one of its checkpoints/*.ckpt"
        ) from None


def _policy_part(content, checkpoint: Path, what: str) -> tuple[dict, dict]:
    state = content.get("state_dict") if isinstance(content, dict) else None
    policy = {k[len(POLICY_PREFIX) :]: v for k, v in (state or {}).items() if k.startswith(POLICY_PREFIX)}
    if not policy:
        raise ConfigError(
            f"{what} {str(checkpoint)!r}: this file holds no policy weights (no 'state_dict' with 'policy.' keys), "
            "so it is not a ragen_lit checkpoint"
        )
    progress = {k: int(content[k]) for k in ("epoch", "global_step") if k in content}
    try:  # Lightning's `epoch` is the last epoch's index or the count, depending on when it saved; this is the count
        progress["iteration"] = int(content["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"])
    except (KeyError, TypeError, ValueError):
        pass
    return policy, progress


def run_model_config(checkpoint: Path, what: str) -> tuple[ModelConfig, str]:
    """The run's `model` section and the folder or hub id it started from, read from the `run.json` of the
    checkpoint's run folder."""
    run_dir = checkpoint.parent.parent
    info_path = run_dir / "run.json"
    try:
        model = json.loads(info_path.read_text())["config"]["model"]
        cfg = ModelConfig(**{**model, "lora": LoraConfig(**model.get("lora", {}))})
    except FileNotFoundError:
        raise ConfigError(
            f"{what} {str(checkpoint)!r}: no run.json in {run_dir}; a checkpoint is read inside its run folder "
            "(<run>/checkpoints/*.ckpt), whose run.json names the base model"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{what}: {info_path} does not name the run's model ({_first_line(err)})") from None
    base = resolve_model_path(cfg)
    if (os.path.isabs(base) or base.startswith((".", "~"))) and not Path(base).expanduser().is_dir():
        raise ConfigError(
            f"{what} {str(checkpoint)!r}: the run's base model {base!r} (model.path in {info_path}) is gone; "
            "its config and tokenizer are needed to rebuild the policy"
        )
    return cfg, base


@dataclass
class TrainedPolicy:
    """The policy of one checkpoint, ready to score or save."""

    policy: object
    """the base model's architecture (its config as the base folder has it) with the checkpoint's weights, in eval
    mode"""
    tokenizer: object
    """the base model's tokenizer (`models.load_tokenizer`: a pad token is set), with the run's `model.chat_template`
    in place of its own where the run set one"""
    checkpoint: Path
    base: str
    """the folder or hub id the run started from"""
    progress: dict
    """{"epoch", "global_step", "iteration"} of the checkpoint, where it records them"""


def load_trained_policy(source: str | os.PathLike, dtype: str | None, what: str) -> TrainedPolicy:
    """The trained policy of a run folder or checkpoint (see `TrainedPolicy`).

    `dtype`: a name of `models.DTYPES`, or None for the checkpoint's own dtype."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ragen_lit.models import DTYPES

    checkpoint = find_checkpoint(source, what)
    state, progress = policy_state(checkpoint, what)
    model_cfg, base = run_model_config(checkpoint, what)
    tokenizer = load_tokenizer(base, chat_template_source(model_cfg.chat_template))  # the run's model.chat_template
    stored = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
    lora = model_cfg.lora
    try:
        if lora.r > 0:  # the checkpoint holds adapters only: the base weights come from where the run started
            policy = AutoModelForCausalLM.from_pretrained(base, dtype=DTYPES[dtype] if dtype else stored)
            policy = apply_lora(policy, **asdict(lora), causal_lm=True)
        else:
            config = AutoConfig.from_pretrained(base)
            policy = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype] if dtype else stored)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{what}: cannot build the run's base model {base!r} ({_first_line(err)})") from None
    _load_weights(policy, state, checkpoint, base, what)
    if lora.r > 0:
        policy = policy.merge_and_unload()  # W + (alpha / r) B A in every adapted layer: a plain transformers model
    return TrainedPolicy(policy.eval(), tokenizer, checkpoint, base, progress)


def _load_weights(policy, state: dict, checkpoint: Path, base: str, what: str) -> None:
    """Copy `state` into `policy`, strictly: a key may be absent only where its parameter is tied to a loaded one,
    or frozen (a LoRA policy's base weights, loaded with it)."""
    try:
        missing, unexpected = policy.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches
        raise ConfigError(
            f"{what} {str(checkpoint)!r}: its weights do not fit the base model {base!r} ({_first_line(err)})"
        ) from None
    own = policy.state_dict()
    loaded = {own[k].data_ptr() for k in state if k in own}
    frozen = {name for name, p in policy.named_parameters(remove_duplicate=False) if not p.requires_grad}
    untied = [k for k in missing if own[k].data_ptr() not in loaded and k not in frozen]
    if untied or unexpected:
        raise ConfigError(
            f"{what} {str(checkpoint)!r}: its weights do not fit the base model {base!r} "
            f"(missing {untied[:3]}, unexpected {unexpected[:3]})"
        )


def export_run(source: str, out: str) -> Path:
    """Write the trained policy of `source` (a run folder or checkpoint) as a transformers folder at `out`:
    config, safetensors weights (in the checkpoint's dtype), tokenizer with its chat template, generation config,
    and `ragen_lit_export.json` (which checkpoint, which base model). The folder is written beside `out` and
    renamed into place, so an interrupted export leaves no half folder. Returns `out`."""
    target = empty_target(out)
    trained = load_trained_policy(source, None, "RUN")
    trained.policy.generation_config = _generation_config(trained.base, trained.policy.config)
    info = {"checkpoint": str(trained.checkpoint), "base_model": trained.base, **trained.progress}
    write_model_folder(target, trained.policy, trained.tokenizer, EXPORT_INFO, info)
    return target


def _generation_config(base: str, config):
    """The base model's generation settings (its generation_config.json), else those implied by its config."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(base)
    except (OSError, ValueError):
        return GenerationConfig.from_model_config(config)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
