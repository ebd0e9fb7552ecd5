"""Where presets keep what they build or convert once (the tiny model, the converted SmolLM2 folder),
and how they replace such a folder without ever leaving a half-deleted one behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CACHE_ENV = "RAGEN_LIT_CACHE"


def default_cache_dir() -> Path:
    """The user cache root: `$RAGEN_LIT_CACHE`, else `$XDG_CACHE_HOME/ragen_lit`, else `~/.cache/ragen_lit`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "ragen_lit"


def discard_folder(folder: Path) -> None:
    """Remove `folder` by first renaming it into a temporary sibling, so its path never holds a
    half-deleted model (a reader sees the old folder whole, or none)."""
    retired = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
    folder.rename(retired / folder.name)
    shutil.rmtree(retired, ignore_errors=True)
