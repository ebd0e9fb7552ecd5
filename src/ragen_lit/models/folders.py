"""Writing a model as a transformers folder that appears whole or not at all (`export`, `warm-start`)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from ragen_lit.errors import ConfigError


def empty_target(out: str | Path) -> Path:
    """`out` resolved, refused with a ConfigError when it holds anything (a new or empty folder is fine)."""
    target = Path(out).expanduser().resolve()
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise ConfigError(f"--out {str(out)!r}: already exists and is not an empty folder; give a new or empty folder")
    return target


def write_model_folder(target: Path, model: torch.nn.Module, tokenizer, record_name: str, record: dict) -> None:
    """`model`, `tokenizer` and `record` (as JSON file `record_name`) written to a sibling folder that is then
    renamed to `target`, so an interrupted write leaves no half folder. An uncreatable folder is a ConfigError."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as err:
        raise ConfigError(f"--out {str(target)!r}: cannot create a folder there ({err.strerror or err})") from None
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / record_name).write_text(json.dumps(record, indent=2) + "\n")
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
