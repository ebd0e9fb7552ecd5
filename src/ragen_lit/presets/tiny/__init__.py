"""The embedded default model `model: tiny`: the folder shipped inside the package (`shipped/`, ~1 MB, so
every machine starts from the same weights and no run spends time building), and the builder that made
it (`build.py`, run by `scripts/build_tiny_model.py`; how the shipped folder was made: docs/DEFAULT_RECIPE.md
and `shipped/tiny_build.json`)."""

from __future__ import annotations

from pathlib import Path

from ragen_lit.errors import ConfigError

SHIPPED = Path(__file__).resolve().parent / "shipped"


def shipped_folder() -> Path:
    """The shipped model folder (config, weights, tokenizer, chat template, build record)."""
    if not (SHIPPED / "model.safetensors").is_file():
        raise ConfigError(
            f"model.name=tiny: the tiny model's weights are missing from this installation ({SHIPPED}); "
            "reinstall ragen_lit, or build one with `python scripts/build_tiny_model.py --out DIR` and pass "
            "model.path=DIR"
        )
    return SHIPPED
