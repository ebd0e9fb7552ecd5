"""Typed configuration: one dataclass per section, one source of truth for YAML, CLI and code.

`load_config(path, overrides)` merges a YAML file and Hydra-style `a.b=c` overrides onto these
dataclasses and validates every value; any mistake raises `ConfigError` with one line naming the key,
the value and what is allowed. A section that has presets (`algo`, `model`) can be set in one word
(`algo=grpo`, `model=smollm2-135m`): the preset replaces that section, later `algo.x=y` overrides
apply on top. Each field's docstring (the string right under it) becomes its comment in the shipped
YAML files (`render_yaml`); its checks (allowed choices, bounds) sit in its `checked(...)` default.
A room takes the sections it reads, not the whole config: one section, or a `Sections` bundle of a few
(`ModuleSections.of(cfg)`).
Choice lists and the algorithm presets come from `choices`, torch-free, which the rooms that implement them
(`filtering`, `algos`, `engines`, ...) read too: loading a config imports no torch, transformers or Lightning.
"""

from ragen_lit.config.checks import validate
from ragen_lit.config.loading import RENAMED_KEYS, RETIRED_KEYS, load_config
from ragen_lit.config.render import flat_dict, render_yaml, to_dict
from ragen_lit.config.sections import (
    MODEL_PRESETS,
    SECTIONS,
    AlgoConfig,
    Config,
    DiagnosticsConfig,
    EnvConfig,
    FilterConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    Sections,
    TrainerConfig,
    ValidationConfig,
)
from ragen_lit.errors import ConfigError

__all__ = [
    "MODEL_PRESETS",
    "RENAMED_KEYS",
    "RETIRED_KEYS",
    "SECTIONS",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "DiagnosticsConfig",
    "EnvConfig",
    "FilterConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "Sections",
    "TrainerConfig",
    "ValidationConfig",
    "flat_dict",
    "load_config",
    "render_yaml",
    "to_dict",
    "validate",
]
