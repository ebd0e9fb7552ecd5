"""`python -m ragen_lit diagnose`: its options, the model they name, and the run from file to report."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

from ragen_lit.config import MODEL_PRESETS, DiagnosticsConfig, ModelConfig
from ragen_lit.config.typed_fields import check_fields, checked, flag
from ragen_lit.diagnose.report import format_report
from ragen_lit.diagnose.rollouts import read_rollouts, skip_summary
from ragen_lit.diagnose.scoring import diagnose_rollouts
from ragen_lit.errors import ConfigError
from ragen_lit.run.checkpoints import is_run_or_checkpoint
from ragen_lit.run.trained_policy import load_trained_policy

DTYPES = ("float32", "bfloat16")  # the names of `models.DTYPES` that --dtype accepts
_BUDGET = next(f for f in dataclasses.fields(DiagnosticsConfig) if f.name == "max_tokens_per_forward")


@dataclass
class DiagnoseOptions:
    """The options of `python -m ragen_lit diagnose`; each field is the flag `--<name with dashes>`."""

    model: str
    """HF id or model folder, a preset (tiny, smollm2-135m), a run folder (its last.ckpt) or a checkpoint"""
    rollouts: str
    """JSONL: one {prompt, reasoning, group} per line"""
    max_tokens: int = checked(0, ge=0)
    """rows whose prompt + reasoning exceed this many tokens are skipped and counted; 0 = the model's context"""
    max_tokens_per_forward: int = checked(_BUDGET.default, **_BUDGET.metadata)
    """padded tokens per scoring forward (memory bound); 0 = auto, as for diagnostics.max_tokens_per_forward"""
    dtype: str = checked("float32", choices=DTYPES)
    """parameter dtype"""
    max_rows: int | None = checked(None, ge=1)
    """score a seeded random subsample of this many rows (cost: rows x groups pairs)"""
    seed: int = 0
    """seed of the --max-rows subsample"""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda | cuda:1 ..."""


def resolve_model(model: str) -> str:
    """Folder or hub id to load: a preset name (`tiny`, `smollm2-135m`) or the argument itself.

    Raises `ConfigError` for a local path that is missing or is not a model folder."""
    from ragen_lit.presets import resolve_model_path

    if model in MODEL_PRESETS:
        return resolve_model_path(ModelConfig(name=model))
    looks_local = os.path.isabs(model) or model.startswith((".", "~")) or os.path.exists(model)
    path = os.path.expanduser(model)
    if looks_local and not os.path.isdir(path):
        raise ConfigError(
            f"--model {model!r}: no such folder (give an HF id, a model folder, a run folder or checkpoint, or one "
            f"of {MODEL_PRESETS})"
        )
    if looks_local and not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"--model {model!r}: the folder holds no config.json, so it is not an HF model folder")
    return path if looks_local else model


def run_diagnose(options: DiagnoseOptions) -> int:
    """Load the model, score the rollouts file, print the report; returns the exit code (0).

    Raises `ConfigError` for a bad option, file or model (see the module docstring)."""
    check_fields(options, flag)
    rollouts, device = options.rollouts, options.device
    rows, skipped, rows_read = read_rollouts(rollouts)
    if not rows:
        raise ConfigError(f"no usable rows in {rollouts!r} ({skip_summary(skipped, rows_read)})")

    import torch

    from ragen_lit.models import load_policy, load_tokenizer

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"--device {device!r}: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {str(device)!r}: CUDA is not available here (use --device cpu)")
    if is_run_or_checkpoint(options.model):
        trained = load_trained_policy(options.model, options.dtype, flag("model"))
        print(f"policy of {trained.checkpoint} (base model {trained.base})", file=sys.stderr)
        policy, tokenizer = trained.policy.to(device), trained.tokenizer
    else:
        path = resolve_model(options.model)
        tokenizer = _load(load_tokenizer, path)
        policy = _load(load_policy, path, options.dtype).to(device)
    result = diagnose_rollouts(
        policy,
        tokenizer,
        rows,
        skipped,
        rows_read,
        max_tokens=options.max_tokens,
        max_tokens_per_forward=options.max_tokens_per_forward,
        max_rows=options.max_rows,
        seed=options.seed,
    )
    print(format_report(result, options.model, rollouts))
    return 0


def _load(loader, *args):
    # `models` turns a missing folder (OSError) into ConfigError; a folder without the right files
    # makes transformers raise ValueError instead, which is just as much the user's argument
    try:
        return loader(*args)
    except ConfigError:
        raise
    except (OSError, ValueError) as err:
        raise ConfigError(f"--model {args[0]!r}: cannot load it ({str(err).splitlines()[0]})") from None
