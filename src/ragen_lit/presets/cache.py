"""Where presets keep what they build or convert once (the tiny model, the converted SmolLM2 folder)."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "RAGEN_LIT_CACHE"


def default_cache_dir() -> Path:
    """The user cache root: `$RAGEN_LIT_CACHE`, else `$XDG_CACHE_HOME/ragen_lit`, else `~/.cache/ragen_lit`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "ragen_lit"
