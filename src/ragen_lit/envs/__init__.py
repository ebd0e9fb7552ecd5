"""Text environments (docs/METHOD.md §6): FrozenLake, Sokoban, Countdown, MathQA, Coding, SearchQA,
WebShop (lite).

`make_env(name, **options)` builds one from a config (`env.name`, `env.options`) with errors that
name the bad config key; importing this package registers every env with gymnasium as
`ragen_lit/<Name>-v0`.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium

from ragen_lit.envs.base import OptionError, TextEnv, has_state_key
from ragen_lit.envs.coding import CodingEnv
from ragen_lit.envs.countdown import CountdownEnv
from ragen_lit.envs.frozenlake import FrozenLakeEnv
from ragen_lit.envs.math_qa import MathQAEnv
from ragen_lit.envs.search_qa import SearchQAEnv
from ragen_lit.envs.sokoban import SokobanEnv
from ragen_lit.envs.webshop import WebShopEnv

ENV_CLASSES: dict[str, type[TextEnv]] = {
    "coding": CodingEnv,
    "countdown": CountdownEnv,
    "frozenlake": FrozenLakeEnv,
    "mathqa": MathQAEnv,
    "search_qa": SearchQAEnv,
    "sokoban": SokobanEnv,
    "webshop": WebShopEnv,
}

GYMNASIUM_IDS: dict[str, str] = {
    "coding": "ragen_lit/Coding-v0",
    "countdown": "ragen_lit/Countdown-v0",
    "frozenlake": "ragen_lit/FrozenLake-v0",
    "mathqa": "ragen_lit/MathQA-v0",
    "search_qa": "ragen_lit/SearchQA-v0",
    "sokoban": "ragen_lit/Sokoban-v0",
    "webshop": "ragen_lit/WebShop-v0",
}


def option_names(env_class: type[TextEnv]) -> list[str]:
    """The constructor keywords of `env_class`, in signature order."""
    parameters = inspect.signature(env_class.__init__).parameters.values()
    return [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def make_env(name: str, **options: Any) -> TextEnv:
    """The env `name` (a key of ENV_CLASSES, case-insensitive) built with `options`."""
    key = str(name).lower()
    if key not in ENV_CLASSES:
        raise ValueError(f"env.name={name!r} is not a known environment; allowed: {', '.join(sorted(ENV_CLASSES))}")
    env_class = ENV_CLASSES[key]
    allowed = option_names(env_class)
    for option in options:
        if option not in allowed:
            raise ValueError(f"env.options.{option} is not an option of {key}; allowed: {', '.join(allowed)}")
    try:
        return env_class(**options)
    except OptionError as error:
        raise ValueError(f"env.options.{error}") from None


def _register() -> None:
    for key, env_id in GYMNASIUM_IDS.items():
        if env_id not in gymnasium.registry:
            env_class = ENV_CLASSES[key]
            gymnasium.register(env_id, entry_point=f"{env_class.__module__}:{env_class.__name__}")


_register()

__all__ = [
    "ENV_CLASSES",
    "CodingEnv",
    "CountdownEnv",
    "FrozenLakeEnv",
    "MathQAEnv",
    "SearchQAEnv",
    "SokobanEnv",
    "TextEnv",
    "WebShopEnv",
    "has_state_key",
    "make_env",
    "option_names",
]
